package main

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/index/kvsink"
	"github.com/kvrouter/kvrouter/kvbench"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/scoring"
)

// defaultPolicy is kvrouter's default policy, the one `kvbench --sim` measures.
const defaultPolicy = "placement"

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
	{"placement", func(env kvbench.PolicyEnv) (kvbench.Router, error) {
		ix, sink, err := newIndex(env)
		if err != nil {
			return kvbench.Router{}, err
		}
		p, err := scoring.NewPlacement(placementConfig, ix, env.Now, nil)
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

// placementConfig is the placement policy's configuration (flags may tune it).
var placementConfig = scoring.DefaultPlacementConfig()

// newIndex builds one router replica's index, sized to the servers, and its event sink.
func newIndex(env kvbench.PolicyEnv) (*index.Index, *kvsink.Sink, error) {
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		return nil, nil, err
	}
	for i, ep := range env.Endpoints {
		ix.SetCapacity(ep, env.NumGPUBlocks[i])
	}
	sink, err := kvsink.New(ix, func(string) string { return env.Model }, kvsink.DefaultConfig(), nil)
	if err != nil {
		return nil, nil, err
	}
	return ix, sink, nil
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

// parsePlacement applies "key=value,..." overrides (the YAML field names of
// scoring.PlacementConfig) to the placement policy's configuration.
func parsePlacement(spec string, c *scoring.PlacementConfig) error {
	if strings.TrimSpace(spec) == "" {
		return nil
	}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return fmt.Errorf("--placement: %q is not key=value", kv)
		}
		if _, known := scoring.DefaultPlacementConfig().Knobs()[k]; !known {
			return fmt.Errorf("--placement: unknown key %q", k)
		}
		err := c.ParseKnob(k, v)
		if err != nil {
			return fmt.Errorf("--placement: %s: %w", k, err)
		}
	}
	return c.Validate()
}
