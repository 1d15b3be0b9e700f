package envoytest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// LoadConfig describes an open-loop load run: Requests exchanges started at Rate per
// second whatever the latency, each a full Envoy exchange (request through the filter,
// an empty 200 response, close).
type LoadConfig struct {
	Rate     float64 // exchanges started per second
	Requests int     // exchanges in all
	Config   Config  // the filter configuration
	Request  Request // sent on every exchange
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
}

// String formats the result on one line.
func (r LoadResult) String() string {
	return fmt.Sprintf("sent=%d errors=%d rate=%.0f/s request p50=%v p99=%v max=%v decision p50=%v p99=%v max=%v",
		r.Sent, r.Errors, r.AchievedRatePerS, r.P50, r.P99, r.Max, r.DecisionP50, r.DecisionP99, r.DecisionMax)
}

// Load runs cfg against client and reports the latency distribution.
func Load(ctx context.Context, client extprocv3.ExternalProcessorClient, cfg LoadConfig) LoadResult {
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	var (
		mu    sync.Mutex
		lats  []time.Duration
		decs  []time.Duration
		res   = LoadResult{Destinations: map[string]int{}}
		wg    sync.WaitGroup
		start = time.Now()
	)
	one := func() {
		t0 := time.Now()
		x, err := Start(ctx, client, cfg.Config)
		var dest string
		if err == nil {
			var rr *RequestResult
			rr, err = x.Request(cfg.Request)
			lat := time.Since(t0)
			if err == nil && rr.Immediate != nil {
				err = fmt.Errorf("envoytest: immediate response %d", rr.Immediate.GetStatus().GetCode())
			}
			if err == nil {
				dest, _ = rr.Headers.Get("x-gateway-destination-endpoint")
				_, err = x.Response(200, nil, nil, nil, nil)
			}
			if cerr := x.Close(); err == nil {
				err = cerr
			}
			mu.Lock()
			lats = append(lats, lat)
			decs = append(decs, x.DecisionLatency())
			mu.Unlock()
		}
		mu.Lock()
		defer mu.Unlock()
		res.Sent++
		if err != nil {
			res.Errors++
			if res.FirstError == nil {
				res.FirstError = err
			}
		} else {
			res.Destinations[dest]++
		}
	}
	next := start
	for i := 0; i < cfg.Requests && ctx.Err() == nil; i++ {
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
		next = next.Add(interval)
		wg.Go(one)
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.AchievedRatePerS = float64(res.Sent) / res.Elapsed.Seconds()
	res.P50, res.P99, res.Max = quantiles(lats)
	res.DecisionP50, res.DecisionP99, res.DecisionMax = quantiles(decs)
	return res
}

func quantiles(d []time.Duration) (p50, p99, max time.Duration) {
	slices.Sort(d)
	n := len(d)
	if n == 0 {
		return 0, 0, 0
	}
	return d[n/2], d[min(n-1, n*99/100)], d[n-1]
}
