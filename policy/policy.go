package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/scoring"
)

// Config is every policy's typed configuration, one section per policy that has knobs
// (the YAML file's policy.<section>). A policy reads only its own section (Spec.Section).
type Config struct {
	// KV is the kv and approximate policies' cost weights (NVIDIA Dynamo's).
	KV scoring.KVConfig `yaml:"kv"`
	// Placement tunes the placement policy.
	Placement placement.Config `yaml:"placement"`
}

// DefaultConfig returns every section's defaults.
func DefaultConfig() Config {
	return Config{KV: scoring.DefaultKVConfig(), Placement: placement.DefaultConfig()}
}

// Deps is what a policy may be built from; a caller fills what it has, and Registry.New
// refuses a policy whose needs (Spec.Index) are not met.
type Deps struct {
	// Index answers which endpoints hold a request's leading blocks (the event-fed block
	// index). Needed by the policies whose Spec.Index is true.
	Index scoring.PrefixIndex
	// Health says whether an endpoint's KV events are flowing (kv); nil trusts them all.
	Health scoring.EventHealth
	// Rand feeds random choices and tie-breaks; nil: seeded from the clock.
	Rand rand.Source
	// Now is the clock policies time responses with; nil: time.Now.
	Now func() time.Time
	// Registerer takes the policies' metrics; nil: not registered.
	Registerer prometheus.Registerer
	// BlockSize is the served model's KV block size (models.*.block_size), used for an
	// endpoint whose scraped block size is unknown; 0 keeps the policy's default (16).
	BlockSize int
}

// Factory builds one policy from its configuration and dependencies.
type Factory func(c *Config, d Deps) (scoring.Policy, error)

// Spec is one policy as the registry knows it.
type Spec struct {
	// Name is the policy's name in configuration and in metrics (its Policy.Name()).
	Name string
	// LoadOnly policies need no token ids and keep no per-request state: only they may
	// serve as the fallback (requests the router cannot read).
	LoadOnly bool
	// Index policies read the block index: Deps.Index must be set.
	Index bool
	// Section names the Config section the policy reads ("kv", "placement"; "" none).
	Section string
	// New builds the policy.
	New Factory
}

// Registry is a fixed list of policies by name. Build it once (Builtin, or NewRegistry
// for a custom list) and pass it to what needs it.
type Registry struct {
	specs []Spec
}

