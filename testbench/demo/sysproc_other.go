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

// procUsage is what kvdemo reads of a process's resource use.
type procUsage struct {
	CPU         time.Duration
	MinorFaults int64
}

// childUsage needs /proc: kvdemo latency's per-process figures are Linux-only.
func childUsage(int) (procUsage, error) {
	return procUsage{}, errors.New("demo: per-process CPU time needs Linux's /proc")
}
