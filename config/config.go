package config

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/peersync"
)

// Config is kvrouter's whole configuration file. Each section is owned by the package
// that uses it; later features add sections or fields, never reshape existing ones.
type Config struct {
	// Listen holds the addresses kvrouter serves on.
	Listen ListenConfig `yaml:"listen"`
	// Endpoints is the static list of vLLM servers.
	Endpoints []fleet.EndpointConfig `yaml:"endpoints"`
	// Models maps a base model's served name to how the router tokenizes for it. A model
	// served by some endpoint but absent here is routed by load only.
	Models map[string]ModelConfig `yaml:"models"`
	// Tokenizer bounds the tokenization caches of every model under Models.
	Tokenizer TokenizerConfig `yaml:"tokenizer"`
	// Policy chooses and tunes the placement policy.
	Policy PolicyConfig `yaml:"policy"`
	// Limits bounds sizes and times.
	Limits LimitsConfig `yaml:"limits"`
	// KV tunes the KV-cache path: the block index, the KV-event subscriber and the state
	// the kv and approximate policies keep.
	KV KVConfig `yaml:"kv"`
	// Discovery finds endpoints at run time (Kubernetes API or DNS), beside the static
	// list.
	Discovery discovery.Config `yaml:"discovery"`
	// Objectives gives the priority of the InferenceObjectives requests name
	// (x-gateway-inference-objective) outside Kubernetes; with an InferencePool the pool's
	// InferenceObjectives are watched instead.
	Objectives Objectives `yaml:"objectives"`
	// ModelRewrites rewrite the model requests name (model aliasing, a generic fallback,
	// weighted traffic splitting) outside Kubernetes; with an InferencePool the pool's
	// InferenceModelRewrites are watched instead.
	ModelRewrites ModelRewrites `yaml:"model_rewrites"`
	// Replicas is how kvrouter replicas find each other and share their in-flight
	// requests, so that they route as one (off without peers).
	Replicas peersync.Config `yaml:"replicas"`
}

// Default returns the configuration with every default and no endpoint.
func Default() Config {
	return Config{
		Listen:    DefaultListenConfig(),
		Policy:    DefaultPolicyConfig(),
		Limits:    DefaultLimitsConfig(),
		KV:        DefaultKVConfig(),
		Discovery: discovery.DefaultConfig(),
		Replicas:  peersync.DefaultConfig(),
	}
}

// Fleet returns the fleet's part of the configuration.
func (c *Config) Fleet() fleet.Config {
	return fleet.Config{Endpoints: c.Endpoints, Scrape: c.Limits.Scrape}
}

// Validate checks every section and the rules across sections. Paths in the returned
// field.Errors are those of the YAML file.
func (c *Config) Validate() error {
	var errs field.Errors
	errs.Nest("listen", c.Listen.Validate())
	if len(c.Endpoints) == 0 && !c.Discovery.Enabled() {
		errs.Addf("endpoints", "at least one endpoint is required (or configure discovery)")
	}
	errs.Nest("endpoints", fleet.ValidateEndpoints(c.Endpoints))
	for i, ep := range c.Endpoints {
		if err := CheckRankPorts(ep.KVEvents); err != nil {
			errs.Addf(field.Join(field.Index("endpoints", i), "kv_events.endpoints"), "%v", err)
		}
		if len(ep.KVEvents.CentralRanks) > 0 && c.Discovery.KVEvents.Mode != discovery.ModeCentral {
			errs.Addf(field.Join(field.Index("endpoints", i), "kv_events.central_ranks"),
				"needs discovery.kv_events.mode: %s (and its bind address)", discovery.ModeCentral)
		}
	}
	adapters := map[string]string{}
	for _, ep := range c.Endpoints {
		for _, a := range ep.LoRAAdapters {
			adapters[a.Name] = a.BaseModel
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Models)) {
		m := c.Models[name]
		p := field.Key("models", name)
		if base, ok := adapters[name]; ok {
			errs.Addf(p, "%q is a LoRA adapter of %q; configure the base model instead", name, base)
		}
		errs.Nest(p, m.Validate())
	}
	errs.Nest("tokenizer", c.Tokenizer.Validate())
	errs.Nest("policy", c.Policy.Validate())
	errs.Nest("limits", c.Limits.Validate())
	errs.Nest("kv", c.KV.Validate())
	errs.Nest("discovery", c.Discovery.Validate())
	errs.Nest("replicas", c.Replicas.Validate())
	errs.Nest("objectives", c.Objectives.Validate())
	if len(c.Objectives) > 0 && c.Discovery.Kubernetes != nil && c.Discovery.Kubernetes.InferencePool != "" {
		errs.Addf("objectives", "must be left unset with discovery.kubernetes.inference_pool: the pool's InferenceObjectives give the priorities")
	}
	errs.Nest("model_rewrites", c.ModelRewrites.Validate())
	if len(c.ModelRewrites) > 0 && c.Discovery.Kubernetes != nil && c.Discovery.Kubernetes.InferencePool != "" {
		errs.Addf("model_rewrites", "must be left unset with discovery.kubernetes.inference_pool: the pool's InferenceModelRewrites give the rules")
	}
	if c.Discovery.Kubernetes == nil {
		// Every served name is in this file (pods' annotations can add others): a target
		// none serves is a mistake a request would only meet later.
		served := map[string]bool{}
		add := func(models []string, adapters []fleet.LoRAAdapter) {
			for _, m := range models {
				served[m] = true
			}
			for _, a := range adapters {
				served[a.Name] = true
			}
		}
		for _, ep := range c.Endpoints {
			add(ep.Models, ep.LoRAAdapters)
		}
		if d := c.Discovery.DNS; d != nil {
			add(d.Models, d.LoRAAdapters)
		}
		for i, r := range c.ModelRewrites {
			for j, rule := range r.Rules {
				for k, t := range rule.Targets {
					if t.ModelRewrite != "" && !served[t.ModelRewrite] {
						errs.Addf(fmt.Sprintf("model_rewrites[%d].rules[%d].targets[%d].model_rewrite", i, j, k),
							"%q is served by no endpoint (endpoints[].models or lora_adapters, discovery.dns.models or lora_adapters)", t.ModelRewrite)
					}
				}
			}
		}
	}
	return errs.Err()
}
