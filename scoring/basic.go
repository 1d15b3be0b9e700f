package scoring

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// Random picks a candidate uniformly at random from an injected source.
type Random struct {
	mu  sync.Mutex
	rng *rand.Rand
}

// NewRandom returns a Random policy drawing from src (for instance rand.NewPCG(seed1,
// seed2)). src need not be safe for concurrent use: Random serialises access to it.
func NewRandom(src rand.Source) *Random {
	return &Random{rng: rand.New(src)}
}

// Name returns "random".
func (*Random) Name() string { return "random" }

// Pick returns a uniformly random candidate.
func (p *Random) Pick(_ *Request, candidates []Endpoint) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	p.mu.Lock()
	i := p.rng.IntN(len(candidates))
	p.mu.Unlock()
	return Decision{Endpoint: candidates[i].Address, Kind: KindRandom}, nil
}

// RoundRobin cycles through the candidates with one counter shared by all requests, so
// with a stable candidate list consecutive requests go to consecutive endpoints.
type RoundRobin struct {
	next atomic.Uint64
}

// NewRoundRobin returns a RoundRobin policy starting at the first candidate.
func NewRoundRobin() *RoundRobin { return &RoundRobin{} }

// Name returns "round-robin".
func (*RoundRobin) Name() string { return "round-robin" }

// Pick returns the next candidate in turn.
func (p *RoundRobin) Pick(_ *Request, candidates []Endpoint) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	n := p.next.Add(1) - 1
	return Decision{Endpoint: candidates[n%uint64(len(candidates))].Address, Kind: KindTurn}, nil
}

// LeastLoad picks the candidate with the least load, where load is the router's own
// in-flight count plus, when the endpoint's scraped metrics are valid, vLLM's running and
// waiting requests. Ties go to the lower KV-cache usage (valid metrics only; unknown
// usage counts as full), then to the earlier candidate: the rule is stable, so equal
// endpoints are chosen in candidate order as their in-flight counts rise.
type LeastLoad struct{}

// NewLeastLoad returns a LeastLoad policy. It holds no state.
func NewLeastLoad() *LeastLoad { return &LeastLoad{} }

// Name returns "least-load".
func (*LeastLoad) Name() string { return "least-load" }

// Load is the load LeastLoad assigns to e.
func Load(e *Endpoint) int {
	l := e.InFlight
	if e.Metrics.Valid {
		l += e.Metrics.Running + e.Metrics.Waiting
	}
	return l
}

func kvUsage(e *Endpoint) float64 {
	if e.Metrics.Valid {
		return e.Metrics.KVCacheUsage
	}
	return 1
}

// Pick returns the least-loaded candidate.
func (*LeastLoad) Pick(_ *Request, candidates []Endpoint) (Decision, error) {
	if len(candidates) == 0 {
		return Decision{}, ErrNoCandidates
	}
	best := 0
	bestLoad, bestKV := Load(&candidates[0]), kvUsage(&candidates[0])
	for i := 1; i < len(candidates); i++ {
		l := Load(&candidates[i])
		if l > bestLoad {
			continue
		}
		kv := kvUsage(&candidates[i])
		if l < bestLoad || kv < bestKV {
			best, bestLoad, bestKV = i, l, kv
		}
	}
	return Decision{Endpoint: candidates[best].Address, Kind: KindLoad}, nil
}