// NewRegistry returns a registry of specs, in that order. Names must be non-empty and
// distinct, every spec needs a constructor, and Section must name a Config section.
func NewRegistry(specs ...Spec) (*Registry, error) {
	var errs []error
	seen := map[string]bool{}
	for _, s := range specs {
		switch {
		case s.Name == "":
			errs = append(errs, errors.New("policy: a spec has no name"))
		case seen[s.Name]:
			errs = append(errs, fmt.Errorf("policy: %q registered twice", s.Name))
		case s.New == nil:
			errs = append(errs, fmt.Errorf("policy: %q has no constructor", s.Name))
		case s.Section != "" && s.Section != SectionKV && s.Section != SectionPlacement:
			errs = append(errs, fmt.Errorf("policy: %q reads unknown section %q", s.Name, s.Section))
		}
		seen[s.Name] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Registry{specs: append([]Spec(nil), specs...)}, nil
}

// Config sections, by their YAML names under policy:.
const (
	SectionKV        = "kv"
	SectionPlacement = "placement"
)

// Specs returns the registered specs in order (a copy).
func (r *Registry) Specs() []Spec { return append([]Spec(nil), r.specs...) }

// Lookup returns the spec registered under name.
func (r *Registry) Lookup(name string) (Spec, bool) {
	for _, s := range r.specs {
		if s.Name == name {
			return s, true
		}
	}
	return Spec{}, false
}

// Names lists every registered policy, in order.
func (r *Registry) Names() []string {
	out := make([]string, len(r.specs))
	for i, s := range r.specs {
		out[i] = s.Name
	}
	return out
}

// FallbackNames lists the policies allowed as the fallback (LoadOnly), in order.
func (r *Registry) FallbackNames() []string {
	var out []string
	for _, s := range r.specs {
		if s.LoadOnly {
			out = append(out, s.Name)
		}
	}
	return out
}

// UnknownError is returned for a name the registry does not hold.
type UnknownError struct {
	Name  string
	Known []string
}

func (e *UnknownError) Error() string {
	return fmt.Sprintf("policy: unknown policy %q (known: %s)", e.Name, strings.Join(e.Known, ", "))
}

// New builds the named policy from c (nil: DefaultConfig) and d.
func (r *Registry) New(name string, c *Config, d Deps) (scoring.Policy, error) {
	s, ok := r.Lookup(name)
	if !ok {
		return nil, &UnknownError{Name: name, Known: r.Names()}
	}
	if s.Index && d.Index == nil {
		return nil, fmt.Errorf("policy: %q needs the block index", name)
	}
	if c == nil {
		dc := DefaultConfig()
		c = &dc
	}
	if d.Rand == nil {
		now := uint64(time.Now().UnixNano())
		d.Rand = rand.NewPCG(now, now>>1|1)
	}
	p, err := s.New(c, d)
	if err != nil {
		return nil, fmt.Errorf("policy: %s: %w", name, err)
	}
	if _, observes := p.(scoring.Observer); !observes && partObserver(p) {
		// The router finds observers by type assertion: a policy missing one of the
		// calls would silently get none of them and keep stale per-request state.
		return nil, fmt.Errorf("policy: %s implements part of scoring.Observer (Routed, Moved, FirstToken, Finished) but not all of it", name)
	}
	return p, nil
}

// partObserver reports whether p has any of scoring.Observer's methods.
func partObserver(p scoring.Policy) bool {
	switch p.(type) {
	case interface {
		Routed(*scoring.Request, string)
	},
		interface{ Moved(string, string) },
		interface{ FirstToken(string) },
		interface{ Finished(string) }:
		return true
	}
	return false
}

// Builtin returns a new registry of every policy this build ships, in the order
// configuration errors list them: the load-only random, round-robin and least-load, the
// KV-aware kv and approximate (NVIDIA Dynamo's cost), and placement.
func Builtin() *Registry {
	// A fixed list: TestBuiltinIsValid checks it passes NewRegistry's rules.
	return &Registry{specs: []Spec{
		{Name: "random", LoadOnly: true, New: func(_ *Config, d Deps) (scoring.Policy, error) {
			return scoring.NewRandom(d.Rand), nil
		}},
		{Name: "round-robin", LoadOnly: true, New: func(*Config, Deps) (scoring.Policy, error) {
			return scoring.NewRoundRobin(), nil
		}},
		{Name: "least-load", LoadOnly: true, New: func(*Config, Deps) (scoring.Policy, error) {
			return scoring.NewLeastLoad(), nil
		}},
		{Name: "kv", Index: true, Section: SectionKV, New: func(c *Config, d Deps) (scoring.Policy, error) {
			return scoring.NewKV(kvConfig(c, d), d.Index, d.Health, d.Rand, d.Registerer)
		}},
		{Name: "approximate", Section: SectionKV, New: func(c *Config, d Deps) (scoring.Policy, error) {
			return scoring.NewApproximate(kvConfig(c, d), d.Rand, d.Registerer)
		}},
		{Name: "placement", Index: true, Section: SectionPlacement, New: func(c *Config, d Deps) (scoring.Policy, error) {
			pc := c.Placement
			if d.BlockSize > 0 {
				pc.BlockSize = d.BlockSize
			}
			return placement.New(pc, d.Index, d.Now, d.Registerer)
		}},
	}}
}

func kvConfig(c *Config, d Deps) scoring.KVConfig {
	kc := c.KV
	if d.BlockSize > 0 {
		kc.BlockSize = d.BlockSize
	}
	return kc
}
