//go:build !linux

package demo

import "syscall"

// sysProcAttr puts each child in its own process group, so a terminal's Ctrl-C reaches
// only kvdemo, which stops the children in order.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
