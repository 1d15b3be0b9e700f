package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// Workload is the reference experiment's request stream: N shared prefixes, each request
// one of them (uniformly at random, seeded) followed by a unique tail.
type Workload struct {
	Prefixes [][]uint32
	Requests []WorkloadRequest
}

// WorkloadRequest is one request of a Workload.
type WorkloadRequest struct {
	Prefix int
	Prompt []uint32
}

// Reference workload shape: 2,032 shared + 339 unique tokens = 2,371 prompt tokens.
const (
	RefPrefixTokens = 2032
	RefTailTokens   = 339
)

// NewWorkload builds numRequests requests over n prefixes of prefixLen tokens with tails
// of tailLen tokens. The same seed gives the same requests in the same order.
func NewWorkload(n, numRequests, prefixLen, tailLen int, seed uint64) Workload {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	tok := func() uint32 { return 1000 + uint32(rng.IntN(150000)) }
	w := Workload{Prefixes: make([][]uint32, n)}
	for i := range w.Prefixes {
		p := make([]uint32, prefixLen)
		for j := range p {
			p[j] = tok()
		}
		w.Prefixes[i] = p
	}
	for range numRequests {
		k := rng.IntN(n)
		prompt := make([]uint32, 0, prefixLen+tailLen)
		prompt = append(prompt, w.Prefixes[k]...)
		for range tailLen {
			prompt = append(prompt, tok())
		}
		w.Requests = append(w.Requests, WorkloadRequest{Prefix: k, Prompt: prompt})
	}
	return w
}

// ClosedLoop drives a Workload through a Fleet with Concurrency clients, each sending its
// next request as soon as the previous one ends.
type ClosedLoop struct {
	Concurrency int
	MaxTokens   int
	// Route picks the server for request i.
	Route func(i int, r WorkloadRequest) int
	// RTT is the client's network round trip: a request reaches the server RTT/2 after it
	// is sent, and its tokens reach the client RTT/2 after the server produced them.
	RTT float64
}

// Run sends every request of w and returns the outcomes in request order, with times as
// the client sees them.
func (c ClosedLoop) Run(f *Fleet, w Workload) ([]Outcome, error) {
	out := make([]Outcome, len(w.Requests))
	next := 0
	var err error
	var send func()
	send = func() {
		if next >= len(w.Requests) || err != nil {
			return
		}
		i := next
		next++
		sent := f.Now()
		r := w.Requests[i]
		srv := c.Route(i, r)
		f.After(c.RTT/2, func() {
			if e := f.Submit(srv, fmt.Sprintf("req-%d", i), r.Prompt, c.MaxTokens, func(o Outcome) {
				o.Submitted = sent
				o.FirstToken += c.RTT / 2
				o.Finished += c.RTT / 2
				out[i] = o
				f.After(c.RTT/2, send)
			}); e != nil && err == nil {
				err = e
			}
		})
	}
	for range c.Concurrency {
		send()
	}
	f.Run()
	return out, err
}

// Summary condenses outcomes into the reference experiment's figures.
type Summary struct {
	Requests int
	// CachedRatio is cached prompt tokens over prompt tokens; HitRate the share of
	// requests with any cached token.
	CachedRatio, HitRate float64
	// TTFT percentiles in seconds; Throughput in requests per second over the makespan.
	TTFTP50, TTFTP99 float64
	Throughput       float64
	Makespan         float64
	Preemptions      int
}

// Summarize computes a Summary.
func Summarize(outs []Outcome) Summary {
	s := Summary{Requests: len(outs)}
	if len(outs) == 0 {
		return s
	}
	var cached, prompt, hits int
	ttft := make([]float64, 0, len(outs))
	start, end := outs[0].Submitted, 0.0
	for _, o := range outs {
		cached += o.CachedTokens
		prompt += o.PromptTokens
		if o.CachedTokens > 0 {
			hits++
		}
		ttft = append(ttft, o.TTFT())
		start = min(start, o.Submitted)
		end = max(end, o.Finished)
		s.Preemptions += o.Preemptions
	}
	slices.Sort(ttft)
	s.CachedRatio = float64(cached) / float64(prompt)
	s.HitRate = float64(hits) / float64(len(outs))
	s.TTFTP50 = percentile(ttft, 0.50)
	s.TTFTP99 = percentile(ttft, 0.99)
	s.Makespan = end - start
	if s.Makespan > 0 {
		s.Throughput = float64(len(outs)) / s.Makespan
	}
	return s
}

// percentile interpolates linearly between closest ranks (numpy's default).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	x := p * float64(len(sorted)-1)
	i := int(x)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (x-float64(i))*(sorted[i+1]-sorted[i])
}
