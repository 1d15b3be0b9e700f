//go:build !linux

package demo

import (
	"errors"
	"syscall"
	"time"
)

// sysProcAttr puts each child in its own process group, so a terminal's Ctrl-C reaches
// only kvdemo, which stops the children in order.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// childCPU needs /proc: kvdemo latency's per-process CPU is Linux-only.
func childCPU(int) (time.Duration, error) {
	return 0, errors.New("demo: per-process CPU time needs Linux's /proc")
}
