package app

import (
	"fmt"
	"math/rand/v2"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/policy"
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

// newPolicy builds the named policy from the registry (policy.Builtin): its section of
// the policy configuration with the kv section's bounds, the block index, the events'
// health view, the clock and the model's block size. src feeds the random policy and
// the kv policies' tie-breaks (nil: seeded from the clock).
func (a *App) newPolicy(pcfg config.PolicyConfig, name string, src rand.Source, reg prometheus.Registerer) (scoring.Policy, error) {
	pc := pcfg.Config
	pc.KV.ApproxBlocks = a.cfg.KV.ApproxBlocks
	pc.KV.MaxTracked = a.cfg.KV.MaxTracked
	p, err := a.policies.New(name, &pc, policy.Deps{
		Index: a.kv.ix, Health: a.kv.health, Rand: src, Now: a.now, Registerer: reg,
		BlockSize: a.blockSize(),
	})
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	return p, nil
}

// blockSize is the block size of the first configured model (an endpoint's scraped
// block size takes precedence in the policies), or vLLM's default without models.
func (a *App) blockSize() int {
	names := sortedNames(a.cfg.Models)
	if len(names) > 0 {
		return a.cfg.Models[names[0]].BlockSize
	}
	return config.DefaultBlockSize
}

// policies are the routing and fallback policies in force.
type policies struct {
	policy, fallback scoring.Policy
}

// buildPolicies builds the configured policy and fallback, their metrics on reg.
func (a *App) buildPolicies(pc config.PolicyConfig, src rand.Source, reg prometheus.Registerer) (*policies, error) {
	pol, err := a.newPolicy(pc, pc.Name, src, reg)
	if err != nil {
		return nil, err
	}
	fallback, err := a.newPolicy(pc, pc.Fallback, src, reg)
	if err != nil {
		return nil, err
	}
	return &policies{policy: pol, fallback: fallback}, nil
}

// forget tells the policies in force that an endpoint left the fleet.
func (a *App) forget(addr string) {
	p := a.pols.Load()
	for _, pol := range []scoring.Policy{p.policy, p.fallback} {
		if f, ok := pol.(forgetter); ok {
			f.Forget(addr)
		}
	}
}

// registerExtProc builds the ext_proc server over the fleet and registers it on g.
func (a *App) registerExtProc(o Options) error {
	a.rand = o.Rand
	pols, err := a.buildPolicies(a.cfg.Policy, o.Rand, a.policyReg)
	if err != nil {
		return err
	}
	a.pols.Store(pols)
	pol, fallback := pols.policy, pols.fallback
	a.kv.forget = a.forget
	tok := o.Tokenizer
	if tok == nil && len(a.cfg.Models) > 0 {
		if tok, err = newTokenizer(a.cfg, a.log.Named("prompt"), a.reg, o.Now); err != nil {
			return err
		}
	}
	a.tok = tok
	rewrites, err := a.rewrites(a.cfg)
	if err != nil {
		return err
	}
	// Until an endpoint's num_gpu_blocks is scraped, the prompt tokens that can matter
	// are those of the KV capacity the policies assume for it.
	a.extproc = extproc.New(extproc.Options{
		Policy:            pol,
		Fallback:          fallback,
		Fleet:             a.fleet,
		Tokenizer:         tok,
		MaxBodyBytes:      a.cfg.Limits.MaxBodyBytes,
		MaxPromptTokens:   a.cfg.KV.ApproxBlocks * a.blockSize(),
		BodyBudgetBytes:   a.cfg.Limits.BodyBudgetBytes,
		MaxStreams:        a.cfg.Limits.MaxStreams,
		StreamIdleTimeout: a.cfg.Limits.StreamIdleTimeout,
		MaxHold:           a.cfg.Limits.MaxHold,
		MaxFallbacks:      a.cfg.Limits.MaxFallbacks,
		ShedWaiting:       a.cfg.Limits.ShedQueueDepth,
		Objectives:        a.objectives(a.cfg),
		Rewrites:          rewrites,
		RetryAfter:        a.cfg.Limits.RetryAfter,
		Logger:            a.log.Named("extproc"),
		Registerer:        a.reg,
		Now:               o.Now,
	})
	a.extproc.Register(a.extGRPC)
	return nil
}

// objectives is where requests' priorities come from under cfg: the InferencePool's
// InferenceObjectives, watched by Kubernetes discovery, or else the configuration's
// objectives map (nil without one: every request has priority 0).
func (a *App) objectives(cfg *config.Config) extproc.Objectives {
	if k := cfg.Discovery.Kubernetes; k != nil && k.InferencePool != "" {
		if o, ok := a.discovery.(extproc.Objectives); ok {
			return o
		}
	}
	if len(cfg.Objectives) == 0 {
		return nil
	}
	return cfg.Objectives
}

// rewrites is where requests' model rewrites come from under cfg: the InferencePool's
// InferenceModelRewrites, watched by Kubernetes discovery, or else the configuration's
// model_rewrites (nil without any: only the x-gateway-model-name-rewrite header
// rewrites).
func (a *App) rewrites(cfg *config.Config) (extproc.Rewrites, error) {
	if k := cfg.Discovery.Kubernetes; k != nil && k.InferencePool != "" {
		if r, ok := a.discovery.(extproc.Rewrites); ok {
			return r, nil
		}
	}
	t, err := cfg.ModelRewrites.Table()
	if err != nil || t == nil {
		return nil, err
	}
	return t, nil
}
