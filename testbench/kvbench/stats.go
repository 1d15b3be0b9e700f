package kvbench

import (
	"math"
	"sort"
	"time"
)

// Result is what one request produced.
type Result struct {
	Seq    int
	Prefix int
	Warmup bool
	// Start is when the request was sent, End when its response ended, both measured from
	// the start of the run (wall clock in URL mode, virtual clock in sim mode).
	Start time.Duration
	End   time.Duration
	// TTFT is the time from Start to the first generated token.
	TTFT time.Duration
	// PromptTokens and CachedTokens come from the response's usage.
	PromptTokens int
	CachedTokens int
	OutputTokens int
	// Server is the endpoint that served the request ("" when unknown).
	Server string
	// Decision is the router's decision latency (0 when not measured: URL mode).
	Decision time.Duration
	// Err is non-empty when the request failed; Rejected when the server refused it as
	// invalid (vLLM's 400, e.g. longer than max_model_len).
	Err      string
	Rejected bool
}

// Summary holds the figures of one run, or the medians of several.
type Summary struct {
	// Requests counts measured requests, Errors the failed ones among them.
	Requests int `json:"requests"`
	Errors   int `json:"errors"`
	// HitAny is the share of successful requests with any cached token; HitFull those whose
	// whole shared prefix (its full blocks) was cached.
	HitAny  float64 `json:"hit_any"`
	HitFull float64 `json:"hit_full"`
	// CachedRatio is cached prompt tokens over prompt tokens.
	CachedRatio float64 `json:"cached_ratio"`
	TTFTP50Ms   float64 `json:"ttft_p50_ms"`
	TTFTP99Ms   float64 `json:"ttft_p99_ms"`
	// Throughput is measured requests per second of the measured window.
	Throughput float64 `json:"requests_per_s"`
	// ServersPerPrefix is the mean over prefixes of the distinct servers that served one;
	// nil when the served endpoint was not reported.
	ServersPerPrefix *float64 `json:"servers_per_prefix"`
	// DecisionP50Us and DecisionP99Us are the router's decision latency; nil when not
	// measured.
	DecisionP50Us *float64 `json:"decision_p50_us"`
	DecisionP99Us *float64 `json:"decision_p99_us"`
	// EngineHitRate is the engines' own prefix-cache hit rate over the measured window
	// (hit tokens / queried tokens); nil when unknown.
	EngineHitRate *float64 `json:"engine_hit_rate"`
	// SyncMessagesPerRequest and SyncBytesPerRequest are the router replicas' state
	// sync cost (sim mode, SimConfig.Sync): snapshots published, and bytes delivered to
	// peers, per routed request over the whole run; nil without sync.
	SyncMessagesPerRequest *float64 `json:"sync_messages_per_request,omitempty"`
	SyncBytesPerRequest    *float64 `json:"sync_bytes_per_request,omitempty"`
	// DecodeMs is the mean time from a successful request's first token to its end, and
	// DecodeSharing the mean number of other requests on its server during that time
	// (each weighted by the share of the decode it overlaps, warmup requests included):
	// what decode steps shared with other requests cost (an engine's step time grows
	// with its batch). Nil when the served endpoint was not reported.
	DecodeMs      *float64 `json:"decode_ms,omitempty"`
	DecodeSharing *float64 `json:"decode_sharing,omitempty"`
	// BoundCachedRatio and BoundHitRate are the cell's theoretical bounds (see Bound).
	BoundCachedRatio float64 `json:"bound_cached_ratio"`
	BoundHitRate     float64 `json:"bound_hit_rate"`
	// DurationS is the measured window, seconds.
	DurationS float64 `json:"duration_s"`
	// FirstError is the first failed request's error, empty when none failed.
	FirstError string `json:"first_error,omitempty"`
}

// Bound is the best a router can do for a cell: prefixes partitioned across servers with
// no overlap, each server holding capacity_requests = blocks x blockSize / (P+T) prompts.
type Bound struct {
	// CapacityRequests is the fleet's total capacity in prompts (sum over servers).
	CapacityRequests float64
	// HitRate is min(1, capacity / N); CachedRatio is P/(P+T) x HitRate.
	HitRate     float64
	CachedRatio float64
}

