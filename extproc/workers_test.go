package extproc

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testwait"
)

// goid is the calling goroutine's id, read from its stack trace header.
func goid() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return string(bytes.Fields(buf)[1])
}

// TestWorkersReuseGoroutines checks that sequential calls run on goroutines that outlive
// them (so their stacks stay grown) rather than on a new goroutine each.
func TestWorkersReuseGoroutines(t *testing.T) {
	w := newWorkers()
	caller := goid()
	seen := map[string]bool{}
	const calls = 100
	for range calls {
		var id string
		w.run(func() { id = goid() })
		if id == caller {
			t.Fatal("run ran the function on the caller's goroutine")
		}
		seen[id] = true
	}
	if len(seen) >= calls {
		t.Fatalf("%d calls ran on %d goroutines: no worker was reused", calls, len(seen))
	}
}

// blockAll starts n calls through goFunc that block until released, waits until all n
// run at once (a worker each: none waits for another), and returns the function that
// releases them and waits until they have finished.
func blockAll(w *workers, n int) (releaseAndWait func()) {
	release := make(chan struct{})
	var started, finished sync.WaitGroup
	started.Add(n)
	finished.Add(n)
	for range n {
		w.goFunc(func() {
			started.Done()
			<-release
			finished.Done()
		})
	}
	started.Wait()
	return func() {
		close(release)
		finished.Wait()
	}
}

// TestWorkersConcurrentCalls checks that calls blocked at the same time each get a worker
// (a busy worker never delays another call) and that goFunc does not wait.
func TestWorkersConcurrentCalls(t *testing.T) {
	w := newWorkers()
	const n = 8
	blockAll(w, n)() // all n run at once: a worker each
}

// TestWorkersEndWhenIdle checks that workers end once idle, so a burst leaves no
// goroutines behind.
func TestWorkersEndWhenIdle(t *testing.T) {
	before := runtime.NumGoroutine()
	w := newWorkers()
	w.idle = time.Millisecond
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { w.run(func() { time.Sleep(time.Millisecond) }) })
	}
	wg.Wait()
	testwait.For(t, "idle workers to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestWorkersKeepAtMostMaxIdle checks that a burst leaves at most maxIdle workers
// waiting, however many it started.
func TestWorkersKeepAtMostMaxIdle(t *testing.T) {
	before := runtime.NumGoroutine()
	w := newWorkers()
	w.idle = time.Hour // only the bound ends them
	w.maxIdle = 2
	const n = 16
	blockAll(w, n)()
	testwait.For(t, "workers past the idle bound to end", func() bool { return runtime.NumGoroutine() <= before+2 })
	if got := w.waiting.Load(); got > 2 {
		t.Fatalf("%d workers waiting, want at most 2", got)
	}
}
