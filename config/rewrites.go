package config

import (
	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/rewrite"
)

// ModelRewrites are InferenceModelRewrites for kvrouter outside an InferencePool: what
// the Gateway API Inference Extension's InferenceModelRewrite resources give a picker in
// a cluster, in the same shape (each one's name and spec.rules, keys in snake_case).
// Precedence is the resource's, with list order standing for age: a rule naming the
// model exactly wins over a generic one (no matches), then the earlier rewrite, then the
// earlier rule. Unset: no rule (the x-gateway-model-name-rewrite header still rewrites).
// With discovery.kubernetes.inference_pool the pool's InferenceModelRewrites are watched
// instead.
type ModelRewrites []rewrite.Rewrite

// Validate checks each rewrite (rewrite.Rewrite.Validate) and that names are
// InferenceModelRewrite names, each used once.
func (r ModelRewrites) Validate() error {
	var errs field.Errors
	seen := map[string]bool{}
	for i := range r {
		p := field.Index("", i)
		switch name := r[i].Name; {
		case name == "":
			errs.Addf(field.Join(p, "name"), "is required: it labels inference_extension_model_rewrite_decisions_total")
		case !discovery.IsObjectName(name):
			errs.Addf(field.Join(p, "name"), "%q is not an InferenceModelRewrite name (a Kubernetes object name: lower-case letters, digits, '-' and '.', at most 253 characters)", name)
		case seen[name]:
			errs.Addf(field.Join(p, "name"), "%q names two rewrites", name)
		}
		seen[r[i].Name] = true
		errs.Nest(p, r[i].Validate())
	}
	return errs.Err()
}

// Table is the rules in force, for extproc.Options.Rewrites: nil when there are none.
// The rewrites must be valid (Load checks them).
func (r ModelRewrites) Table() (*rewrite.Table, error) {
	if len(r) == 0 {
		return nil, nil
	}
	return rewrite.NewTable(r)
}
