package app

import (
	"math"
	"runtime"
	"testing"
)

func TestSoftLimit(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name                        string
		env, live, overhead, budget int64
		want                        int64
	}{
		{"no GOMEMLIMIT", math.MaxInt64, 90 * mib, 10 * mib, 96 * mib, 286 * mib},
		{"under GOMEMLIMIT", 2048 * mib, 90 * mib, 10 * mib, 96 * mib, 286 * mib},
		{"GOMEMLIMIT lower", 200 * mib, 90 * mib, 10 * mib, 96 * mib, 200 * mib},
		{"live heap unknown", 2048 * mib, 0, 10 * mib, 96 * mib, 2048 * mib},
		{"overflow", math.MaxInt64, math.MaxInt64 / 2, 0, 96 * mib, math.MaxInt64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := softLimit(tc.env, tc.live, tc.overhead, tc.budget); got != tc.want {
				t.Fatalf("softLimit = %d MiB, want %d MiB", got/mib, tc.want/mib)
			}
		})
	}
}

// TestMemLimiterUpdate checks that the limiter sets the limit from the runtime's
// figures, and that the real figures are sensible: a live heap, an overhead under the
// total.
func TestMemLimiterUpdate(t *testing.T) {
	const mib = 1 << 20
	var set int64
	m := &memLimiter{budget: 96 * mib, env: math.MaxInt64,
		read: func() (int64, int64) { return 50 * mib, 10 * mib },
		set:  func(l int64) int64 { set = l; return 0 }}
	if got, want := m.update(), int64(2*50+10+96)*mib; got != want || set != want {
		t.Fatalf("update = %d MiB (set %d MiB), want %d MiB", got/mib, set/mib, want/mib)
	}
	// A collection while bodies were held: the least live heap of the window counts.
	m.read = func() (int64, int64) { return 140 * mib, 10 * mib }
	if got, want := m.update(), int64(2*50+10+96)*mib; got != want {
		t.Fatalf("update after a larger live heap = %d MiB, want %d MiB", got/mib, want/mib)
	}
	for range memLimitWindow - 1 {
		m.update()
	}
	if got, want := m.update(), int64(2*140+10+96)*mib; got != want {
		t.Fatalf("update once the window has passed = %d MiB, want %d MiB", got/mib, want/mib)
	}
	// A heap grown by more than the budget (a model loaded) is taken at once, less the
	// budget: the limit stays above it.
	m.read = func() (int64, int64) { return 400 * mib, 10 * mib }
	if got, want := m.update(), int64(2*(400-96)+10+96)*mib; got != want {
		t.Fatalf("update after a jump = %d MiB, want %d MiB", got/mib, want/mib)
	}
	runtime.GC()
	live, overhead := runtimeHeap()
	if live <= 0 || overhead <= 0 || overhead > 1<<30 {
		t.Fatalf("runtimeHeap = live %d, overhead %d bytes", live, overhead)
	}
}
