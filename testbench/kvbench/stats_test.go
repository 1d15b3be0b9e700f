package kvbench

import (
	"math"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPercentile(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		p    float64
		want float64
	}{
		{"one value", []float64{7}, 99, 7},
		{"median of odd", []float64{3, 1, 2}, 50, 2},
		{"median of even", []float64{4, 1, 3, 2}, 50, 2.5},
		{"p99 interpolates", []float64{0, 100}, 99, 99},
		{"p100 is max", []float64{5, 9, 1}, 100, 9},
		{"p0 is min", []float64{5, 9, 1}, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.xs, tt.p); !near(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("percentile of nothing is not NaN")
	}
}

func TestComputeBound(t *testing.T) {
	six := []int{585, 585, 585, 585, 585, 585}
	tests := []struct {
		name       string
		prefixes   int
		wantHit    float64
		wantCached float64
	}{
		{"N=2 fits", 2, 1, 2032.0 / 2371},
		{"N=7 fits", 7, 1, 2032.0 / 2371},
		{"N=24 does not", 24, 6 * 585 * 16 / 2371.0 / 24, 2032.0 / 2371 * 6 * 585 * 16 / 2371.0 / 24},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := ComputeBound(six, 16, tt.prefixes, 2032, 339)
			if !near(b.HitRate, tt.wantHit) || !near(b.CachedRatio, tt.wantCached) {
				t.Errorf("got %+v, want hit %v cached %v", b, tt.wantHit, tt.wantCached)
			}
		})
	}
	// The reference's figures: 3.95 requests per server, a 99% bound at N=24.
	b := ComputeBound([]int{585}, 16, 1, 2032, 339)
	if math.Abs(b.CapacityRequests-3.95) > 0.005 {
		t.Errorf("capacity per server %v, want 3.95", b.CapacityRequests)
	}
	if got := ComputeBound(six, 16, 24, 2032, 339).HitRate; math.Round(got*100) != 99 {
		t.Errorf("N=24 bound %v, want 99%%", got)
	}
}

