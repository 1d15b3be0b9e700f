//go:build unix

package envoytest

import (
	"syscall"
	"time"
)

// cpuTime is the process's CPU time (user + system), 0 if getrusage fails.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
