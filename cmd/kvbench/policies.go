package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvrouter/kvrouter/kvbench"
	"github.com/kvrouter/kvrouter/scoring"
)

// defaultPolicy is kvrouter's default policy, the one `kvbench --sim` measures.
const defaultPolicy = "round-robin"

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
	{"approximate", func(env kvbench.PolicyEnv) (kvbench.Router, error) {
		p, err := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(env.Seed, 0x617070726f78), nil)
		return kvbench.Router{Policy: p}, err
	}},
	{"least-load", func(kvbench.PolicyEnv) (kvbench.Router, error) {
		return kvbench.Router{Policy: scoring.NewLeastLoad()}, nil
	}},
}

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