func TestSummarize(t *testing.T) {
	ms := time.Millisecond
	results := []Result{
		// Warmup: ignored entirely.
		{Seq: 0, Prefix: 0, Warmup: true, Start: 0, End: 100 * ms, TTFT: 999 * ms, PromptTokens: 100, CachedTokens: 100, Server: "x"},
		{Seq: 1, Prefix: 0, Start: 1000 * ms, End: 1500 * ms, TTFT: 10 * ms, PromptTokens: 100, CachedTokens: 64, Server: "a", Decision: 5 * time.Microsecond},
		{Seq: 2, Prefix: 0, Start: 1100 * ms, End: 1600 * ms, TTFT: 20 * ms, PromptTokens: 100, CachedTokens: 16, Server: "b", Decision: 7 * time.Microsecond},
		{Seq: 3, Prefix: 1, Start: 1200 * ms, End: 2000 * ms, TTFT: 30 * ms, PromptTokens: 100, CachedTokens: 0, Server: "a", Decision: 9 * time.Microsecond},
		{Seq: 4, Prefix: 1, Start: 1300 * ms, End: 1400 * ms, Err: "boom"},
	}
	rate := 0.25
	s := Summarize(results, SummaryInput{PrefixTokens: 70, BlockSize: 16, Bound: Bound{HitRate: 1, CachedRatio: 0.7}, EngineHitRate: &rate})
	check := func(name string, got, want float64) {
		t.Helper()
		if !near(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if s.Requests != 4 || s.Errors != 1 || s.FirstError != "boom" {
		t.Errorf("requests %d errors %d, want 4 and 1", s.Requests, s.Errors)
	}
	check("hit_any", s.HitAny, 2.0/3)
	check("hit_full", s.HitFull, 1.0/3) // 64 = the 4 full blocks of a 70-token prefix
	check("cached_ratio", s.CachedRatio, 80.0/300)
	check("ttft p50", s.TTFTP50Ms, 20)
	check("ttft p99", s.TTFTP99Ms, 29.8)
	check("duration", s.DurationS, 1.0)
	check("throughput", s.Throughput, 3)
	check("servers per prefix", *s.ServersPerPrefix, 1.5)
	check("decision p50", *s.DecisionP50Us, 7)
	check("engine hit rate", *s.EngineHitRate, 0.25)
	check("bound", s.BoundCachedRatio, 0.7)

	noServer := Summarize([]Result{{Start: 0, End: ms, PromptTokens: 1, TTFT: ms}}, SummaryInput{BlockSize: 16})
	if noServer.ServersPerPrefix != nil || noServer.DecisionP50Us != nil || noServer.EngineHitRate != nil {
		t.Errorf("unknown figures not nil: %+v", noServer)
	}
}

func TestSummarizeDecodeSharing(t *testing.T) {
	ms := time.Millisecond
	req := func(server string, start, ttft, end time.Duration, warmup bool) Result {
		return Result{Server: server, Start: start * ms, TTFT: ttft * ms, End: end * ms, Warmup: warmup, PromptTokens: 1}
	}
	for _, tc := range []struct {
		name            string
		results         []Result
		decode, sharing float64
	}{
		{"alone", []Result{req("a", 0, 100, 600, false)}, 500, 0},
		{"other servers", []Result{req("a", 0, 100, 600, false), req("b", 0, 100, 600, false)}, 500, 0},
		{"side by side", []Result{req("a", 0, 100, 600, false), req("a", 0, 100, 600, false)}, 500, 1},
		// The first decodes 100..600 beside the second's 350..1000 (half of it); the
		// second decodes 400..1000 beside the first's ..600 (a third of it).
		{"half and a third", []Result{req("a", 0, 100, 600, false), req("a", 350, 50, 1000, false)}, 550, (0.5 + 1.0/3) / 2},
		// A warmup request shares the server but is not measured itself.
		{"beside a warmup request", []Result{req("a", 0, 100, 600, true), req("a", 100, 100, 700, false)}, 500, 0.8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Summarize(tc.results, SummaryInput{BlockSize: 16})
			if s.DecodeMs == nil || s.DecodeSharing == nil {
				t.Fatalf("decode figures missing: %+v", s)
			}
			if !near(*s.DecodeMs, tc.decode) || !near(*s.DecodeSharing, tc.sharing) {
				t.Errorf("decode %v ms sharing %v, want %v and %v", *s.DecodeMs, *s.DecodeSharing, tc.decode, tc.sharing)
			}
		})
	}
	if s := Summarize([]Result{{Start: 0, End: ms, PromptTokens: 1, TTFT: ms / 2}}, SummaryInput{BlockSize: 16}); s.DecodeMs != nil || s.DecodeSharing != nil {
		t.Errorf("without servers the decode figures are unknown: %+v", s)
	}
}

func TestMedian(t *testing.T) {
	one, three := 1.0, 3.0
	runs := []Summary{
		{Requests: 10, Errors: 1, CachedRatio: 0.5, TTFTP99Ms: 30, ServersPerPrefix: &one},
		{Requests: 10, Errors: 0, CachedRatio: 0.1, TTFTP99Ms: 10},
		{Requests: 10, Errors: 2, CachedRatio: 0.3, TTFTP99Ms: 20, ServersPerPrefix: &three},
	}
	m := Median(runs)
	if m.Requests != 10 || m.Errors != 3 || !near(m.CachedRatio, 0.3) || !near(m.TTFTP99Ms, 20) {
		t.Errorf("median %+v", m)
	}
	if m.ServersPerPrefix == nil || !near(*m.ServersPerPrefix, 2) {
		t.Errorf("servers per prefix %v, want the median of the runs that have it (2)", m.ServersPerPrefix)
	}
	if m.EngineHitRate != nil {
		t.Error("engine hit rate should stay unknown")
	}
}
