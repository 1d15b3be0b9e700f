package scoring_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/kvrouter/scoring"
)

// BenchmarkApproximateRequest is a request's whole life in the approximate policy (the
// predicted caches' LRUs are the hot part): reference-workload requests, one of 24
// shared 2,032-token prefixes plus a 339-token tail, over 6 endpoints of 585 blocks
// (the reference fleet's 1 GiB servers), so the LRUs evict all the time.
func BenchmarkApproximateRequest(b *testing.B) {
	p, err := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(1, 2), nil)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	prefixes := make([][]uint32, 24)
	for i := range prefixes {
		prefixes[i] = kvRandTokens(rng, 2032)
	}
	eps := make([]scoring.Endpoint, 6)
	for i := range eps {
		eps[i] = scoring.Endpoint{Address: fmt.Sprintf("10.0.0.%d:8000", i+1),
			Metrics: scoring.Metrics{Valid: true, NumGPUBlocks: 585, BlockSize: 16}}
	}
	reqs := make([]*scoring.Request, 256)
	for i := range reqs {
		reqs[i] = &scoring.Request{ID: fmt.Sprint("bench-", i), Model: "m",
			TokenIDs: append(append([]uint32{}, prefixes[rng.IntN(24)]...), kvRandTokens(rng, 339)...)}
	}
	b.ReportAllocs()
	cpu := kvCPUTime()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		req := reqs[i%len(reqs)]
		i++
		d, err := p.Pick(req, eps)
		if err != nil {
			b.Fatal(err)
		}
		p.Routed(req, d.Endpoint)
		p.FirstToken(req.ID)
		p.Finished(req.ID)
	}
	b.ReportMetric(float64((kvCPUTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
