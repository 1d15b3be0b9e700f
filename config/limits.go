package config

import (
	"time"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/scoring"
)

// LimitsConfig bounds sizes and times.
type LimitsConfig struct {
	// MaxBodyBytes is the largest request body the router reads to route; a larger body
	// is routed by load (default 16 MiB).
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// DrainTimeout bounds how long in-flight streams may run on after SIGTERM.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// DrainDelay is how long kvrouter keeps taking new ext_proc streams after SIGTERM
	// while its health answers NOT_SERVING, so that gateways stop sending before it
	// refuses: a gateway learns of the drain only from its next health checks (Envoy:
	// interval x unhealthy_threshold) or from the Service's endpoints being updated.
	// Default 5s: the shipped Envoy configs' 2s interval x 2 checks plus their 1s
	// timeout. 0 refuses new streams at once.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// MaxHold bounds how long the router may take to answer a request the policy asks to
	// hold (placement's hold_max), counted from the start of the decision: parsing,
	// tokenization and earlier holds count (0 never holds). Envoy's ext_proc
	// message_timeout (200ms unless set) runs meanwhile in every body mode but
	// FULL_DUPLEX_STREAMED, so it must stay well under it (at most 500ms). Default 120ms
	// (extproc.DefaultMaxHold): 80ms under Envoy's default message_timeout.
	MaxHold time.Duration `yaml:"max_hold"`
	// BodyBudgetBytes bounds the memory all ext_proc streams together hold for parsing
	// request bodies, each charged extproc.ParseCost (6) times its bytes: the body, its
	// decoded strings, the rendered prompt and the chat template's own strings
	// (tokenization is bounded by the token limit instead); a body whose model is
	// rewritten is charged its copy too (extproc.RewriteCost, 1x). A body that would pass
	// it is routed by load, streamed through unparsed and unrewritten, and counted
	// (kvrouter_request_parse_errors_total{reason="body_budget"}), so memory per request
	// is bounded by config rather than by clients. Default 112 MiB: one body of the
	// default max_body_bytes with its parse and its rewritten copy (the least Validate
	// accepts), or some 4,000 typical 4 KiB chat bodies, at once.
	BodyBudgetBytes int64 `yaml:"body_budget_bytes"`
	// MaxConnections bounds the ext_proc port's accepted connections; more wait in the
	// kernel's backlog, so file descriptors stay for the admin port, KV events and
	// scrapes. Default 4096: Envoy opens one HTTP/2 connection per worker thread, so
	// this serves 256 gateways of 16 workers.
	MaxConnections int `yaml:"max_connections"`
	// MaxStreams bounds the open ext_proc streams (one per HTTP request, generation
	// included); one more is refused with RESOURCE_EXHAUSTED. It is also each
	// connection's HTTP/2 stream limit. Default 16384: 500 req/s of 30 s requests; an
	// open stream costs some 20 KiB, so at most ~330 MiB.
	MaxStreams int `yaml:"max_streams"`
	// StreamIdleTimeout ends an ext_proc stream that sends no message this long after
	// it opened; a drain ends such streams at once. Default 10s: Envoy opens a stream
	// with the request headers, so a stream silent this long is not a request.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// MaxFallbacks is how many fallback endpoints the router lists after the chosen one
	// in x-gateway-destination-endpoint (comma-separated, best first), for the proxy to
	// retry on when the chosen endpoint cannot be connected to. Default 0: an
	// ORIGINAL_DST cluster (envoy/envoy.yaml, the Istio EnvoyFilter) takes a single
	// ip:port; set it (2 is enough for one dead pod at a time plus a second failure)
	// behind a proxy with Envoy's override_host load-balancing policy
	// (envoy/envoy-fallbacks.yaml; the Helm chart and examples/kubernetes set 2 with it) or the dev gateway,
	// which retry on the next listed endpoint.
	MaxFallbacks int `yaml:"max_fallbacks"`
	// ShedQueueDepth > 0 sheds sheddable requests, as the Gateway API Inference
	// Extension's picker does: a request whose InferenceObjective has a negative priority
	// is answered 429 (with Retry-After) when every endpoint eligible for it has more
	// than this many requests waiting in its queue (vllm:num_requests_waiting, from fresh
	// scrapes). A request of priority 0 or more (no objective, an unknown one) is always
	// routed. 0 never sheds. Default 5 (extproc.DefaultShedWaiting): the Inference
	// Extension's default queue-depth threshold.
	ShedQueueDepth int `yaml:"shed_queue_depth"`
	// RetryAfter is the Retry-After of 429 and 503 answers, in whole seconds (rounded up).
	// Default 1s (extproc.DefaultRetryAfter): one scrape interval, after which the
	// router's view of the queues is new.
	RetryAfter time.Duration `yaml:"retry_after"`
	// Scrape tunes the scraping of each endpoint's /metrics.
	Scrape fleet.ScrapeConfig `yaml:",inline"`
}

