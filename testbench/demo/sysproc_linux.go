package demo

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// sysProcAttr puts each child in its own process group (a terminal's Ctrl-C reaches only
// kvdemo, which stops the children in order) and kills it if kvdemo dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every Linux ABI
// Go supports.
const clockTick = 10 * time.Millisecond

// childCPU is a process's CPU time (user + system, every thread) from /proc/<pid>/stat,
// in steps of 10 ms.
func childCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime (fields 14 and 15) from a /proc/<pid>/stat line;
// the command name (field 2) is in parentheses and may hold spaces.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("demo: /proc stat: no command name")
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("demo: /proc stat: %d fields", len(f)+2)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("demo: /proc stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
