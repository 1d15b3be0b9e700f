package testwait_test

import (
	"sync/atomic"
	"testing"

	"github.com/kvrouter/kvrouter/internal/testwait"
)

func TestForReturnsOnceCondHolds(t *testing.T) {
	var calls atomic.Int32
	testwait.For(t, "the third call", func() bool { return calls.Add(1) == 3 })
	if n := calls.Load(); n != 3 {
		t.Errorf("cond called %d times, want 3 (For must stop polling once it holds)", n)
	}
}

func TestForDoesNotPollAHoldingCondAgain(t *testing.T) {
	calls := 0
	testwait.For(t, "true", func() bool { calls++; return true })
	if calls != 1 {
		t.Errorf("cond called %d times, want 1", calls)
	}
}