// DefaultLimitsConfig returns 16 MiB bodies, a 112 MiB body budget, 4096 connections,
// 16384 streams, a 10s stream idle timeout, a 5s drain delay and a 30s drain, 120ms holds,
// sheddable requests shed past 5 waiting and the scrape defaults.
func DefaultLimitsConfig() LimitsConfig {
	return LimitsConfig{
		MaxBodyBytes:      16 << 20,
		BodyBudgetBytes:   (extproc.ParseCost + extproc.RewriteCost) * (16 << 20),
		MaxConnections:    4096,
		MaxStreams:        16384,
		StreamIdleTimeout: 10 * time.Second,
		DrainTimeout:      30 * time.Second,
		DrainDelay:        5 * time.Second,
		MaxHold:           extproc.DefaultMaxHold,
		ShedQueueDepth:    extproc.DefaultShedWaiting,
		RetryAfter:        extproc.DefaultRetryAfter,
		Scrape:            fleet.DefaultScrapeConfig(),
	}
}

// Validate checks the ranges.
func (c *LimitsConfig) Validate() error {
	var errs field.Errors
	if c.MaxBodyBytes < 1<<10 || c.MaxBodyBytes > 1<<30 {
		errs.Addf("max_body_bytes", "%d is out of range [1 KiB, 1 GiB]", c.MaxBodyBytes)
	}
	if least := int64(c.MaxBodyBytes) * (extproc.ParseCost + extproc.RewriteCost); c.BodyBudgetBytes < least || c.BodyBudgetBytes > 64<<30 {
		errs.Addf("body_budget_bytes", "%d is out of range [%d x max_body_bytes (%d), 64 GiB] (a body of max_body_bytes must fit with its parse and its rewritten copy)",
			c.BodyBudgetBytes, extproc.ParseCost+extproc.RewriteCost, least)
	}
	if c.MaxConnections < 1 || c.MaxConnections > 1<<20 {
		errs.Addf("max_connections", "%d is out of range [1, 1048576]", c.MaxConnections)
	}
	if c.MaxStreams < 1 || c.MaxStreams > 1<<20 {
		errs.Addf("max_streams", "%d is out of range [1, 1048576]", c.MaxStreams)
	}
	if c.StreamIdleTimeout < 100*time.Millisecond || c.StreamIdleTimeout > time.Hour {
		errs.Addf("stream_idle_timeout", "%v is out of range [100ms, 1h]", c.StreamIdleTimeout)
	}
	if c.DrainTimeout < 0 || c.DrainTimeout > time.Hour {
		errs.Addf("drain_timeout", "%v is out of range [0, 1h]", c.DrainTimeout)
	}
	if c.DrainDelay < 0 || c.DrainDelay > time.Minute {
		errs.Addf("drain_delay", "%v is out of range [0, 1m]", c.DrainDelay)
	}
	if c.MaxHold < 0 || c.MaxHold > 500*time.Millisecond {
		errs.Addf("max_hold", "%v is out of range [0, 500ms] (Envoy's ext_proc message_timeout runs while a request is held)", c.MaxHold)
	}
	if c.MaxFallbacks < 0 || c.MaxFallbacks > scoring.MaxFallbacks {
		errs.Addf("max_fallbacks", "%d is out of range [0, %d] (the policies name at most %d)", c.MaxFallbacks, scoring.MaxFallbacks, scoring.MaxFallbacks)
	}
	if c.ShedQueueDepth < 0 || c.ShedQueueDepth > 1_000_000 {
		errs.Addf("shed_queue_depth", "%d is out of range [0, 1000000] (0 never sheds)", c.ShedQueueDepth)
	}
	if c.RetryAfter < time.Second || c.RetryAfter > time.Hour {
		errs.Addf("retry_after", "%v is out of range [1s, 1h] (Retry-After counts whole seconds)", c.RetryAfter)
	}
	errs.Nest("", c.Scrape.Validate())
	return errs.Err()
}
