package rewrite

import (
	"fmt"

	"github.com/kvrouter/kvrouter/config/field"
)

// Rewrite is one InferenceModelRewrite's rules: the resource's spec without its poolRef
// (the router serves one pool), named as the resource is.
type Rewrite struct {
	// Name is the resource's metadata.name; it labels
	// inference_extension_model_rewrite_decisions_total.
	Name string `yaml:"name" json:"name"`
	// Rules are tried in order; the first matching one is used (see Table for the
	// precedence across rules and Rewrites).
	Rules []Rule `yaml:"rules" json:"rules"`
}

// Rule is one rule: the models it matches and the targets it sends them to.
type Rule struct {
	// Matches lists the models the rule applies to (any of them). Empty: every model,
	// a generic rule, used only when no rule matches the model exactly.
	Matches []Match `yaml:"matches" json:"matches,omitempty"`
	// Targets are the models a matching request is sent to, one chosen per request in
	// proportion to the weights.
	Targets []Target `yaml:"targets" json:"targets"`
}

// Match is one match criterion: the request body's "model".
type Match struct {
	Model ModelMatch `yaml:"model" json:"model"`
}

// ModelMatch matches the request body's "model".
type ModelMatch struct {
	// Type is the kind of match: MatchExact, the only one the resource defines, and the
	// default when empty.
	Type string `yaml:"type" json:"type,omitempty"`
	// Value is the model name to match.
	Value string `yaml:"value" json:"value"`
}

// MatchExact is the only match type: the model name equals Value.
const MatchExact = "Exact"

// Target is a weighted model destination.
type Target struct {
	// ModelRewrite is the model name the request body is rewritten to.
	ModelRewrite string `yaml:"model_rewrite" json:"model_rewrite"`
	// Weight is the target's share: weight / the sum of the rule's weights. Either every
	// target of a rule has one (1 to MaxWeight) or none has, and then they share equally.
	Weight int `yaml:"weight" json:"weight,omitempty"`
}

// MaxWeight is the largest weight, the resource's bound.
const MaxWeight = 1_000_000

// Validate checks that every rule can be applied: at least one rule, each with at least
// one target naming a model, weights on every target of a rule or on none and within 1
// to MaxWeight, matches of type Exact naming a model. Paths in the field.Errors are
// relative to the Rewrite (rules[0].targets[1].weight).
func (r *Rewrite) Validate() error {
	var errs field.Errors
	if len(r.Rules) == 0 {
		errs.Addf("rules", "at least one rule is required")
	}
	for i, rule := range r.Rules {
		p := field.Index("rules", i)
		for j, m := range rule.Matches {
			mp := field.Join(field.Index(field.Join(p, "matches"), j), "model")
			if m.Model.Type != "" && m.Model.Type != MatchExact {
				errs.Addf(field.Join(mp, "type"), "%q is not a match type: the only one is %q", m.Model.Type, MatchExact)
			}
			if m.Model.Value == "" {
				errs.Addf(field.Join(mp, "value"), "is required: the model name to match (a rule matching every model has no matches)")
			}
		}
		tp := field.Join(p, "targets")
		if len(rule.Targets) == 0 {
			errs.Addf(tp, "at least one target is required")
		}
		weighted := 0
		for j, t := range rule.Targets {
			if t.ModelRewrite == "" {
				errs.Addf(field.Join(field.Index(tp, j), "model_rewrite"), "is required: the model the request is sent to")
			}
			switch {
			case t.Weight < 0 || t.Weight > MaxWeight:
				errs.Addf(field.Join(field.Index(tp, j), "weight"), "%d is out of range (1..%d)", t.Weight, MaxWeight)
			case t.Weight > 0:
				weighted++
			}
		}
		if weighted > 0 && weighted < len(rule.Targets) {
			errs.Addf(tp, "%d of %d targets have a weight: set a weight on every target or on none (equal shares)", weighted, len(rule.Targets))
		}
	}
	return errs.Err()
}

// Table answers which rule applies to a model, by the resource's precedence: a rule
// naming the model exactly wins over a generic rule (no matches); among several, the
// one of the earliest Rewrite (the oldest resource), then the first in its rules. Build
// it with NewTable; the zero Table and a nil *Table match nothing.
type Table struct {
	exact   map[string]Decision
	generic *Decision
	rws     []Rewrite // as given to NewTable
}

// Decision is the rule a model matched: the Rewrite it belongs to and its targets.
type Decision struct {
	// Name is the Rewrite's name.
	Name string
	// Targets are the rule's targets (shared: not to be modified).
	Targets []Target
	// Exact is true when the rule names the model (false: a generic rule).
	Exact bool
}

// NewTable indexes rws, given in precedence order (the oldest resource first), each
// valid (Validate). A rule that Validate would refuse is an error here too, so that no
// request meets it.
func NewTable(rws []Rewrite) (*Table, error) {
	t := &Table{exact: map[string]Decision{}, rws: rws}
	for i := range rws {
		r := &rws[i]
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("rewrite %q: %w", r.Name, err)
		}
		for _, rule := range r.Rules {
			d := Decision{Name: r.Name, Targets: rule.Targets}
			if len(rule.Matches) == 0 {
				if t.generic == nil {
					t.generic = &d
				}
				continue
			}
			d.Exact = true
			for _, m := range rule.Matches {
				if _, ok := t.exact[m.Model.Value]; !ok {
					t.exact[m.Model.Value] = d
				}
			}
		}
	}
	return t, nil
}

// Lookup returns the rule that applies to model; ok is false when none does.
func (t *Table) Lookup(model string) (d Decision, ok bool) {
	if t == nil {
		return Decision{}, false
	}
	if d, ok := t.exact[model]; ok {
		return d, true
	}
	if t.generic != nil {
		return *t.generic, true
	}
	return Decision{}, false
}

// Rewrites returns the rewrites the table was built from, in precedence order (shared:
// not to be modified), for /debug/rewrites.
func (t *Table) Rewrites() []Rewrite {
	if t == nil {
		return nil
	}
	return t.rws
}

// Empty reports whether the table has no rule.
func (t *Table) Empty() bool { return t == nil || (len(t.exact) == 0 && t.generic == nil) }

// Choose picks one of targets at random in proportion to the weights (equal shares when
// none is set), among those eligible accepts (all of them when eligible is nil); intn
// returns a uniform int in [0, n), as math/rand/v2.IntN. ok is false when no target is
// eligible. eligible is called once per target.
func Choose(targets []Target, eligible func(model string) bool, intn func(n int) int) (model string, ok bool) {
	var buf [16]bool
	in := buf[:0]
	if len(targets) > len(buf) {
		in = make([]bool, 0, len(targets))
	}
	total := 0
	for _, t := range targets {
		e := eligible == nil || eligible(t.ModelRewrite)
		in = append(in, e)
		if e {
			total += max(t.Weight, 1)
		}
	}
	if total == 0 {
		return "", false
	}
	r := intn(total)
	for i, t := range targets {
		if !in[i] {
			continue
		}
		if r -= max(t.Weight, 1); r < 0 {
			return t.ModelRewrite, true
		}
	}
	return "", false // unreachable while intn stays in [0, n)
}
