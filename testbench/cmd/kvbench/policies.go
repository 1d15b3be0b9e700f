package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/index/kvsink"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/peersync"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/policy"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/kvbench"
)

// defaultPolicy is kvrouter's default policy, the one `kvbench --sim` measures.
const defaultPolicy = "placement"

// benchPolicies is kvrouter's own registry (policy.Builtin) plus kvbench's reference
// point, the bound's perfect static partition, measured; sweeps report them in this
// order.
func benchPolicies() (*policy.Registry, error) {
	specs := append(policy.Builtin().Specs(), policy.Spec{Name: "partition",
		New: func(*policy.Config, policy.Deps) (scoring.Policy, error) { return kvbench.NewStaticPartition(), nil }})
	return policy.NewRegistry(specs...)
}

// randStreams seeds each policy's random source beside the run's seed, so that a
// policy's choices do not change when other policies are added.
var randStreams = map[string]uint64{
	"random":      0x72616e646f6d,
	"kv":          0x6b76,
	"approximate": 0x617070726f78,
}

// routers builds each policy fresh for one router replica of one run.
type routers struct {
	reg *policy.Registry
	cfg policy.Config
	// sync, when set, gives each replica of a policy that shares state (placement) a
	// peersync.Replica with this expiry and publish interval, which the sim carries
	// between replicas.
	sync     bool
	expiry   time.Duration
	interval time.Duration
}

// sharer is a policy whose load view takes peers' state (placement.Policy).
type sharer interface {
	peersync.Source
	SetPeers(placement.PeerView)
}

// newRouters returns the registry's builders over the default configuration.
func newRouters() (*routers, error) {
	reg, err := benchPolicies()
	if err != nil {
		return nil, err
	}
	return &routers{reg: reg, cfg: policy.DefaultConfig()}, nil
}

// router is a kvbench.PolicyFactory: the named policy and, when it reads the block
// index, a fresh index fed by the run's KV events.
func (r *routers) router(env kvbench.PolicyEnv) (kvbench.Router, error) {
	s, ok := r.reg.Lookup(env.Policy)
	if !ok {
		return kvbench.Router{}, fmt.Errorf("unknown policy %q", env.Policy)
	}
	d := policy.Deps{Rand: rand.NewPCG(env.Seed, randStreams[s.Name]), Now: env.Now, BlockSize: env.BlockSize}
	var rt kvbench.Router
	if s.Index {
		ix, sink, err := newIndex(env)
		if err != nil {
			return kvbench.Router{}, err
		}
		d.Index = ix
		rt.Events = indexSink{ix, sink}
	}
	p, err := r.reg.New(s.Name, &r.cfg, d)
	rt.Policy = p
	if sp, ok := p.(sharer); ok && r.sync && err == nil {
		rep := peersync.NewReplica("replica-"+strconv.Itoa(env.Replica), 1, sp, r.expiry, r.interval, env.Now, nil)
		sp.SetPeers(rep)
		rt.Sync = rep
	}
	return rt, err
}

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

// parsePlacement applies "key=value,..." overrides (the YAML names of placement.Config,
// parsed by each field's type) to the placement policy's configuration.
func parsePlacement(spec string, c *placement.Config) error {
	if strings.TrimSpace(spec) == "" {
		return nil
	}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return fmt.Errorf("--placement: %q is not key=value", kv)
		}
		if err := c.ParseKnob(k, v); err != nil {
			return fmt.Errorf("--placement: %w", err)
		}
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("--placement: %w", err)
	}
	return nil
}
