package kvbench

import (
	"sync"

	"github.com/kvrouter/kvrouter/scoring"
)

// StaticPartition is a reference point, not a router: it gives each prefix (a request's
// first block of tokens, which kvbench makes distinct per prefix) a home server the first
// time it is seen, the server with the fewest homes per KV block of capacity, and sends
// every later request with that prefix there, whatever the load. It is the "perfect
// static partition" the bound assumes, measured in the same simulator. A home that is no
// longer a candidate is reassigned. It is safe for concurrent use.
type StaticPartition struct {
	mu    sync.Mutex
	home  map[uint64]string
	homes map[string]int
}

// NewStaticPartition returns an empty partition.
func NewStaticPartition() *StaticPartition {
	return &StaticPartition{home: map[uint64]string{}, homes: map[string]int{}}
}

// Name returns "partition".
func (*StaticPartition) Name() string { return "partition" }

// Pick returns the prefix's home.
func (p *StaticPartition) Pick(req *scoring.Request, candidates []scoring.Endpoint) (scoring.Decision, error) {
	if len(candidates) == 0 {
		return scoring.Decision{}, scoring.ErrNoCandidates
	}
	key := uint64(14695981039346656037)
	for i, id := range req.TokenIDs {
		if i == 16 {
			break
		}
		key = (key ^ uint64(id)) * 1099511628211
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if h, ok := p.home[key]; ok {
		for _, c := range candidates {
			if c.Address == h {
				return scoring.Decision{Endpoint: h}, nil
			}
		}
		p.homes[h]--
	}
	best, bestLoad := 0, 0.0
	for i, c := range candidates {
		capacity := float64(c.Metrics.NumGPUBlocks)
		if capacity <= 0 {
			capacity = 1
		}
		load := float64(p.homes[c.Address]+1) / capacity
		if i == 0 || load < bestLoad {
			best, bestLoad = i, load
		}
	}
	h := candidates[best].Address
	p.home[key] = h
	p.homes[h]++
	return scoring.Decision{Endpoint: h}, nil
}
