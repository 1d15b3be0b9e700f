package scoring

import (
	"errors"
	"math/rand/v2"

	"github.com/prometheus/client_golang/prometheus"
)

// PrefixIndex is what the kv policy needs of the block index (*index.Index satisfies it):
// for each endpoint, how many of keys' leading blocks it holds, written to dst (reused
// when large enough) and returned.
type PrefixIndex interface {
	LeadingBlocks(keys []uint64, endpoints []string, dst []int) []int
}

// EventHealth reports whether an endpoint's KV events are flowing (subscribed, in
// sequence, recently heard from), so that the index's view of it can be trusted.
type EventHealth interface {
	EventsHealthy(endpoint string) bool
}

// KV is the kv policy: each candidate's overlap (leading cached blocks) comes from the
// event-fed index and is weighed against its load with the cost documented on KVConfig,
// lowest wins. A candidate whose events are not healthy is scored by the approximate
// prediction (see Approximate), which KV keeps for every endpoint from its own routing
// decisions. A request without token ids is scored by load alone and counted.
//
// KV implements Observer: prefill load is released at FirstToken, the rest at Finished.
// It is safe for concurrent use.
type KV struct {
	core *kvCore
}

// NewKV returns a KV policy over ix. health may be nil (every endpoint's events are then
// trusted and no prediction is kept). src breaks ties and samples (nil: seeded at
// random); reg may be nil.
func NewKV(cfg KVConfig, ix PrefixIndex, health EventHealth, src rand.Source, reg prometheus.Registerer) (*KV, error) {
	if ix == nil {
		return nil, errors.New("scoring: kv policy needs an index")
	}
	c, err := newKVCore("kv", cfg, ix, health, health != nil, src, reg)
	if err != nil {
		return nil, err
	}
	return &KV{core: c}, nil
}

// Name returns "kv".
func (*KV) Name() string { return "kv" }

// Pick returns the candidate of lowest cost; Fallbacks are up to four others by rising
// cost. Scores is nil: Explain gives every candidate's cost terms.
func (p *KV) Pick(req *Request, candidates []Endpoint) (Decision, error) {
	return p.core.pick(req, candidates)
}

// Routed adds the request's load to endpoint.
func (p *KV) Routed(req *Request, endpoint string) { p.core.routed(req, endpoint) }

// Moved moves the request's load and its blocks in flight to endpoint.
func (p *KV) Moved(reqID, endpoint string) { p.core.moved(reqID, endpoint) }

// FirstToken releases the request's prefill load.
func (p *KV) FirstToken(reqID string) { p.core.firstToken(reqID) }

// Finished releases the request's remaining load.
func (p *KV) Finished(reqID string) { p.core.finished(reqID) }

// Forget drops everything known of an endpoint that left the fleet.
func (p *KV) Forget(endpoint string) { p.core.forget(endpoint) }

// EventHealthSnapshot may be implemented by an EventHealth that can answer for a whole
// candidate list from one view of the events' status: the kv policy then asks once per
// pick instead of once per candidate.
type EventHealthSnapshot interface {
	// EventsHealthyAll sets healthy[i] to EventsHealthy(candidates[i].Address);
	// len(healthy) == len(candidates).
	EventsHealthyAll(candidates []Endpoint, healthy []bool)
}
