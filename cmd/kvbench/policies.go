package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/index/kvsink"
	"github.com/kvrouter/kvrouter/kvbench"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/scoring"
)

// defaultPolicy is kvrouter's default policy, the one `kvbench --sim` measures.
const defaultPolicy = "kv"

// policies builds each registered policy fresh for one router replica of one run, in the
// order sweeps report them.
var policies = []struct {
	name string
	make func(env kvbench.PolicyEnv) (kvbench.Router, error)
}{
	{"random", func(env kvbench.PolicyEnv) (kvbench.Router, error) {
		return kvbench.Router{Policy: scoring.NewRandom(rand.NewPCG(env.Seed, 0x72616e646f6d))}, nil
	}},
	{"round-robin", func(kvbench.PolicyEnv) (kvbench.Router, error) {
		return kvbench.Router{Policy: scoring.NewRoundRobin()}, nil
	}},
	{"kv", func(env kvbench.PolicyEnv) (kvbench.Router, error) {
		ix, err := index.New(index.DefaultConfig(), nil)
		if err != nil {
			return kvbench.Router{}, err
		}
		for i, ep := range env.Endpoints {
			ix.SetCapacity(ep, env.NumGPUBlocks[i])
		}
		sink, err := kvsink.New(ix, func(string) string { return env.Model }, kvsink.DefaultConfig(), nil)
		if err != nil {
			return kvbench.Router{}, err
		}
		p, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, nil, rand.NewPCG(env.Seed, 0x6b76), nil)
		return kvbench.Router{Policy: p, Events: indexSink{ix, sink}}, err
	}},
	{"approximate", func(env kvbench.PolicyEnv) (kvbench.Router, error) {
		p, err := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(env.Seed, 0x617070726f78), nil)
		return kvbench.Router{Policy: p}, err
	}},
	{"least-load", func(kvbench.PolicyEnv) (kvbench.Router, error) {
		return kvbench.Router{Policy: scoring.NewLeastLoad()}, nil
	}},
	// partition is the bound's perfect static partition, measured: a reference point.
	{"partition", func(kvbench.PolicyEnv) (kvbench.Router, error) {
		return kvbench.Router{Policy: kvbench.NewStaticPartition()}, nil
	}},
}

// indexSink feeds one router replica's index from decoded batches, as the ZeroMQ
// subscriber does in kvrouter.
type indexSink struct {
	ix   *index.Index
	sink *kvsink.Sink
}

func (s indexSink) Apply(endpoint string, b *kvevents.Batch) error {
	rank := 0
	if b.HasDPRank {
		rank = b.DPRank
	}
	s.sink.Apply(endpoint, rank, b)
	return nil
}

// Forget drops a server that left the fleet.
func (s indexSink) Forget(endpoint string) { s.ix.Purge(endpoint) }

func newRouter(env kvbench.PolicyEnv) (kvbench.Router, error) {
	for _, p := range policies {
		if p.name == env.Policy {
			return p.make(env)
		}
	}
	return kvbench.Router{}, fmt.Errorf("unknown policy %q", env.Policy)
}

func registered(name string) bool {
	for _, p := range policies {
		if p.name == name {
			return true
		}
	}
	return false
}

func policyNames() []string {
	out := make([]string, len(policies))
	for i, p := range policies {
		out[i] = p.name
	}
	return out
}
