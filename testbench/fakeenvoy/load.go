package fakeenvoy

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/internal/cputime"
)

// LoadConfig describes an open-loop load run: Requests exchanges started at Rate per
// second whatever the latency, each a full Envoy exchange (request through the filter,
// an empty 200 response, close).
type LoadConfig struct {
	Rate     float64 // exchanges started per second (per client in Compare)
	Requests int     // exchanges in all (per client in Compare)
	Config   Config  // the filter configuration
	Request  Request // sent on every exchange, unless Next is set
	// Next, when set, gives the request of exchange i (0 <= i < Requests); in Compare
	// every client gets the same request i.
	Next func(i int) Request
}

// LoadResult summarises a load run. P50/P99/Max are the request phase, from opening the
// stream to the last request reply (decision and body back from the router); Decision*
// are Exchange.DecisionLatency, from the last request message sent to the decision reply.
type LoadResult struct {
	Sent, Errors                          int
	P50, P99, Max                         time.Duration
	DecisionP50, DecisionP99, DecisionMax time.Duration
	Elapsed                               time.Duration
	Destinations                          map[string]int
	FirstError                            error
	AchievedRatePerS                      float64
	// Latencies and DecisionLatencies are the request phase and the decision wait of each
	// exchange, by index (0 <= i < Sent), 0 where it failed. In Compare, index i of two
	// results is the same request sent at the same tick, so their differences pair up.
	Latencies, DecisionLatencies []time.Duration
	// CPUPerExchange is the whole process's CPU time (user + system) during the run, divided by
	// the exchanges of every client: fake Envoy, gRPC client and, when in-process, the
	// servers too. Zero where getrusage is unavailable.
	CPUPerExchange time.Duration
}

// String formats the result on one line.
func (r LoadResult) String() string {
	return fmt.Sprintf("sent=%d errors=%d rate=%.0f/s request p50=%v p99=%v max=%v decision p50=%v p99=%v max=%v cpu/exchange=%v",
		r.Sent, r.Errors, r.AchievedRatePerS, r.P50, r.P99, r.Max, r.DecisionP50, r.DecisionP99, r.DecisionMax, r.CPUPerExchange)
}

// Load runs cfg against client and reports the latency distribution.
func Load(ctx context.Context, client extprocv3.ExternalProcessorClient, cfg LoadConfig) LoadResult {
	return Compare(ctx, []extprocv3.ExternalProcessorClient{client}, cfg)[0]
}

// Compare runs cfg against every client in the same run: at each tick it starts one
// exchange on each client (rotating which goes first), so that all of them see the same
// rate, the same requests and the same machine load. It returns one result per client.
func Compare(ctx context.Context, clients []extprocv3.ExternalProcessorClient, cfg LoadConfig) []LoadResult {
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	type acc struct {
		mu  sync.Mutex
		res LoadResult
	}
	accs := make([]*acc, len(clients))
	for i := range accs {
		accs[i] = &acc{res: LoadResult{Destinations: map[string]int{},
			Latencies: make([]time.Duration, cfg.Requests), DecisionLatencies: make([]time.Duration, cfg.Requests)}}
	}
	var wg sync.WaitGroup
	one := func(a *acc, client extprocv3.ExternalProcessorClient, i int, req Request) {
		t0 := time.Now()
		x, err := Start(ctx, client, cfg.Config)
		var dest string
		if err == nil {
			var rr *RequestResult
			rr, err = x.Request(req)
			lat := time.Since(t0)
			if err == nil && rr.Immediate != nil {
				err = fmt.Errorf("fakeenvoy: immediate response %d", rr.Immediate.GetStatus().GetCode())
			}
			if err == nil {
				dest, _ = rr.Headers.Get(epp.HeaderDestination)
				_, err = x.Response(200, nil, nil, nil, nil)
			}
			if cerr := x.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				a.mu.Lock()
				a.res.Latencies[i], a.res.DecisionLatencies[i] = lat, x.DecisionLatency()
				a.mu.Unlock()
			}
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.res.Sent++
		if err != nil {
			a.res.Errors++
			if a.res.FirstError == nil {
				a.res.FirstError = err
			}
		} else {
			a.res.Destinations[dest]++
		}
	}
	cpu0 := cputime.Process()
	start := time.Now()
	next := start
	for i := 0; i < cfg.Requests && ctx.Err() == nil; i++ {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		req := cfg.Request
		if cfg.Next != nil {
			req = cfg.Next(i)
		}
		for k := range clients {
			c := (i + k) % len(clients)
			wg.Go(func() { one(accs[c], clients[c], i, req) })
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cputime.Process() - cpu0
	out := make([]LoadResult, len(clients))
	total := 0
	for _, a := range accs {
		total += a.res.Sent
	}
	for i, a := range accs {
		r := a.res
		r.Elapsed = elapsed
		r.AchievedRatePerS = float64(r.Sent) / elapsed.Seconds()
		r.Latencies, r.DecisionLatencies = r.Latencies[:r.Sent], r.DecisionLatencies[:r.Sent]
		var lats, decs []time.Duration
		for i, l := range r.Latencies {
			if l > 0 {
				lats, decs = append(lats, l), append(decs, r.DecisionLatencies[i])
			}
		}
		r.P50, r.P99, r.Max = quantiles(lats)
		r.DecisionP50, r.DecisionP99, r.DecisionMax = quantiles(decs)
		if total > 0 && cpu > 0 {
			r.CPUPerExchange = cpu / time.Duration(total)
		}
		out[i] = r
	}
	return out
}

// Added pairs the exchanges of two results of one Compare run (same request, same tick)
// and returns the quantiles of r's latency minus base's, request phase and decision wait:
// what r adds to each request. Machine stalls that delay both cancel out.
func (r LoadResult) Added(base LoadResult) (p50, p99, decisionP50, decisionP99 time.Duration) {
	var d, dd []time.Duration
	for i := range min(len(r.Latencies), len(base.Latencies)) {
		if r.Latencies[i] > 0 && base.Latencies[i] > 0 {
			d = append(d, r.Latencies[i]-base.Latencies[i])
			dd = append(dd, r.DecisionLatencies[i]-base.DecisionLatencies[i])
		}
	}
	p50, p99, _ = quantiles(d)
	decisionP50, decisionP99, _ = quantiles(dd)
	return p50, p99, decisionP50, decisionP99
}

func quantiles(d []time.Duration) (p50, p99, max time.Duration) {
	slices.Sort(d)
	n := len(d)
	if n == 0 {
		return 0, 0, 0
	}
	return d[n/2], d[min(n-1, n*99/100)], d[n-1]
}
