package extproc

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics is the server's typed metrics set.
type metrics struct {
	decisions       *prometheus.CounterVec
	decisionKinds   *prometheus.CounterVec
	decisionLatency prometheus.Histogram
	parseErrors     *prometheus.CounterVec
	tokenizeErrors  prometheus.Counter
	fallbacks       *prometheus.CounterVec
	noEndpoint      *prometheus.CounterVec
	streams         prometheus.Gauge
	refused         *prometheus.CounterVec
	bodyBytesHeld   prometheus.Gauge
	streamErrors    *prometheus.CounterVec
	responses       *prometheus.CounterVec
	promptTokens    *prometheus.CounterVec
	cachedTokens    *prometheus.CounterVec
	holds           prometheus.Counter
	holdSeconds     prometheus.Counter
	upstreamFailed  *prometheus.CounterVec
	shed            *prometheus.CounterVec
	holdsCut        *prometheus.CounterVec
	// rewrites is inference_extension_model_rewrite_decisions_total, the picker's.
	rewrites     *prometheus.CounterVec
	rewritesKept *prometheus.CounterVec

	gie *gieMetrics
}

// gieMetrics are the Gateway API Inference Extension endpoint picker's per-request series
// (its pkg/epp/metrics, v1.x: names, labels, buckets and the moments they are recorded),
// so that dashboards and alerts built on the picker work on kvrouter. They are fed where
// kvrouter's own series are. Their model_name is the request's model when the fleet
// serves it or an InferenceModelRewrite rule names it, else "": never a name a client made
// up; target_model_name is the model the request was routed and forwarded for (the
// same unless a rewrite changed it), bounded the same way.
type gieMetrics struct {
	requests     *prometheus.CounterVec   // inference_objective_request_total
	errors       *prometheus.CounterVec   // inference_objective_request_error_total
	duration     *prometheus.HistogramVec // inference_objective_request_duration_seconds
	inputTokens  *prometheus.HistogramVec // inference_objective_input_tokens
	outputTokens *prometheus.HistogramVec // inference_objective_output_tokens
	cachedTokens *prometheus.HistogramVec // inference_objective_prompt_cached_tokens
	running      *prometheus.GaugeVec     // inference_objective_running_requests
	requestSize  *prometheus.HistogramVec // inference_objective_request_sizes
	responseSize *prometheus.HistogramVec // inference_objective_response_sizes

	models sync.Map // gieKey -> *gieModel
}

// gieKey is the labels of one gieModel.
type gieKey struct{ model, target string }

// gieModel is one (model_name, target_model_name)'s series, looked up once: a request then costs one map load
// instead of a label lookup per series.
type gieModel struct {
	requests0                  prometheus.Counter // priority "0", the usual case
	duration, requestSize      prometheus.Observer
	responseSize, inputTokens  prometheus.Observer
	outputTokens, cachedTokens prometheus.Observer
	running                    prometheus.Gauge
}

// forModel returns the series of requests for model routed for target. The keys are
// bounded as the labels are: models the fleet serves or rewrite rules name, or "".
func (g *gieMetrics) forModel(model, target string) *gieModel {
	k := gieKey{model, target}
	if v, ok := g.models.Load(k); ok {
		return v.(*gieModel)
	}
	gm := &gieModel{
		requests0:    g.requests.WithLabelValues(model, target, "0"),
		duration:     g.duration.WithLabelValues(model, target),
		requestSize:  g.requestSize.WithLabelValues(model, target),
		responseSize: g.responseSize.WithLabelValues(model, target),
		inputTokens:  g.inputTokens.WithLabelValues(model, target),
		outputTokens: g.outputTokens.WithLabelValues(model, target),
		cachedTokens: g.cachedTokens.WithLabelValues(model, target),
		running:      g.running.WithLabelValues(model),
	}
	v, _ := g.models.LoadOrStore(k, gm)
	return v.(*gieModel)
}

