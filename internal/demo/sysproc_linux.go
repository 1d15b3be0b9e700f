package demo

import "syscall"

// sysProcAttr puts each child in its own process group (a terminal's Ctrl-C reaches only
// kvdemo, which stops the children in order) and kills it if kvdemo dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
