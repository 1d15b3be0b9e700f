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

// newPolicy builds the named policy. Names are those config.PolicyNames lists; src feeds
// the random policy (nil: seeded from the clock).
func newPolicy(name string, src rand.Source) (scoring.Policy, error) {
	switch name {
	case "random":
		if src == nil {
			now := uint64(time.Now().UnixNano())
			src = rand.NewPCG(now, now>>1|1)
		}
		return scoring.NewRandom(src), nil
	case "round-robin":
		return scoring.NewRoundRobin(), nil
	case "least-load":
		return scoring.NewLeastLoad(), nil
	}
	return nil, fmt.Errorf("app: unknown policy %q (known: %v)", name, config.PolicyNames())
}

// registerExtProc builds the ext_proc server over the fleet and registers it on g.
func (a *App) registerExtProc(o Options) error {
	policy, err := newPolicy(a.cfg.Policy.Name, o.Rand)
	if err != nil {
		return err
	}
	fallback, err := newPolicy(a.cfg.Policy.Fallback, o.Rand)
	if err != nil {
		return err
	}
	a.extproc = extproc.New(extproc.Options{
		Policy:       policy,
		Fallback:     fallback,
		Fleet:        a.fleet,
		Tokenizer:    o.Tokenizer,
		MaxBodyBytes: a.cfg.Limits.MaxBodyBytes,
		Logger:       a.log.Named("extproc"),
		Registerer:   a.reg,
		Now:          o.Now,
	})
	a.extproc.Register(a.extGRPC)
	return nil
}
