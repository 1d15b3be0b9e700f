package extproc

import (
	"sync/atomic"
	"time"
)

// workerIdle is how long a worker goroutine waits for its next function before it ends:
// long enough to carry a grown stack across the gaps of steady traffic, short enough that
// the goroutines of a burst do not stay.
const workerIdle = 30 * time.Second

// maxIdleWorkers bounds the workers kept waiting: a burst of streams (up to
// limits.max_streams) leaves at most this many grown stacks behind (16 MiB at 64 KiB
// each), far more than the streams that start within one decision's time at any rate a
// router serves.
const maxIdleWorkers = 256

// workers runs functions on goroutines that outlive them. gRPC serves each ext_proc
// stream on a new goroutine unless one of its stream workers (grpc.NumStreamWorkers) is
// free, and they seldom are: a stream lasts as long as its response. A new goroutine
// starts with a small stack, which parsing, the chat template's render, the tokenizer and
// the index walk grow by copying on every request (runtime.newstack: 15-30 % of the
// router's CPU samples in `kvdemo latency` rounds, 5 % of BenchmarkServerExchangeKV's). A
// worker keeps the stack it grew for its next function. There is no bound beyond the
// callers': a function finding no idle worker starts one, so the workers follow the
// peak number of concurrent calls (open streams, bounded by limits.max_streams); once
// done, at most maxIdle of them wait, each for workerIdle. Use newWorkers; it starts no
// goroutine until used.
type workers struct {
	work    chan func()
	idle    time.Duration
	maxIdle int64
	waiting atomic.Int64 // workers waiting for a function
}

func newWorkers() *workers {
	return &workers{work: make(chan func()), idle: workerIdle, maxIdle: maxIdleWorkers}
}

// goFunc runs f on an idle worker, or on a new one when none is idle, and returns
// without waiting for it.
func (w *workers) goFunc(f func()) {
	select {
	case w.work <- f:
	default:
		go w.loop(f)
	}
}

// run runs f on a worker and returns when it has returned.
func (w *workers) run(f func()) {
	done := make(chan struct{})
	w.goFunc(func() {
		defer close(done)
		f()
	})
	<-done
}

// loop runs f, then each function handed to this worker until none comes for w.idle,
// or until it finds maxIdle workers waiting already.
func (w *workers) loop(f func()) {
	f()
	var t *time.Timer
	for {
		if w.waiting.Add(1) > w.maxIdle {
			w.waiting.Add(-1)
			return
		}
		if t == nil {
			t = time.NewTimer(w.idle)
			defer t.Stop()
		} else {
			t.Reset(w.idle)
		}
		select {
		case f := <-w.work:
			w.waiting.Add(-1)
			f()
		case <-t.C:
			w.waiting.Add(-1)
			return
		}
	}
}
