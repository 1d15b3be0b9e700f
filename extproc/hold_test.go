package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// holdingPolicy asks the router to hold each request `holds` times (-1: always) for
// `step`, then picks like recordingPolicy.
type holdingPolicy struct {
	recordingPolicy
	holds int
	step  time.Duration
}

func (p *holdingPolicy) Pick(r *scoring.Request, c []scoring.Endpoint) (scoring.Decision, error) {
	d, err := p.recordingPolicy.Pick(r, c)
	p.mu.Lock()
	n := len(p.picks)
	p.mu.Unlock()
	if p.holds < 0 || n <= p.holds {
		d.Hold = p.step
	}
	return d, err
}

// fakeTimer is a hand-written Options.After: it records every duration asked for and
// fires at once, or never when blocked (then started is signalled instead).
type fakeTimer struct {
	mu      sync.Mutex
	asked   []time.Duration
	block   bool
	started chan struct{}
}

func (f *fakeTimer) after(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, d)
	c := make(chan time.Time, 1)
	if f.block {
		close(f.started)
		return c
	}
	c <- time.Time{}
	return c
}

func (f *fakeTimer) durations() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.asked...)
}

func TestHold(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name      string
		holds     int
		step      time.Duration
		maxHold   time.Duration
		wantHeld  []time.Duration // Request.Held at each Pick
		wantTimer []time.Duration
	}{
		{"held twice then picked again", 2, 5 * ms, 200 * ms, []time.Duration{0, 5 * ms, 10 * ms}, []time.Duration{5 * ms, 5 * ms}},
		{"a hold never passes the bound", -1, 30 * ms, 100 * ms, []time.Duration{0, 30 * ms, 60 * ms, 90 * ms}, []time.Duration{30 * ms, 30 * ms, 30 * ms}},
		{"a hold exactly at the bound is honoured", -1, 50 * ms, 100 * ms, []time.Duration{0, 50 * ms, 100 * ms}, []time.Duration{50 * ms, 50 * ms}},
		{"max hold 0 never holds", -1, 5 * ms, 0, []time.Duration{0}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol := &holdingPolicy{holds: tc.holds, step: tc.step}
			timer := &fakeTimer{}
			h := newHarness(t, func(o *extproc.Options) {
				o.Policy, o.MaxHold, o.After = pol, tc.maxHold, timer.after
			})
			x := h.start(fakeenvoy.FullDuplex())
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, res, epA)
			x.Close()
			h.waitIdle()
			picks, routed, _, _ := pol.snapshot()
			var held []time.Duration
			for _, p := range picks {
				held = append(held, p.Held)
				if p.ID != picks[0].ID {
					t.Fatalf("re-pick changed the request ID: %q then %q", picks[0].ID, p.ID)
				}
			}
			if !equalDurations(held, tc.wantHeld) {
				t.Fatalf("Held at each pick %v, want %v", held, tc.wantHeld)
			}
			if got := timer.durations(); !equalDurations(got, tc.wantTimer) {
				t.Fatalf("timer asked for %v, want %v", got, tc.wantTimer)
			}
			if len(routed) != 1 {
				t.Fatalf("routed %v, want once", routed)
			}
			if b, e := h.fleet.counts(); b != 1 || e != 1 {
				t.Fatalf("begins/ends %d/%d, want 1/1", b, e)
			}
			if got := h.counter("kvrouter_routing_holds_total"); got != float64(len(tc.wantTimer)) {
				t.Fatalf("holds_total %v, want %d", got, len(tc.wantTimer))
			}
			var total time.Duration
			for _, d := range tc.wantTimer {
				total += d
			}
			if total > tc.maxHold {
				t.Fatalf("held %v in all, past the bound %v", total, tc.maxHold)
			}
		})
	}
}