// ComputeBound returns the bound for N prefixes of P tokens with T-token tails on servers
// holding blocksPerServer[i] blocks of blockSize tokens each.
func ComputeBound(blocksPerServer []int, blockSize, prefixes, prefixTokens, tailTokens int) Bound {
	prompt := float64(prefixTokens + tailTokens)
	capacity := 0.0
	for _, b := range blocksPerServer {
		capacity += float64(b*blockSize) / prompt
	}
	hit := math.Min(1, capacity/float64(prefixes))
	return Bound{
		CapacityRequests: capacity,
		HitRate:          hit,
		CachedRatio:      float64(prefixTokens) / prompt * hit,
	}
}

// Percentile returns the p-th percentile (0..100) of xs by linear interpolation between
// closest ranks; NaN for no values. xs is sorted in place.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	if len(xs) == 1 {
		return xs[0]
	}
	rank := p / 100 * float64(len(xs)-1)
	lo := int(math.Floor(rank))
	if lo >= len(xs)-1 {
		return xs[len(xs)-1]
	}
	frac := rank - float64(lo)
	return xs[lo] + frac*(xs[lo+1]-xs[lo])
}

// SummaryInput is what Summarize needs besides the results.
type SummaryInput struct {
	// PrefixTokens and BlockSize set the hit_full threshold: the prefix's full blocks.
	PrefixTokens int
	BlockSize    int
	Bound        Bound
	// EngineHitRate is the engines' figure when known.
	EngineHitRate *float64
	// SyncMessages and SyncBytes are the run's replica sync traffic (0: none).
	SyncMessages, SyncBytes int
}

// Summarize computes a run's figures from its results; warmup results are ignored.
func Summarize(results []Result, in SummaryInput) Summary {
	var s Summary
	full := 0
	if in.BlockSize > 0 {
		full = in.PrefixTokens / in.BlockSize * in.BlockSize
	}
	var ttft, decision []float64
	var prompt, cached, hitAny, hitFull int
	var first, last time.Duration
	started := false
	servers := map[int]map[string]bool{}
	serversKnown := false
	for i := range results {
		r := &results[i]
		if r.Warmup {
			continue
		}
		s.Requests++
		if !started || r.Start < first {
			first = r.Start
		}
		if !started || r.End > last {
			last = r.End
		}
		started = true
		if r.Err != "" {
			if s.Errors == 0 {
				s.FirstError = r.Err
			}
			s.Errors++
			continue
		}
		prompt += r.PromptTokens
		cached += r.CachedTokens
		if r.CachedTokens > 0 {
			hitAny++
		}
		if full > 0 && r.CachedTokens >= full {
			hitFull++
		}
		ttft = append(ttft, float64(r.TTFT)/float64(time.Millisecond))
		if r.Decision > 0 {
			decision = append(decision, float64(r.Decision)/float64(time.Microsecond))
		}
		if r.Server != "" {
			serversKnown = true
			if servers[r.Prefix] == nil {
				servers[r.Prefix] = map[string]bool{}
			}
			servers[r.Prefix][r.Server] = true
		}
	}
	ok := s.Requests - s.Errors
	if ok > 0 {
		s.HitAny = float64(hitAny) / float64(ok)
		s.HitFull = float64(hitFull) / float64(ok)
	}
	if prompt > 0 {
		s.CachedRatio = float64(cached) / float64(prompt)
	}
	s.TTFTP50Ms = zeroNaN(Percentile(ttft, 50))
	s.TTFTP99Ms = zeroNaN(Percentile(ttft, 99))
	if d := last - first; d > 0 {
		s.DurationS = d.Seconds()
		s.Throughput = float64(ok) / d.Seconds()
	}
	if serversKnown {
		sum := 0
		for _, m := range servers {
			sum += len(m)
		}
		v := float64(sum) / float64(len(servers))
		s.ServersPerPrefix = &v
	}
	if len(decision) > 0 {
		p50, p99 := Percentile(decision, 50), Percentile(decision, 99)
		s.DecisionP50Us, s.DecisionP99Us = &p50, &p99
	}
	s.DecodeMs, s.DecodeSharing = decodeSharing(results)
	s.EngineHitRate = in.EngineHitRate
	if in.SyncMessages > 0 && len(results) > 0 {
		m, b := float64(in.SyncMessages)/float64(len(results)), float64(in.SyncBytes)/float64(len(results))
		s.SyncMessagesPerRequest, s.SyncBytesPerRequest = &m, &b
	}
	s.BoundCachedRatio = in.Bound.CachedRatio
	s.BoundHitRate = in.Bound.HitRate
	return s
}

