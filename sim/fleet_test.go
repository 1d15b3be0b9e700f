package sim_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/sim"
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
