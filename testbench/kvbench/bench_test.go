package kvbench

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/index/kvsink"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/scoring"
)

// kvSink adapts kvsink to EventSink, as testbench/cmd/kvbench does.
type kvSink struct{ s *kvsink.Sink }

func (k kvSink) Apply(ep string, b *kvevents.Batch) error {
	k.s.Apply(ep, b.DPRank, b)
	return nil
}

func kvRouter(env PolicyEnv) (Router, error) {
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		return Router{}, err
	}
	for i, ep := range env.Endpoints {
		ix.SetCapacity(ep, env.NumGPUBlocks[i])
	}
	sink, err := kvsink.New(ix, func(string) string { return env.Model }, kvsink.DefaultConfig(), nil)
	if err != nil {
		return Router{}, err
	}
	p, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, nil, rand.NewPCG(env.Seed, 1), nil)
	return Router{Policy: p, Events: kvSink{sink}}, err
}

// BenchmarkRunSimCell is one repetition of the reference's default cell (N=7, C=8, 240
// requests of 2,371 + 100 tokens, 6 servers): the unit of a sweep's cost.
func BenchmarkRunSimCell(b *testing.B) {
	for _, tc := range []struct {
		name    string
		factory PolicyFactory
	}{
		{"round-robin", func(PolicyEnv) (Router, error) { return Router{Policy: scoring.NewRoundRobin()}, nil }},
		{"kv", kvRouter},
	} {
		b.Run(tc.name, func(b *testing.B) {
			w, err := NewWorkload(DefaultWorkloadConfig(), nil)
			if err != nil {
				b.Fatal(err)
			}
			sc := DefaultSimConfig()
			sc.Policies = tc.factory
			b.ReportAllocs()
			for b.Loop() {
				if _, err := RunSim(context.Background(), sc, w, tc.name, 8, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNewWorkload builds the reference workload (7 prefixes, 240 requests).
func BenchmarkNewWorkload(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewWorkload(DefaultWorkloadConfig(), nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRunSimKV runs the real kv policy through the real index: it must beat round-robin
// by a wide margin at N=12, as in the reference.
func TestRunSimKV(t *testing.T) {
	w := simWorkload(t, 12, 120, 0)
	ratio := map[string]float64{}
	for name, f := range map[string]PolicyFactory{
		"kv":          kvRouter,
		"round-robin": func(PolicyEnv) (Router, error) { return Router{Policy: scoring.NewRoundRobin()}, nil },
	} {
		sc := DefaultSimConfig()
		sc.Policies = f
		out, err := RunSim(context.Background(), sc, w, name, 8, 0)
		if err != nil {
			t.Fatal(err)
		}
		ratio[name] = Summarize(out.Results, SummaryInput{PrefixTokens: 2032, BlockSize: 16}).CachedRatio
	}
	if ratio["kv"] < 1.5*ratio["round-robin"] {
		t.Errorf("kv %.3f vs round-robin %.3f", ratio["kv"], ratio["round-robin"])
	}
}
