package scoring_test

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/scoring"
)

func kvRandTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = rng.Uint32N(150_000)
	}
	return t
}

// kvBench is BenchmarkKVPick's setup over n endpoints: the real index where every
// endpoint holds 8 of 24 shared 2,032-token prefixes and 50k blocks in all, 4 requests
// in flight on each, and a reference-workload request (2,371 tokens: prefix 0 + a unique
// tail).
func kvBench(b *testing.B, n int) (*scoring.KV, []scoring.Endpoint, []uint32) {
	rng := rand.New(rand.NewPCG(5, 6))
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	root := index.Root("m", "", "")
	prefixes := make([][]uint32, 24)
	for i := range prefixes {
		prefixes[i] = kvRandTokens(rng, 2032)
	}
	p, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, nil, rand.NewPCG(1, 2), nil)
	if err != nil {
		b.Fatal(err)
	}
	eps := make([]scoring.Endpoint, n)
	handle := uint64(1)
	for e := range eps {
		eps[e].Address = fmt.Sprintf("10.0.0.%d:8000", e)
		stored := 0
		for j := 0; stored < 50_000; j++ {
			toks := kvRandTokens(rng, 2371)
			if j < 8 {
				copy(toks, prefixes[rng.IntN(len(prefixes))])
			}
			nb := len(toks) / 16
			hs := make([]uint64, nb)
			for i := range hs {
				hs[i] = handle
				handle++
			}
			if err := ix.Store(eps[e].Address, 0, index.Blocks{Root: root, Handles: hs,
				Tokens: toks[:nb*16], BlockSize: 16}); err != nil {
				b.Fatal(err)
			}
			stored += nb
		}
		for j := range 4 {
			r := &scoring.Request{ID: fmt.Sprint(e, "/", j), Model: "m",
				TokenIDs: append(append([]uint32{}, prefixes[rng.IntN(24)]...), kvRandTokens(rng, 339)...)}
			p.Routed(r, eps[e].Address)
			p.FirstToken(r.ID)
		}
	}
	return p, eps, append(append([]uint32{}, prefixes[0]...), kvRandTokens(rng, 339)...)
}

// BenchmarkKVPick picks among n endpoints for a reference-workload request with the
// real index (see kvBench).
func BenchmarkKVPick(b *testing.B) {
	for _, n := range []int{6, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			p, eps, toks := kvBench(b, n)
			req := &scoring.Request{ID: "bench", Model: "m", TokenIDs: toks}
			b.ReportAllocs()
			cpu := kvCPUTime()
			b.ResetTimer()
			for b.Loop() {
				if _, err := p.Pick(req, eps); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((kvCPUTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkKVRequest is a request's whole life in the kv policy, as the router drives
// it: Pick, Routed to the chosen endpoint, FirstToken, Finished (see kvBench).
func BenchmarkKVRequest(b *testing.B) {
	for _, n := range []int{6, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			p, eps, toks := kvBench(b, n)
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = fmt.Sprint("bench-", i)
			}
			b.ReportAllocs()
			cpu := kvCPUTime()
			b.ResetTimer()
			i := 0
			for b.Loop() {
				req := &scoring.Request{ID: ids[i%len(ids)], Model: "m", TokenIDs: toks}
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
		})
	}
}

// cpuTime is the process's CPU time: on a shared machine wall time also counts the time
// other processes held the core.
func kvCPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
