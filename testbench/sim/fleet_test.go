package sim_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/testbench/sim"
)

func TestFleetVirtualClock(t *testing.T) {
	c := sim.DefaultConfig()
	c.Timing = sim.Timing{Base: 1}
	fast := c
	fast.Speed = 4
	type delivery struct {
		server int
		at, ts float64
		n      int
	}
	var got []delivery
	var f *sim.Fleet
	f, err := sim.NewFleet([]sim.Config{c, fast}, sim.FleetOptions{
		EventLag: 0.5,
		OnEvents: func(s int, b kvevents.Batch) {
			got = append(got, delivery{s, f.Now(), b.TS, len(b.Events)})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var outs []sim.Outcome
	done := func(o sim.Outcome) { outs = append(outs, o) }
	if err := f.Submit(0, "a", seq(100, 40), 2, done); err != nil {
		t.Fatal(err)
	}
	f.After(0.25, func() {
		if err := f.Submit(1, "b", seq(100, 40), 2, done); err != nil {
			t.Error(err)
		}
	})
	if err := f.Submit(2, "c", seq(1, 4), 1, nil); err == nil {
		t.Error("submit to a missing server succeeded")
	}
	f.Run()
	if len(outs) != 2 {
		t.Fatalf("outcomes = %d", len(outs))
	}
	// b on the 4x server: steps of 0.25 s from t=0.25.
	want := map[string][3]float64{"b": {0.25, 0.5, 0.75}, "a": {0, 1, 2}}
	for _, o := range outs {
		w := want[o.ID]
		if o.Submitted != w[0] || o.FirstToken != w[1] || o.Finished != w[2] || o.TTFT() != w[1]-w[0] {
			t.Errorf("%s: %+v, want submitted/first/finished %v", o.ID, o, w)
		}
	}
	// One batch per server (the prompt's 2 full blocks), delivered 0.5 s after its step.
	if len(got) != 2 {
		t.Fatalf("deliveries = %+v", got)
	}
	for _, d := range got {
		if math.Abs(d.at-d.ts-0.5) > 1e-12 || d.n != 1 {
			t.Errorf("delivery %+v: want lag 0.5 and one event", d)
		}
	}
}

func TestWorkloadDeterministic(t *testing.T) {
	a := sim.NewWorkload(7, 50, sim.RefPrefixTokens, sim.RefTailTokens, 1)
	b := sim.NewWorkload(7, 50, sim.RefPrefixTokens, sim.RefTailTokens, 1)
	for i := range a.Requests {
		if a.Requests[i].Prefix != b.Requests[i].Prefix || len(a.Requests[i].Prompt) != 2371 {
			t.Fatalf("request %d differs or has the wrong length", i)
		}
	}
}

// BenchmarkFleetGridPoint is one grid point of the reference sweep: 600 requests of 2,371
// prompt tokens and 100 output tokens over 6 servers, N=12, concurrency 16, with KV
// events on and delivered to a no-op hook.
func BenchmarkFleetGridPoint(b *testing.B) {
	ref := sim.DefaultReference()
	w := sim.NewWorkload(12, 600, sim.RefPrefixTokens, sim.RefTailTokens, 1)
	for i := range ref.Servers {
		ref.Servers[i].EnableEvents = true
	}
	b.ReportAllocs()
	for b.Loop() {
		f, err := sim.NewFleet(ref.Servers, sim.FleetOptions{OnEvents: func(int, kvevents.Batch) {}})
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		loop := sim.ClosedLoop{Concurrency: 16, MaxTokens: ref.MaxTokens, RTT: ref.RTT,
			Route: func(int, sim.WorkloadRequest) int { return rng.IntN(6) }}
		if _, err := loop.Run(f, w); err != nil {
			b.Fatal(err)
		}
	}
}

// With one server, one prefix and one client, every request after the first hits the
// whole 2,032-token prefix (127 blocks) and nothing else.
func TestClosedLoopSingleServer(t *testing.T) {
	c := sim.DefaultConfig()
	f, err := sim.NewFleet([]sim.Config{c}, sim.FleetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := sim.NewWorkload(1, 10, sim.RefPrefixTokens, sim.RefTailTokens, 3)
	loop := sim.ClosedLoop{Concurrency: 1, MaxTokens: 5, RTT: 0.01, Route: func(int, sim.WorkloadRequest) int { return 0 }}
	outs, err := loop.Run(f, w)
	if err != nil {
		t.Fatal(err)
	}
	s := sim.Summarize(outs)
	if want := 9 * 2032.0 / (10 * 2371); math.Abs(s.CachedRatio-want) > 1e-12 || s.HitRate != 0.9 {
		t.Errorf("ratio %v hit %v, want %v and 0.9", s.CachedRatio, s.HitRate, want)
	}
	for i := 1; i < len(outs); i++ {
		if outs[i].Submitted < outs[i-1].Finished {
			t.Errorf("request %d sent at %v before %d finished at %v", i, outs[i].Submitted, i-1, outs[i-1].Finished)
		}
	}
	if s.TTFTP50 <= 0.01 || s.Throughput <= 0 || s.Preemptions != 0 {
		t.Errorf("summary %+v", s)
	}
}

func TestCellResidual(t *testing.T) {
	tests := []struct {
		name string
		c    sim.Cell
		res  float64
		ok   bool
	}{
		{"absolute inside", sim.Cell{Ref: 0.5, Sim: 0.52, Tol: 0.03}, 0.02, true},
		{"absolute outside", sim.Cell{Ref: 0.5, Sim: 0.46, Tol: 0.03}, -0.04, false},
		{"relative inside", sim.Cell{Ref: 100, Sim: 125, Tol: 0.3, Relative: true}, 0.25, true},
		{"relative outside", sim.Cell{Ref: 100, Sim: 65, Tol: 0.3, Relative: true}, -0.35, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if r := tc.c.Residual(); math.Abs(r-tc.res) > 1e-12 || tc.c.OK() != tc.ok {
				t.Errorf("residual %v ok %v, want %v %v", r, tc.c.OK(), tc.res, tc.ok)
			}
		})
	}
}
