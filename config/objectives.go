package config

import (
	"maps"
	"slices"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/extproc"
)

// Objectives maps an InferenceObjective's name to its priority, for kvrouter outside
// Kubernetes: what the Gateway API Inference Extension's InferenceObjectives
// (spec.priority) give a picker in a cluster. A request names its objective in the
// x-gateway-inference-objective header; a negative priority makes it sheddable (see
// limits.shed_queue_depth). A request without the header, or naming an objective not
// listed, has priority 0, as in the Inference Extension. With
// discovery.kubernetes.inference_pool the pool's InferenceObjectives are watched instead.
type Objectives map[string]int

var _ extproc.Objectives = Objectives(nil)

// Priority implements extproc.Objectives.
func (o Objectives) Priority(name string) (int, bool) {
	p, ok := o[name]
	return p, ok
}

// Validate checks that each name is one an InferenceObjective could have (metadata.name),
// so that the same names work in a cluster.
func (o Objectives) Validate() error {
	var errs field.Errors
	for _, name := range slices.Sorted(maps.Keys(o)) {
		if !discovery.IsObjectName(name) {
			errs.Addf(field.Key("", name), "%q is not an InferenceObjective name (a Kubernetes object name: lower-case letters, digits, '-' and '.', at most 253 characters)", name)
		}
	}
	return errs.Err()
}
