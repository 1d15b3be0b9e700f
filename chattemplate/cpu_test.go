package chattemplate_test

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime returns the process's user+system CPU time. Benchmarks report it per op as
// cpu-ns/op: on a machine shared with other work, wall-clock ns/op overstates the cost,
// while CPU time (with -cpu 1) is what one core spends.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU runs fn b.N times (via b.Loop) and reports CPU ns per op.
func reportCPU(b *testing.B, fn func()) {
	start := cpuTime(b)
	n := 0
	for b.Loop() {
		fn()
		n++
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(n), "cpu-ns/op")
}
