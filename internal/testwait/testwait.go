package testwait

import (
	"testing"
	"time"
)

// Limit is how long For waits before it fails the test.
const Limit = 30 * time.Second

// For polls cond until it holds, sleeping 1 ms after the first miss and doubling up to
// 20 ms, so that quick conditions are seen at once and slow ones are not polled hard.
// After Limit it fails tb with "timed out waiting for <what>".
func For(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(Limit)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}