// The picker's error codes (its pkg/common/error) that kvrouter's answers map to, in
// inference_objective_request_error_total.
const (
	gieErrResourceExhausted  = "ResourceExhausted"  // a sheddable request answered 429
	gieErrServiceUnavailable = "ServiceUnavailable" // no eligible endpoint: 503
	gieErrModelServer        = "ModelServerError"   // the upstream answered other than 200
)

// The picker's buckets for the series above.
var (
	// gieLatencyBuckets: 5 ms to one hour, for long-running inference.
	gieLatencyBuckets = []float64{
		0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6,
		8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
		1800, 2700, 3600,
	}
	// gieInputBuckets: prompts up to a million tokens (32778, not 32768, is the picker's).
	gieInputBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288, 1048576}
	// gieOutputBuckets: outputs up to 8192 tokens.
	gieOutputBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}
	// gieRequestSizeBuckets: 64 bytes to 1 GiB.
	gieRequestSizeBuckets = []float64{
		64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
		131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608,
		16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824,
	}
	// gieResponseSizeBuckets: 1 byte to 64 KiB (32778, not 32768, is the picker's).
	gieResponseSizeBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536}
)

func newGIEMetrics(reg prometheus.Registerer) *gieMetrics {
	model := []string{"model_name", "target_model_name"}
	return &gieMetrics{
		requests: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_total",
			Help: "Inference Extension series: requests routed, by model, target model (the model forwarded: the same unless rewritten) and the priority of the request's InferenceObjective.",
		}, []string{"model_name", "target_model_name", "priority"})),
		errors: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_error_total",
			Help: "Inference Extension series: requests that failed, by error_code: ResourceExhausted (shed, 429), ServiceUnavailable (no eligible endpoint, 503), ModelServerError (the upstream answered other than 200).",
		}, append(model, "error_code"))),
		duration: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_duration_seconds",
			Help:    "Inference Extension series: time from the request's headers to the end of its response, holds included.",
			Buckets: gieLatencyBuckets,
		}, model)),
		inputTokens: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_input_tokens",
			Help:    "Inference Extension series: usage.prompt_tokens of the responses that report usage.",
			Buckets: gieInputBuckets,
		}, model)),
		outputTokens: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_output_tokens",
			Help:    "Inference Extension series: usage.completion_tokens of the responses that report usage.",
			Buckets: gieOutputBuckets,
		}, model)),
		cachedTokens: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_prompt_cached_tokens",
			Help:    "Inference Extension series: usage.prompt_tokens_details.cached_tokens of the responses that report it.",
			Buckets: gieInputBuckets,
		}, model)),
		running: register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inference_objective_running_requests",
			Help: "Inference Extension series: requests routed whose response has not ended, by model.",
		}, []string{"model_name"})),
		requestSize: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_request_sizes",
			Help:    "Inference Extension series: bytes of the routed request's body the router had read when it decided.",
			Buckets: gieRequestSizeBuckets,
		}, model)),
		responseSize: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inference_objective_response_sizes",
			Help:    "Inference Extension series: bytes of the response body, at its end.",
			Buckets: gieResponseSizeBuckets,
		}, model)),
	}
}

