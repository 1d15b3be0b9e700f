package scoring

import (
	"math/rand/v2"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
)

// Approximate is the approximate policy: no KV events; it predicts each endpoint's cache
// from its own routing decisions, with a per-endpoint LRU of block keys sized to the
// endpoint's capacity (Metrics.NumGPUBlocks when scraped, KVConfig.ApproxBlocks
// otherwise), and scores candidates with the same cost as KV. Dynamo's approximate mode
// expires blocks after a fixed TTL with no capacity model, so it keeps predicting hits on
// blocks a small cache has long evicted; sizing the LRU to the cache avoids that.
//
// Approximate implements Observer: it learns only from requests it is told were Routed.
// It is safe for concurrent use.
type Approximate struct {
	core *kvCore
}

// NewApproximate returns an Approximate policy. src breaks ties and samples (nil: seeded
// at random); reg may be nil.
func NewApproximate(cfg KVConfig, src rand.Source, reg prometheus.Registerer) (*Approximate, error) {
	c, err := newKVCore("approximate", cfg, nil, nil, true, src, reg)
	if err != nil {
		return nil, err
	}
	return &Approximate{core: c}, nil
}

// Name returns "approximate".
func (*Approximate) Name() string { return "approximate" }

// Pick returns the candidate of lowest cost given its predicted cache.
func (p *Approximate) Pick(req *Request, candidates []Endpoint) (Decision, error) {
	return p.core.pick(req, candidates)
}

// Routed records the request's blocks as cached on endpoint and its load as on it.
func (p *Approximate) Routed(req *Request, endpoint string) { p.core.routed(req, endpoint) }

// Moved moves the request's load to endpoint and predicts its blocks cached there.
func (p *Approximate) Moved(reqID, endpoint string) { p.core.moved(reqID, endpoint) }

// FirstToken releases the request's prefill load.
func (p *Approximate) FirstToken(reqID string) { p.core.firstToken(reqID) }

// Finished releases the request's remaining load; its blocks stay in the prediction.
func (p *Approximate) Finished(reqID string) { p.core.finished(reqID) }

// Forget drops everything known of an endpoint that left the fleet.
func (p *Approximate) Forget(endpoint string) { p.core.forget(endpoint) }

// blockLRU is a predicted cache: block keys in least-recently-used order, at most cap of
// them, over golang-lru's non-thread-safe core (the kv policy's lock guards it). Not safe
// for concurrent use.
type blockLRU struct {
	cap int
	lru *simplelru.LRU[uint64, struct{}]
}

func newBlockLRU(capacity int) *blockLRU {
	// NewLRU fails only for a size <= 0, which max rules out.
	l, _ := simplelru.NewLRU[uint64, struct{}](max(capacity, 1), nil)
	return &blockLRU{cap: capacity, lru: l}
}

// leading returns how many of keys' leading blocks are predicted cached (without
// touching them).
func (l *blockLRU) leading(keys []uint64) int {
	for i, k := range keys {
		if !l.lru.Contains(k) {
			return i
		}
	}
	return len(keys)
}

// add records keys as just used. They are touched last to first, as vLLM frees a finished
// request's blocks tail first: the prefix, shared by more requests, is evicted last.
func (l *blockLRU) add(keys []uint64) {
	for i := len(keys) - 1; i >= 0; i-- {
		l.lru.Add(keys[i], struct{}{})
	}
}

// resize sets the capacity, evicting the oldest keys past it.
func (l *blockLRU) resize(capacity int) {
	l.cap = capacity
	l.lru.Resize(max(capacity, 1))
}
