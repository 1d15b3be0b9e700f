package chattemplate_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/cputime"
)

// reportCPU runs fn b.N times (via b.Loop) and reports CPU ns per op.
func reportCPU(b *testing.B, fn func()) {
	start := cputime.Process()
	n := 0
	for b.Loop() {
		fn()
		n++
	}
	b.ReportMetric(float64(cputime.Process()-start)/float64(n), "cpu-ns/op")
}
