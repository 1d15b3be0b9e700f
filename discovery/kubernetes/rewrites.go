package kubernetes

import (
	"cmp"
	"maps"
	"slices"

	"go.uber.org/zap"
	infx "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvrouter/kvrouter/rewrite"
)

// poolRewrites are the pool's InferenceModelRewrites as the source last indexed them.
type poolRewrites struct {
	table   *rewrite.Table
	refused map[string]string // name -> why, of the rewrites refused
}

// indexRewrites builds the rule table of the objects that are InferenceModelRewrites
// referring to the source's pool (ourPool), by the resource's precedence: the oldest
// resource first (creationTimestamp, then name, so that ties have one order). A
// rewrite with a rule the router could not apply (rewrite.Rewrite.Validate: no target,
// weights on some targets only, a match type other than Exact, ...) is refused whole,
// counted (kvrouter_discovery_errors_total{reason="model_rewrite_invalid"}) and logged
// when first refused (prev is the last indexing, nil before the first); the others
// apply. No request meets a refused rule.
func (s *Source) indexRewrites(objs []any, prev *poolRewrites) *poolRewrites {
	type found struct {
		rw  rewrite.Rewrite
		obj *infx.InferenceModelRewrite
	}
	var ours []found
	refused := map[string]string{}
	for _, obj := range objs {
		o, err := fromUnstructured[infx.InferenceModelRewrite]("InferenceModelRewrite", obj)
		if err != nil {
			s.o.Metrics.Error(s.name, "model_rewrite_invalid")
			continue
		}
		if !s.ourPool(o.Spec.PoolRef) {
			continue
		}
		rw := rewriteOf(o)
		if err := rw.Validate(); err != nil {
			s.o.Metrics.Error(s.name, "model_rewrite_invalid")
			refused[o.Name] = err.Error()
			if prev == nil || prev.refused[o.Name] != refused[o.Name] {
				s.o.Logger.Warn("InferenceModelRewrite refused: its rules are not applied",
					zap.String("namespace", o.Namespace), zap.String("name", o.Name), zap.Error(err))
			}
			continue
		}
		ours = append(ours, found{rw, o})
	}
	slices.SortFunc(ours, func(a, b found) int {
		if c := a.obj.CreationTimestamp.Compare(b.obj.CreationTimestamp.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.obj.Name, b.obj.Name)
	})
	rws := make([]rewrite.Rewrite, len(ours))
	for i := range ours {
		rws[i] = ours[i].rw
	}
	t, err := rewrite.NewTable(rws)
	if err != nil { // each was validated above
		s.o.Metrics.Error(s.name, "model_rewrite_invalid")
		return prev
	}
	return &poolRewrites{table: t, refused: refused}
}

// rewriteOf is o's spec as a rewrite.Rewrite; a match without a model becomes one with
// an empty value, which Validate refuses.
func rewriteOf(o *infx.InferenceModelRewrite) rewrite.Rewrite {
	rw := rewrite.Rewrite{Name: o.Name}
	for _, r := range o.Spec.Rules {
		var rule rewrite.Rule
		for _, m := range r.Matches {
			var mm rewrite.ModelMatch
			if m.Model != nil {
				mm.Value = m.Model.Value
				if m.Model.Type != nil {
					mm.Type = string(*m.Model.Type)
				}
			}
			rule.Matches = append(rule.Matches, rewrite.Match{Model: mm})
		}
		for _, t := range r.Targets {
			rule.Targets = append(rule.Targets, rewrite.Target{ModelRewrite: t.ModelRewrite, Weight: int(t.Weight)})
		}
		rw.Rules = append(rw.Rules, rule)
	}
	return rw
}

// Lookup implements extproc.Rewrites: the rule of the pool's InferenceModelRewrites that
// applies to model. It knows none before the first list, outside inference_pool mode or
// while InferenceModelRewrites cannot be watched. Safe for concurrent use.
func (s *Source) Lookup(model string) (rewrite.Decision, bool) {
	p := s.rewrites.Load()
	if p == nil {
		return rewrite.Decision{}, false
	}
	return p.table.Lookup(model)
}

// Rewrites returns the rules Lookup applies, in precedence order, and the rewrites
// refused with why (both nil before the first list), for /debug/rewrites. Safe for
// concurrent use; the rewrites are shared, not to be modified.
func (s *Source) Rewrites() (rws []rewrite.Rewrite, refused map[string]string) {
	p := s.rewrites.Load()
	if p == nil {
		return nil, nil
	}
	return p.table.Rewrites(), maps.Clone(p.refused)
}
