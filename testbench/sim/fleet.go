package sim

import (
	"container/heap"
	"fmt"

	"github.com/kvrouter/kvrouter/kvevents"
)

// Outcome is what a client of the virtual fleet observes of one request. Times are
// virtual seconds since the fleet started.
type Outcome struct {
	Server     int
	Submitted  float64
	FirstToken float64
	Finished   float64
	Result
}

// TTFT is the time from submission to the first token.
func (o Outcome) TTFT() float64 { return o.FirstToken - o.Submitted }

// FleetOptions configure a Fleet.
type FleetOptions struct {
	// OnEvents, when set, receives every server's KV event batches, EventLag seconds after
	// the step that produced them ended. Batch.TS is the virtual time of that step's end.
	OnEvents func(server int, b kvevents.Batch)
	EventLag float64
}

// Fleet runs several engines on one virtual clock with a discrete-event loop: each busy
// server's next step end and every timer are events; the earliest runs first (ties in
// scheduling order). Nothing happens in real time. A Fleet is not safe for concurrent
// use; callbacks (Submit's done, After's fn, OnEvents) run inside Run and may call Submit
// and After.
type Fleet struct {
	now     float64
	servers []*fleetServer
	q       timerHeap
	seq     uint64
	opts    FleetOptions
}

type fleetServer struct {
	eng     *Engine
	busy    bool
	kicked  bool
	stepEnd func()
}

// NewFleet builds one engine per config.
func NewFleet(cfgs []Config, opts FleetOptions) (*Fleet, error) {
	if len(cfgs) == 0 {
		return nil, fmt.Errorf("sim: fleet needs at least one server")
	}
	f := &Fleet{opts: opts}
	for i, c := range cfgs {
		e, err := New(c)
		if err != nil {
			return nil, fmt.Errorf("sim: server %d: %w", i, err)
		}
		s := &fleetServer{eng: e}
		idx := i
		s.stepEnd = func() { f.endStep(idx) }
		f.servers = append(f.servers, s)
	}
	return f, nil
}

// Now is the virtual time in seconds.
func (f *Fleet) Now() float64 { return f.now }

// Len is the number of servers.
func (f *Fleet) Len() int { return len(f.servers) }

// Engine returns server i's engine, for its Stats.
func (f *Fleet) Engine(i int) *Engine { return f.servers[i].eng }

// After runs fn at Now()+d.
func (f *Fleet) After(d float64, fn func()) {
	f.seq++
	heap.Push(&f.q, timer{at: f.now + max(d, 0), seq: f.seq, fn: fn})
}

// Submit sends a request to server i now; done runs when it finishes.
func (f *Fleet) Submit(server int, id string, prompt []uint32, maxTokens int, done func(Outcome)) error {
	if server < 0 || server >= len(f.servers) {
		return fmt.Errorf("sim: no server %d", server)
	}
	o := &Outcome{Server: server, Submitted: f.now}
	cb := Callbacks{
		FirstToken: func(uint32, int) { o.FirstToken = f.now },
		Finish: func(r Result) {
			o.Finished, o.Result = f.now, r
			if done != nil {
				done(*o)
			}
		},
	}
	if err := f.servers[server].eng.AddRequest(id, prompt, maxTokens, cb); err != nil {
		return err
	}
	s := f.servers[server]
	if !s.busy && !s.kicked {
		// Start the step after every action due at this instant has run.
		s.kicked = true
		f.After(0, func() { s.kicked = false; f.startStep(server) })
	}
	return nil
}

func (f *Fleet) startStep(i int) {
	s := f.servers[i]
	if s.busy {
		return
	}
	d, ok := s.eng.Begin()
	if !ok {
		return
	}
	s.busy = true
	f.After(d, s.stepEnd)
}

func (f *Fleet) endStep(i int) {
	s := f.servers[i]
	s.busy = false
	res := s.eng.Complete()
	if f.opts.OnEvents != nil && len(res.Events) > 0 {
		b := kvevents.Batch{TS: f.now, Events: res.Events, HasDPRank: true}
		if f.opts.EventLag > 0 {
			f.After(f.opts.EventLag, func() { f.opts.OnEvents(i, b) })
		} else {
			f.opts.OnEvents(i, b)
		}
	}
	f.startStep(i)
}

// Run processes events until none is left: every submitted request has finished and
// every timer has fired.
func (f *Fleet) Run() {
	for f.q.Len() > 0 {
		t := heap.Pop(&f.q).(timer)
		f.now = t.at
		t.fn()
	}
}

type timer struct {
	at  float64
	seq uint64
	fn  func()
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