// A stream whose context ends while its request is held ends cleanly: nothing is routed,
// begun or released, and the stream is counted as cancelled.
func TestHoldCancelled(t *testing.T) {
	pol := &holdingPolicy{holds: -1, step: 10 * time.Millisecond}
	timer := &fakeTimer{block: true, started: make(chan struct{})}
	h := newHarness(t, func(o *extproc.Options) {
		o.Policy, o.MaxHold, o.After = pol, time.Second, timer.after
	})
	x := h.start(fakeenvoy.FullDuplex())
	done := make(chan error, 1)
	go func() {
		_, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
		done <- err
	}()
	<-timer.started
	x.Cancel()
	if err := <-done; err == nil {
		t.Fatal("the request got an answer while held and cancelled")
	}
	h.waitIdle()
	_, routed, _, finished := pol.snapshot()
	if len(routed) != 0 || len(finished) != 0 {
		t.Fatalf("routed %v, finished %v: want neither", routed, finished)
	}
	if b, e := h.fleet.counts(); b != 0 || e != 0 {
		t.Fatalf("begins/ends %d/%d, want 0/0", b, e)
	}
	if got := h.counter("kvrouter_extproc_stream_errors_total", "reason", "cancelled"); got != 1 {
		t.Fatalf("cancelled streams %v, want 1", got)
	}
	if h.counter("kvrouter_extproc_streams_in_flight") != 0 {
		t.Fatal("stream gauge not back to 0")
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Under Envoy's default message_timeout (200 ms, armed in every body mode but
// FULL_DUPLEX_STREAMED), requests whose policy asks to hold them for as long as it may
// (as placement does behind a slow miss when its hold_max is above limits.max_hold)
// are answered in time with the default limits: none times out, and they were held.
func TestHoldWithinEnvoyMessageTimeout(t *testing.T) {
	untilNoTimeout(t, holdWithinEnvoyMessageTimeout)
}

// untilNoTimeout runs a timeout scenario up to three times and fails when every run had
// requests time out. The timer is Envoy's, on the wall clock, and a run shares the
// machine with the rest of the suite under -race: one starved run is retried. Code that
// holds past the timer (the old 200 ms default) times out in every run, so it still fails.
func untilNoTimeout(t *testing.T, run func(t *testing.T) (timeouts int, msg string)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		n, msg := run(t)
		if n == 0 {
			return
		}
		if attempt == 3 {
			t.Fatalf("%s (in each of 3 runs)", msg)
		}
		t.Logf("run %d: %s; running again", attempt, msg)
	}
}

// countTimeouts reads n exchange results and counts Envoy message timeouts; any other
// error fails the test.
func countTimeouts(t *testing.T, errs <-chan error, n int) int {
	t.Helper()
	timeouts := 0
	for range n {
		err := <-errs
		var te *fakeenvoy.TimeoutError
		switch {
		case errors.As(err, &te):
			timeouts++
		case err != nil:
			t.Fatal(err)
		}
	}
	return timeouts
}

func holdWithinEnvoyMessageTimeout(t *testing.T) (int, string) {
	const envoyDefault = 200 * time.Millisecond // message_timeout when the gateway sets none
	pol := &holdingPolicy{holds: -1, step: 5 * time.Millisecond}
	h := newHarness(t, func(o *extproc.Options) {
		o.Policy, o.MaxHold = pol, config.DefaultLimitsConfig().MaxHold
	})
	cfg := mode(filterv3.ProcessingMode_BUFFERED, false) // envoy-buffered.yaml's mode
	cfg.MessageTimeout = envoyDefault
	const requests = 8
	errs := make(chan error, requests)
	for range requests {
		go func() {
			x := h.start(cfg)
			defer x.Cancel()
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
			if err == nil && res.Immediate != nil {
				err = fmt.Errorf("immediate response %v", res.Immediate)
			}
			errs <- err
		}()
	}
	timeouts := countTimeouts(t, errs, requests)
	if timeouts != 0 {
		return timeouts, fmt.Sprintf("%d of %d held requests timed out under a %v message_timeout (limits.max_hold default %v)",
			timeouts, requests, envoyDefault, config.DefaultLimitsConfig().MaxHold)
	}
	if h.counter("kvrouter_routing_holds_total") == 0 {
		t.Fatal("no request was held: the test shows nothing")
	}
	if got := h.counter("kvrouter_routing_holds_cut_total", "bound", "max_hold"); got != requests {
		t.Fatalf("holds cut by max_hold %v, want %d (one per request)", got, requests)
	}
	return 0, ""
}

// A deadline the gateway sends with the stream (grpc-timeout) bounds the holds even when
// MaxHold would allow more: the request is answered before the deadline, with the pick
// of the moment.
func TestHoldEndsBeforeStreamDeadline(t *testing.T) {
	pol := &holdingPolicy{holds: -1, step: 5 * time.Millisecond}
	h := newHarness(t, func(o *extproc.Options) { o.Policy, o.MaxHold = pol, 500*time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	x, err := fakeenvoy.Start(ctx, h.conn.Client, fakeenvoy.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	defer x.Cancel()
	res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
	if err != nil {
		t.Fatalf("held past the stream's deadline: %v", err)
	}
	checkDecision(t, res, epA)
	if h.counter("kvrouter_routing_holds_total") == 0 {
		t.Fatal("no hold: the test shows nothing")
	}
	if got := h.counter("kvrouter_routing_holds_cut_total", "bound", "deadline"); got != 1 {
		t.Fatalf("holds cut by the deadline %v, want 1", got)
	}
}
