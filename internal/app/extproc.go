package app

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/scoring"
)

// *fleet.Fleet is the ext_proc server's view of the registry.
var _ extproc.Fleet = (*fleet.Fleet)(nil)

// explainer is implemented by the kv and approximate policies: their scores for a request
// without routing it, for /debug/route.
type explainer interface {
	Explain(req *scoring.Request, candidates []scoring.Endpoint) (scoring.Explanation, error)
}

// forgetter is implemented by policies that keep per-endpoint state.
type forgetter interface {
	Forget(endpoint string)
}

// newPolicy builds the named policy. Names are those config.PolicyNames lists; src feeds
// the random policy and the kv policies' tie-breaks (nil: seeded from the clock).
func (a *App) newPolicy(name string, src rand.Source) (scoring.Policy, error) {
	if src == nil {
		now := uint64(time.Now().UnixNano())
		src = rand.NewPCG(now, now>>1|1)
	}
	switch name {
	case "random":
		return scoring.NewRandom(src), nil
	case "round-robin":
		return scoring.NewRoundRobin(), nil
	case "least-load":
		return scoring.NewLeastLoad(), nil
	case "kv", "approximate":
		kc := a.kvConfig()
		if name == "kv" {
			p, err := scoring.NewKV(kc, a.kv.ix, a.kv.health, src, a.reg)
			if err != nil {
				return nil, fmt.Errorf("app: %w", err)
			}
			return p, nil
		}
		p, err := scoring.NewApproximate(kc, src, a.reg)
		if err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
		return p, nil
	case "placement":
		p, err := scoring.NewPlacement(a.cfg.Policy.PlacementWeights(), a.kv.ix, a.now, a.reg)
		if err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
		return p, nil
	}
	return nil, fmt.Errorf("app: unknown policy %q (known: %v)", name, config.PolicyNames())
}

// kvConfig is the kv policies' configuration: policy.weights over Dynamo's defaults, the
// kv section's bounds, and the block size of the first configured model (an endpoint's
// scraped block size takes precedence).
func (a *App) kvConfig() scoring.KVConfig {
	kc := a.cfg.Policy.KVWeights()
	kc.ApproxBlocks = a.cfg.KV.ApproxBlocks
	kc.MaxTracked = a.cfg.KV.MaxTracked
	names := sortedNames(a.cfg.Models)
	if len(names) > 0 {
		kc.BlockSize = a.cfg.Models[names[0]].BlockSize
	}
	return kc
}

// registerExtProc builds the ext_proc server over the fleet and registers it on g.
func (a *App) registerExtProc(o Options) error {
	policy, err := a.newPolicy(a.cfg.Policy.Name, o.Rand)
	if err != nil {
		return err
	}
	fallback, err := a.newPolicy(a.cfg.Policy.Fallback, o.Rand)
	if err != nil {
		return err
	}
	a.policy, a.fallback = policy, fallback
	if f, ok := policy.(forgetter); ok {
		a.kv.forget = f.Forget
	}
	tok := o.Tokenizer
	if tok == nil && len(a.cfg.Models) > 0 {
		if tok, err = newTokenizer(a.cfg, a.log.Named("prompt"), a.reg, o.Now); err != nil {
			return err
		}
	}
	a.tok = tok
	a.extproc = extproc.New(extproc.Options{
		Policy:       policy,
		Fallback:     fallback,
		Fleet:        a.fleet,
		Tokenizer:    tok,
		MaxBodyBytes: a.cfg.Limits.MaxBodyBytes,
		MaxHold:      a.cfg.Limits.MaxHold,
		MaxFallbacks: a.cfg.Limits.MaxFallbacks,
		Logger:       a.log.Named("extproc"),
		Registerer:   a.reg,
		Now:          o.Now,
	})
	a.extproc.Register(a.extGRPC)
	return nil
}
