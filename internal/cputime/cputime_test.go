//go:build unix

package cputime_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/cputime"
)

// TestProcessCountsWork: work adds CPU time. It asserts that the clock moves forward,
// never how fast.
func TestProcessCountsWork(t *testing.T) {
	start := cputime.Process()
	if start <= 0 {
		t.Fatalf("Process() = %v, want > 0", start)
	}
	sum := 0
	for cputime.Process() == start {
		for i := range 1_000_000 {
			sum += i
		}
	}
	if got := cputime.Process(); got < start {
		t.Errorf("CPU time went back: %v then %v (%d)", start, got, sum)
	}
}
