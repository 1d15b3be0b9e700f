package scoring_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/scoring"
)

func eps(addrs ...string) []scoring.Endpoint {
	out := make([]scoring.Endpoint, len(addrs))
	for i, a := range addrs {
		out[i] = scoring.Endpoint{Address: a}
	}
	return out
}

func TestPoliciesRejectNoCandidates(t *testing.T) {
	for _, p := range []scoring.Policy{scoring.NewRandom(rand.NewPCG(1, 2)), scoring.NewRoundRobin(), scoring.NewLeastLoad()} {
		t.Run(p.Name(), func(t *testing.T) {
			if _, err := p.Pick(&scoring.Request{}, nil); !errors.Is(err, scoring.ErrNoCandidates) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestRandom(t *testing.T) {
	cands := eps("a:1", "b:1", "c:1")
	pick := func(seed uint64) []string {
		p := scoring.NewRandom(rand.NewPCG(seed, seed))
		var out []string
		for range 30 {
			d, err := p.Pick(&scoring.Request{}, cands)
			if err != nil {
				t.Fatal(err)
			}
			if d.Kind != scoring.KindRandom {
				t.Fatalf("kind %q, want random", d.Kind)
			}
			out = append(out, d.Endpoint)
		}
		return out
	}
	t.Run("same seed same sequence", func(t *testing.T) {
		a, b := pick(7), pick(7)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("sequences differ at %d", i)
			}
		}
	})
	t.Run("covers every candidate", func(t *testing.T) {
		seen := map[string]int{}
		for _, e := range pick(3) {
			seen[e]++
		}
		if len(seen) != 3 {
			t.Fatalf("seen %v", seen)
		}
	})
	t.Run("concurrent use", func(t *testing.T) {
		p := scoring.NewRandom(rand.NewPCG(1, 1))
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 100 {
					if _, err := p.Pick(&scoring.Request{}, cands); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
	})
}

func TestRoundRobin(t *testing.T) {
	p := scoring.NewRoundRobin()
	cands := eps("a:1", "b:1", "c:1")
	want := []string{"a:1", "b:1", "c:1", "a:1", "b:1"}
	for i, w := range want {
		d, err := p.Pick(&scoring.Request{}, cands)
		if err != nil || d.Endpoint != w || d.Kind != scoring.KindTurn {
			t.Fatalf("pick %d = %q (kind %q), %v; want %q (turn)", i, d.Endpoint, d.Kind, err, w)
		}
	}
}

func TestLeastLoad(t *testing.T) {
	valid := func(run, wait int, kv float64) scoring.Metrics {
		return scoring.Metrics{Valid: true, Running: run, Waiting: wait, KVCacheUsage: kv}
	}
	tests := []struct {
		name  string
		cands []scoring.Endpoint
		want  string
	}{
		{"in-flight only", []scoring.Endpoint{{Address: "a", InFlight: 3}, {Address: "b", InFlight: 1}, {Address: "c", InFlight: 2}}, "b"},
		{"metrics add running and waiting", []scoring.Endpoint{
			{Address: "a", InFlight: 1, Metrics: valid(5, 0, 0)},
			{Address: "b", InFlight: 2, Metrics: valid(0, 1, 0)},
		}, "b"},
		{"stale metrics ignored", []scoring.Endpoint{
			{Address: "a", InFlight: 2},
			{Address: "b", InFlight: 1, Metrics: scoring.Metrics{Valid: false, Running: 50}},
		}, "b"},
		{"tie to lower kv usage", []scoring.Endpoint{
			{Address: "a", Metrics: valid(1, 0, 0.9)},
			{Address: "b", Metrics: valid(1, 0, 0.2)},
			{Address: "c", Metrics: valid(1, 0, 0.5)},
		}, "b"},
		{"unknown kv counts as full", []scoring.Endpoint{
			{Address: "a", InFlight: 1},
			{Address: "b", Metrics: valid(1, 0, 0.99)},
		}, "b"},
		{"full tie to first", eps("x", "y", "z"), "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := scoring.NewLeastLoad().Pick(&scoring.Request{}, tc.cands)
			if err != nil || d.Endpoint != tc.want || d.Kind != scoring.KindLoad {
				t.Fatalf("got %q (kind %q), %v; want %q (load)", d.Endpoint, d.Kind, err, tc.want)
			}
		})
	}
}

func BenchmarkLeastLoad512(b *testing.B) {
	cands := make([]scoring.Endpoint, 512)
	for i := range cands {
		cands[i] = scoring.Endpoint{Address: "10.0.0.1:8000", InFlight: i % 7, Metrics: scoring.Metrics{Valid: true, Running: i % 5}}
	}
	p := scoring.NewLeastLoad()
	req := &scoring.Request{}
	b.ReportAllocs()
	for b.Loop() {
		p.Pick(req, cands)
	}
}
