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

// procUsage is what kvdemo reads of a process's resource use.
type procUsage struct {
	CPU         time.Duration // user + system, every thread
	MinorFaults int64         // page faults served without I/O (a fresh or reclaimed page)
}

// childUsage is a process's CPU time (in steps of 10 ms) and minor page faults from
// /proc/<pid>/stat.
func childUsage(pid int) (procUsage, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procUsage{}, err
	}
	return parseStat(b)
}

// parseStat reads minflt (field 10), utime and stime (fields 14 and 15) from a
// /proc/<pid>/stat line; the command name (field 2) is in parentheses and may hold
// spaces.
func parseStat(b []byte) (procUsage, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procUsage{}, fmt.Errorf("demo: /proc stat: no command name")
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return procUsage{}, fmt.Errorf("demo: /proc stat: %d fields", len(f)+2)
	}
	var n [3]int64
	for j, s := range [][]byte{f[7], f[11], f[12]} {
		v, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return procUsage{}, fmt.Errorf("demo: /proc stat: %w", err)
		}
		n[j] = v
	}
	return procUsage{CPU: time.Duration(n[1]+n[2]) * clockTick, MinorFaults: n[0]}, nil
}
