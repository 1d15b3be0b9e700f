package config

import (
	"maps"
	"slices"
	"strings"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/policy"
)

// PolicyConfig chooses the routing policy and tunes it, one typed section per policy
// that has knobs (policy.kv, policy.placement; see policy.Config).
type PolicyConfig struct {
	// Name is the policy used when the request's tokens are known (policy.Builtin's names).
	Name string `yaml:"name"`
	// Fallback is the policy used when they are not (no tokenizer for the model,
	// unparsable body); it must be load-only.
	Fallback string `yaml:"fallback"`
	// Weights is the former untyped map of every policy's knobs, replaced by the typed
	// sections: any entry is refused with the name it now has.
	Weights map[string]float64 `yaml:"weights"`
	// Config holds the typed sections, kv and placement.
	policy.Config `yaml:",inline"`
}

// DefaultPolicyConfig returns placement (requests the router cannot tokenize are placed
// by load) with least-load as the fallback, and every section's defaults.
func DefaultPolicyConfig() PolicyConfig {
	return PolicyConfig{Name: "placement", Fallback: "least-load", Config: policy.DefaultConfig()}
}

// movedWeight maps a former policy.weights names to their place in the typed sections.
func movedWeight(name string) string {
	switch name {
	case "prefill_load_scale", "overlap_credit", "decode_active_request_weight", "temperature":
		return "policy.kv." + name
	case "hold_fraction":
		return "policy.placement.holder_share"
	case "hold_max_ms", "hold_step_ms":
		return "policy.placement." + strings.TrimSuffix(name, "_ms") + " (a duration, e.g. 120ms)"
	case "block_size":
		return "models.*.block_size (the model's block size)"
	}
	if slices.Contains(placement.KnobNames(), name) {
		return "policy.placement." + name
	}
	return ""
}

// Validate checks the names against the policy registry and every section.
func (c *PolicyConfig) Validate() error {
	var errs field.Errors
	reg := policy.Builtin()
	if _, ok := reg.Lookup(c.Name); !ok {
		errs.Addf("name", "unknown policy %q (known: %s)", c.Name, strings.Join(reg.Names(), ", "))
	}
	if fb := reg.FallbackNames(); !slices.Contains(fb, c.Fallback) {
		errs.Addf("fallback", "policy %q cannot be the fallback (allowed: %s)", c.Fallback, strings.Join(fb, ", "))
	}
	for _, k := range slices.Sorted(maps.Keys(c.Weights)) {
		if to := movedWeight(k); to != "" {
			errs.Addf(field.Key("weights", k), "policy.weights was replaced by typed sections: set %s", to)
		} else {
			errs.Addf(field.Key("weights", k), "policy.weights was replaced by typed sections (policy.kv, policy.placement), which have no %q", k)
		}
	}
	errs.Nest(policy.SectionKV, c.KV.Validate())
	errs.Nest(policy.SectionPlacement, c.Placement.Validate())
	return errs.Err()
}
