package kvbench

import (
	"encoding/json"
	"io"
	"sync"
)

// RouteLog writes one JSON line per routing event of sim mode: each request routed
// (where, after how long held, and every server's state at that moment), each first
// token (its TTFT) and each finish (its prompt and cached tokens). It is how a run's
// slowest requests, and the requests that lose its cached tokens, are traced to the
// decision that made them. Safe for runs going at once (--parallel): every line names
// its run.
type RouteLog struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error
}

// NewRouteLog returns a RouteLog writing to w.
func NewRouteLog(w io.Writer) *RouteLog { return &RouteLog{enc: json.NewEncoder(w)} }

// Err returns the first write error.
func (l *RouteLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// RouteEvent is one line of a RouteLog.
type RouteEvent struct {
	// Policy, Rep (0-based) and Concurrency (0 for open-loop workloads) name the run.
	Policy      string `json:"policy"`
	Rep         int    `json:"rep"`
	Concurrency int    `json:"concurrency,omitempty"`
	// Event is "route", "first_token" or "finish"; T its virtual time in seconds.
	Event  string  `json:"event"`
	T      float64 `json:"t"`
	Seq    int     `json:"seq"`
	Server int     `json:"server"`
	// Replica is the router replica that routed the request (0-based; --replicas).
	Replica int `json:"replica"`
	// Warmup marks the warmup's requests (not measured).
	Warmup bool `json:"warmup,omitempty"`
	// Prefix is the request's shared prefix (the reference workload's).
	Prefix int `json:"prefix"`
	// Route only: the request's time held at the router, and every server's state as
	// the router routed it.
	HeldMS  float64      `json:"held_ms,omitempty"`
	Servers []ServerView `json:"servers,omitempty"`
	// Route only: the decision's kind, the rule that chose the server
	// (scoring.Decision.Kind; absent for a policy that does not say).
	Kind string `json:"kind,omitempty"`
	// First token only: the request's TTFT as its client sees it.
	TTFTMS float64 `json:"ttft_ms,omitempty"`
	// Finish only: the request's prompt tokens and how many of them the server had
	// cached (absent: 0).
	PromptTokens int `json:"prompt_tokens,omitempty"`
	CachedTokens int `json:"cached_tokens,omitempty"`
}

// ServerView is one server's state at a routing decision: the routing replica's own
// in-flight requests there, the engine's running and waiting requests and KV usage
// now, the waiting requests in the router's last scrape, and the request's leading
// blocks its prefix cache holds now (where the prefix is cached, whatever the routers'
// views of it).
type ServerView struct {
	InFlight       int     `json:"in_flight"`
	Running        int     `json:"running"`
	Waiting        int     `json:"waiting"`
	KVUsage        float64 `json:"kv_usage"`
	ScrapedWaiting int     `json:"scraped_waiting"`
	CachedBlocks   int     `json:"cached_blocks"`
}

func (l *RouteLog) write(ev *RouteEvent) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = l.enc.Encode(ev)
	}
}