// decodeSharing returns the mean decode time of the successful measured requests, ms,
// and the mean number of other requests on the same server during it (each weighted by
// the share of the decode it overlaps); nil, nil when no such request reports its server.
func decodeSharing(results []Result) (decodeMs, sharing *float64) {
	byServer := map[string][]int{}
	for i := range results {
		r := &results[i]
		if r.Err == "" && r.Server != "" && r.End > r.Start {
			byServer[r.Server] = append(byServer[r.Server], i)
		}
	}
	var n int
	var dec, shared float64
	// In the results' order, not the map's: float sums in another order differ in their
	// last digits, and two runs of the same code must write the same JSON.
	for i := range results {
		r := &results[i]
		from := r.Start + r.TTFT
		if r.Err != "" || r.Server == "" || r.Warmup || r.TTFT <= 0 || r.End <= from {
			continue
		}
		d := r.End - from
		n++
		dec += float64(d) / float64(time.Millisecond)
		for _, j := range byServer[r.Server] {
			if j == i {
				continue
			}
			q := &results[j]
			if ov := min(r.End, q.End) - max(from, q.Start); ov > 0 {
				shared += float64(ov) / float64(d)
			}
		}
	}
	if n == 0 {
		return nil, nil
	}
	dm, sh := dec/float64(n), shared/float64(n)
	return &dm, &sh
}

func zeroNaN(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return x
}

// Median returns the figure-by-figure median of several runs' summaries (each figure on
// its own, as the reference reports). Optional figures are the median of the runs that
// have them. Errors are summed, not medianed: one failed request in any run shows.
func Median(runs []Summary) Summary {
	if len(runs) == 0 {
		return Summary{}
	}
	med := func(f func(Summary) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		return Percentile(xs, 50)
	}
	medOpt := func(f func(Summary) *float64) *float64 {
		var xs []float64
		for _, r := range runs {
			if v := f(r); v != nil {
				xs = append(xs, *v)
			}
		}
		if len(xs) == 0 {
			return nil
		}
		v := Percentile(xs, 50)
		return &v
	}
	errs, firstErr := 0, ""
	for _, r := range runs {
		errs += r.Errors
		if firstErr == "" {
			firstErr = r.FirstError
		}
	}
	return Summary{
		Requests:               int(math.Round(med(func(s Summary) float64 { return float64(s.Requests) }))),
		Errors:                 errs,
		HitAny:                 med(func(s Summary) float64 { return s.HitAny }),
		HitFull:                med(func(s Summary) float64 { return s.HitFull }),
		CachedRatio:            med(func(s Summary) float64 { return s.CachedRatio }),
		TTFTP50Ms:              med(func(s Summary) float64 { return s.TTFTP50Ms }),
		TTFTP99Ms:              med(func(s Summary) float64 { return s.TTFTP99Ms }),
		Throughput:             med(func(s Summary) float64 { return s.Throughput }),
		ServersPerPrefix:       medOpt(func(s Summary) *float64 { return s.ServersPerPrefix }),
		DecisionP50Us:          medOpt(func(s Summary) *float64 { return s.DecisionP50Us }),
		DecisionP99Us:          medOpt(func(s Summary) *float64 { return s.DecisionP99Us }),
		DecodeMs:               medOpt(func(s Summary) *float64 { return s.DecodeMs }),
		DecodeSharing:          medOpt(func(s Summary) *float64 { return s.DecodeSharing }),
		EngineHitRate:          medOpt(func(s Summary) *float64 { return s.EngineHitRate }),
		SyncMessagesPerRequest: medOpt(func(s Summary) *float64 { return s.SyncMessagesPerRequest }),
		SyncBytesPerRequest:    medOpt(func(s Summary) *float64 { return s.SyncBytesPerRequest }),
		BoundCachedRatio:       med(func(s Summary) float64 { return s.BoundCachedRatio }),
		BoundHitRate:           med(func(s Summary) float64 { return s.BoundHitRate }),
		DurationS:              med(func(s Summary) float64 { return s.DurationS }),
		FirstError:             firstErr,
	}
}
