// Package epp holds the names of the endpoint-picker protocol that kvrouter speaks with
// the gateway (the Gateway API Inference Extension's protocol over Envoy ext_proc): the
// headers and dynamic-metadata keys that carry the decision, and the health service name.
// The ext_proc server, the Envoy config checks and the dev gateway all read them from
// here, so there is one copy of each. It declares constants only.
package epp

const (
	// ServiceName is the gRPC service name the gateway's health check of the picker uses.
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
	// HeaderDestination carries the chosen endpoint ("ip:port", fallbacks after commas).
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderServed is added to the response: the endpoint that served it.
	HeaderServed = "x-gateway-destination-endpoint-served"
	// HeaderPrefix starts every header the picker owns; client-sent ones are removed.
	HeaderPrefix = "x-gateway-destination-"
	// HeaderObjective names the InferenceObjective a request belongs to (its
	// metadata.name, in the pool's namespace), whose spec.priority is the request's
	// priority; the gateway or the client sets it (the Inference Extension's
	// metadata.ObjectiveKey).
	HeaderObjective = "x-gateway-inference-objective"
	// HeaderObjectiveLLMD is HeaderObjective under llm-d-router's name
	// (metadata.ObjectiveKey there, which keeps x-gateway-inference-objective as a
	// deprecated alias). Both are read; when a request carries both, this one wins, as
	// llm-d-router reads its current name before the alias.
	HeaderObjectiveLLMD = "x-llm-d-inference-objective"
	// HeaderModelRewrite names the model a request is to be forwarded for instead of the
	// one its body names, set by the gateway (an HTTPRoute's header filter, say) or by the
	// client: as the Inference Extension's picker (metadata.ModelNameRewriteKey, read in
	// HandleRequestHeaders), the value is taken as sent and written into the body's
	// "model" unless an InferenceModelRewrite rule matches the request's model, which
	// wins. It names a model, never an endpoint.
	HeaderModelRewrite = "x-gateway-model-name-rewrite"
	// HeaderModelRewriteLLMD is HeaderModelRewrite under llm-d-router's name
	// (metadata.ModelNameRewriteKey there, which keeps x-gateway-model-name-rewrite as a
	// deprecated alias). Both are read; when a request carries both, this one wins, as
	// llm-d-router reads its current name before the alias.
	HeaderModelRewriteLLMD = "x-llm-d-model-name-rewrite"
	// NamespaceLB is the dynamic-metadata namespace of the decision and of the served endpoint.
	NamespaceLB = "envoy.lb"
	// NamespaceSubsetHint is the metadata namespace of the gateway's subset hint.
	NamespaceSubsetHint = "envoy.lb.subset_hint"
	// NamespaceKVRouter is kvrouter's own dynamic-metadata namespace: debug facts about a
	// decision for the proxy's access log (%DYNAMIC_METADATA(kvrouter:decision)%), never
	// a header a client sees. Not part of the endpoint-picker protocol; the proxy accepts
	// it only when its ext_proc filter lists it in metadata_options.receiving_namespaces.
	NamespaceKVRouter = "kvrouter"
	// KeyDecision is the NamespaceKVRouter key naming the decision's kind
	// (scoring.Decision.Kind); absent when the policy does not say.
	KeyDecision = "decision"
	// KeySubset is the subset hint's key: a list of "ip:port" or one comma-separated string.
	KeySubset = "x-gateway-destination-endpoint-subset"
	// HeaderUpstreamServiceTime is the header Envoy's router adds to a response that came
	// from an upstream (the upstream's time to headers). A response without it was made
	// by the proxy itself (a local reply): with status 503, the chosen endpoint could not
	// be connected to or reset before answering, a passive health signal. Proxies
	// configured with the router's suppress_envoy_headers never send it: keep that off.
	HeaderUpstreamServiceTime = "x-envoy-upstream-service-time"
	// MaxChunkBytes bounds each streamed_response body chunk, as the protocol asks.
	MaxChunkBytes = 62000
)