func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		reg = prometheus.NewRegistry() // discard
	}
	m := &metrics{
		decisions: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_routing_decisions_total",
			Help: "Requests routed, by chosen endpoint and by the policy that chose it.",
		}, []string{"endpoint", "policy"})),
		decisionKinds: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_routing_decision_kinds_total",
			Help: "Requests routed, by the policy that chose and the decision's kind (scoring.Decision.Kind, as in the kvrouter:decision dynamic metadata): fallback for the fallback policy's, empty for a policy that names none.",
		}, []string{"policy", "kind"})),
		decisionLatency: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_routing_decision_duration_seconds",
			Help:    "Time from the last request message the decision needs to the decision (parse, tokenize, pick).",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3},
		})),
		parseErrors: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_request_parse_errors_total",
			Help: "Request bodies not parsed, by reason; such requests are routed by load.",
		}, []string{"reason"})),
		tokenizeErrors: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_tokenize_errors_total",
			Help: "Parsed requests the tokenizer failed on; the policy gets no token ids.",
		})),
		fallbacks: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_routing_fallbacks_total",
			Help: "Requests routed by the fallback (load) policy instead of the configured one, by reason.",
		}, []string{"reason"})),
		noEndpoint: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_no_endpoint_total",
			Help: "Requests answered 503 because no endpoint was eligible, by reason.",
		}, []string{"reason"})),
		upstreamFailed: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_upstream_failures_total",
			Help: "Routed requests whose chosen endpoint did not answer, as the proxy's response headers tell: local_reply (a 503 the proxy made itself, no upstream service time) or fallback_served (the proxy retried on a fallback).",
		}, []string{"kind"})),
		streams: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_extproc_streams_in_flight",
			Help: "Open ext_proc streams (HTTP requests being processed).",
		})),
		refused: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_extproc_streams_refused_total",
			Help: "ext_proc streams refused, by reason: draining, max_streams (limits.max_streams open).",
		}, []string{"reason"})),
		bodyBytesHeld: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_extproc_body_bytes_held",
			Help: "Memory reserved for the request bodies all streams hold: ParseCost (6) x their bytes (the body, its decoded strings, the rendered prompt, the template's strings) while parsed, RewriteCost (1) x a rewritten copy's bytes until passed on, bounded by limits.body_budget_bytes.",
		})),
		streamErrors: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_extproc_stream_errors_total",
			Help: "ext_proc streams that ended in error: recv (client gone or stream broken), idle (no message within limits.stream_idle_timeout, or none when the drain began), send, protocol (message out of order), cancelled (the stream ended while its request was held).",
		}, []string{"reason"})),
		responses: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_responses_total",
			Help: "Upstream responses seen, by endpoint and status class.",
		}, []string{"endpoint", "code"})),
		promptTokens: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_prompt_tokens_total",
			Help: "Prompt tokens reported in response usage, by endpoint.",
		}, []string{"endpoint"})),
		cachedTokens: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_cached_prompt_tokens_total",
			Help: "Prompt tokens served from the endpoint's prefix cache (usage.prompt_tokens_details.cached_tokens), by endpoint.",
		}, []string{"endpoint"})),
		holds: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_routing_holds_total",
			Help: "Holds honoured: times a request waited at the router, at its policy's request, before being picked again.",
		})),
		holdSeconds: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_routing_hold_seconds_total",
			Help: "Time requests spent held at the router at their policy's request.",
		})),
		holdsCut: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_routing_holds_cut_total",
			Help: "Holds a policy asked for and the router did not honour, by the bound they would pass: max_hold, deadline (the stream's).",
		}, []string{"bound"})),
		shed: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_requests_shed_total",
			Help: "Sheddable requests (their InferenceObjective's priority < 0) answered 429 because every eligible endpoint's queue was over the shedding bound, by objective.",
		}, []string{"objective"})),
		rewrites: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_extension_model_rewrite_decisions_total",
			Help: "Inference Extension series: requests routed whose model an InferenceModelRewrite rule rewrote, by the rewrite's name, the request's model (\"\" for a model neither served nor named by a rule) and the target model chosen.",
		}, []string{"model_rewrite_name", "model_name", "target_model"})),
		rewritesKept: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_model_rewrites_kept_total",
			Help: "Requests routed for their own model although a rewrite applied (source: rule, an InferenceModelRewrite; header, x-gateway-model-name-rewrite or x-llm-d-model-name-rewrite), because no endpoint serves a target and some serve the request's model.",
		}, []string{"source"})),
	}
	m.gie = newGIEMetrics(reg)
	return m
}

// register adds c to reg, or returns the collector already registered under its name so
// that several Servers can share one registry.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic("extproc: registering metrics: " + err.Error())
	}
	return c
}
