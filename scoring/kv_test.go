package scoring_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/scoring"
)

// fakeHealth reports the endpoints in down as not healthy.
type kvFakeHealth struct{ down map[string]bool }

func (h kvFakeHealth) EventsHealthy(ep string) bool { return !h.down[ep] }

// kvFakeHealthSnapshot also answers for all the candidates at once.
type kvFakeHealthSnapshot struct{ kvFakeHealth }

func (h kvFakeHealthSnapshot) EventsHealthy(string) bool {
	panic("kvFakeHealthSnapshot: the policy should use EventsHealthyAll")
}

func (h kvFakeHealthSnapshot) EventsHealthyAll(cands []scoring.Endpoint, healthy []bool) {
	for i, c := range cands {
		healthy[i] = !h.down[c.Address]
	}
}

func kvTokens(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

var kvReqN int

func kvReq(toks []uint32) *scoring.Request {
	kvReqN++
	return &scoring.Request{ID: fmt.Sprint("r", kvReqN), Model: "m", BaseModel: "m", TokenIDs: toks}
}

func kvKeysOf(toks []uint32) []uint64 { return index.Keys(index.Root("m", "", ""), toks, 16, nil) }

func kvCands(names ...string) []scoring.Endpoint {
	out := make([]scoring.Endpoint, len(names))
	for i, n := range names {
		out[i] = scoring.Endpoint{Address: n}
	}
	return out
}

// policy is what both cost policies offer.
type kvPolicy interface {
	scoring.Policy
	scoring.Observer
	Explain(*scoring.Request, []scoring.Endpoint) (scoring.Explanation, error)
}

// route picks among ep alone and reports the request routed there, as the router does.
func kvRoute(t *testing.T, p kvPolicy, req *scoring.Request, ep string) {
	t.Helper()
	d, err := p.Pick(req, kvCands(ep))
	if err != nil || d.Endpoint != ep {
		t.Fatalf("Pick = %v, %v", d, err)
	}
	p.Routed(req, ep)
}

// kvPick picks for req and returns the decision and each candidate's cost as Explain
// reports it (Explain scores exactly as Pick does: TestExplainMatchesPick).
func kvPick(t *testing.T, p kvPolicy, req *scoring.Request, cands []scoring.Endpoint) (scoring.Decision, map[string]float64) {
	t.Helper()
	d, err := p.Pick(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := p.Explain(req, cands)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, c := range ex.Candidates {
		out[c.Address] = c.Cost
	}
	return d, out
}

var (
	kvPrompt = kvTokens(0, 64)    // 4 blocks
	kvOther  = kvTokens(1000, 64) // 4 unrelated blocks
)

func TestKVCostTerms(t *testing.T) {
	tests := []struct {
		name  string
		cfg   func(*scoring.KVConfig)
		setup func(t *testing.T, p kvPolicy, ix *testindex.Index)
		req   []uint32
		want  map[string]float64
	}{
		{
			name: "idle endpoints: prefill is the request's blocks, decode its new blocks",
			want: map[string]float64{"A": 4 + 4, "B": 4 + 4},
		},
		{
			name:  "held leading blocks are credited against prefill",
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) { ix.Hold("A", kvKeysOf(kvPrompt)[:3]) },
			want:  map[string]float64{"A": 1 + 4, "B": 4 + 4},
		},
		{
			name:  "only leading blocks count",
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) { ix.Hold("A", kvKeysOf(kvPrompt)[1:]) },
			want:  map[string]float64{"A": 4 + 4, "B": 4 + 4},
		},
		{
			name:  "overlap credit scales the credit",
			cfg:   func(c *scoring.KVConfig) { c.OverlapCredit = 0.5 },
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) { ix.Hold("A", kvKeysOf(kvPrompt)[:3]) },
			want:  map[string]float64{"A": 2.5 + 4, "B": 4 + 4},
		},
		{
			name:  "prefill load scale weighs the prefill term",
			cfg:   func(c *scoring.KVConfig) { c.PrefillLoadScale = 2 },
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) { ix.Hold("A", kvKeysOf(kvPrompt)[:3]) },
			want:  map[string]float64{"A": 2*1 + 4, "B": 2*4 + 4},
		},
		{
			name: "a partial block counts in prefill, not in decode",
			req:  kvTokens(0, 70),
			want: map[string]float64{"A": 70.0/16 + 4, "B": 70.0/16 + 4},
		},
		{
			name:  "an in-flight request's prefill and blocks add to its endpoint",
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) { kvRoute(t, p, kvReq(kvOther), "A") },
			want:  map[string]float64{"A": (64+64)/16 + 4 + 4, "B": 4 + 4},
		},
		{
			name: "first token releases prefill, not decode",
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) {
				r := kvReq(kvOther)
				kvRoute(t, p, r, "A")
				p.FirstToken(r.ID)
				p.FirstToken(r.ID) // twice is once
			},
			want: map[string]float64{"A": 4 + 4 + 4, "B": 4 + 4},
		},
		{
			name: "finished releases everything",
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) {
				r := kvReq(kvOther)
				kvRoute(t, p, r, "A")
				p.Finished(r.ID)
				p.Finished(r.ID)
			},
			want: map[string]float64{"A": 4 + 4, "B": 4 + 4},
		},
		{
			name: "in-flight requests' shared blocks and the request's already-active blocks count once",
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) {
				r1, r2 := kvReq(kvPrompt), kvReq(append(kvTokens(0, 48), kvTokens(5000, 16)...))
				kvRoute(t, p, r1, "A")
				kvRoute(t, p, r2, "A")
				p.FirstToken(r1.ID)
				p.FirstToken(r2.ID)
			},
			// A's active blocks: prompt's 4 + r2's distinct last block = 5; the request adds none.
			want: map[string]float64{"A": 4 + 5, "B": 4 + 4},
		},
		{
			name: "in-flight prefill counts only the tokens that were not cached",
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) {
				ix.Hold("A", kvKeysOf(kvPrompt)[:3])
				kvRoute(t, p, kvReq(kvPrompt), "A") // 64 - 3x16 = 16 tokens to prefill
			},
			want: map[string]float64{"A": (16+64)/16 - 3 + 4, "B": 4 + 4},
		},
		{
			name: "decode active request weight adds per in-flight request",
			cfg:  func(c *scoring.KVConfig) { c.DecodeActiveRequestWeight = 10 },
			setup: func(t *testing.T, p kvPolicy, ix *testindex.Index) {
				r := kvReq(kvOther)
				kvRoute(t, p, r, "A")
				p.FirstToken(r.ID)
			},
			want: map[string]float64{"A": 4 + 8 + 10, "B": 4 + 4},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := scoring.DefaultKVConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			ix := testindex.New()
			p, err := scoring.NewKV(cfg, ix, nil, rand.NewPCG(1, 2), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, p, ix)
			}
			req := tc.req
			if req == nil {
				req = kvPrompt
			}
			if _, got := kvPick(t, p, kvReq(req), kvCands("A", "B")); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("costs = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestKVPrefixAgainstLoad(t *testing.T) {
	long := kvTokens(0, 2371) // the reference workload's prompt: 148 blocks, 127 shared
	ix := testindex.New()
	ix.Hold("A", kvKeysOf(long)[:127])
	p, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, nil, rand.NewPCG(1, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		d, _ := p.Pick(kvReq(long), kvCands("A", "B", "C"))
		if d.Endpoint != "A" {
			t.Fatalf("equal loads: chose %s, want the prefix holder A", d.Endpoint)
		}
	}
	// Pile distinct requests onto A until its load outweighs its cache.
	for i := range 4 {
		r := kvReq(kvTokens(100000*(i+1), 2371))
		kvRoute(t, p, r, "A")
		p.FirstToken(r.ID)
	}
	d, _ := p.Pick(kvReq(long), kvCands("A", "B", "C"))
	if d.Endpoint == "A" {
		t.Fatalf("overwhelming load on A: still chose A (fallbacks %v)", d.Fallbacks)
	}
	if d.Fallbacks[len(d.Fallbacks)-1] != "A" {
		t.Fatalf("fallbacks %v should end with the costliest, A", d.Fallbacks)
	}
}

func TestKVTiesAndTemperature(t *testing.T) {
	count := func(cfg scoring.KVConfig, hold bool) map[string]int {
		ix := testindex.New()
		if hold {
			ix.Hold("A", kvKeysOf(kvPrompt)[:2])
		}
		p, err := scoring.NewKV(cfg, ix, nil, rand.NewPCG(3, 4), nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for range 400 {
			d, _ := p.Pick(kvReq(kvPrompt), kvCands("A", "B", "C"))
			got[d.Endpoint]++
		}
		return got
	}
	t.Run("exact ties are broken at random", func(t *testing.T) {
		got := count(scoring.DefaultKVConfig(), false)
		for _, ep := range []string{"A", "B", "C"} {
			if got[ep] < 80 {
				t.Fatalf("picks %v: %s too rare for a uniform tie-break", got, ep)
			}
		}
	})
	t.Run("temperature 0 always takes the lowest cost", func(t *testing.T) {
		if got := count(scoring.DefaultKVConfig(), true); got["A"] != 400 {
			t.Fatalf("picks %v, want all on A", got)
		}
	})
	t.Run("temperature above 0 samples the others too", func(t *testing.T) {
		cfg := scoring.DefaultKVConfig()
		cfg.Temperature = 1
		got := count(cfg, true)
		if got["A"] <= got["B"] || got["B"] == 0 || got["C"] == 0 {
			t.Fatalf("picks %v: want A most often, B and C sometimes", got)
		}
	})
}

func TestKVUntokenizedFallsBackToLoad(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	p, err := scoring.NewKV(scoring.DefaultKVConfig(), testindex.New(), nil, rand.NewPCG(1, 2), reg)
	if err != nil {
		t.Fatal(err)
	}
	kvRoute(t, p, kvReq(kvOther), "A")
	bare := &scoring.Request{ID: "bare", Model: "m"}
	d, err := p.Pick(bare, kvCands("A", "B"))
	if err != nil || d.Endpoint != "B" {
		t.Fatalf("Pick = %v, %v; want B, the idle one", d, err)
	}
	p.Routed(bare, "B")
	// Equal block load, fewer requests wins: B now has one request with no blocks.
	d, _ = p.Pick(&scoring.Request{ID: "bare2", Model: "m"}, kvCands("B", "C"))
	if d.Endpoint != "C" {
		t.Fatalf("Pick = %v; want C, with fewer requests", d)
	}
	want := `
# HELP kvrouter_scoring_untokenized_requests_total Requests without token ids, scored by load alone.
# TYPE kvrouter_scoring_untokenized_requests_total counter
kvrouter_scoring_untokenized_requests_total{policy="kv"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_scoring_untokenized_requests_total"); err != nil {
		t.Fatal(err)
	}
}

// The kv policy asks an EventHealth per candidate, or once per pick when it offers
// EventsHealthyAll: the answers must be the same.
func TestKVUnhealthyEndpointIsPredicted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		health func(down map[string]bool) scoring.EventHealth
	}{
		{"per endpoint", func(down map[string]bool) scoring.EventHealth { return kvFakeHealth{down} }},
		{"snapshot", func(down map[string]bool) scoring.EventHealth { return kvFakeHealthSnapshot{kvFakeHealth{down}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			ix.Hold("A", kvKeysOf(kvPrompt)) // stale: A's events are down
			health := kvFakeHealth{down: map[string]bool{"A": true}}
			p, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, tc.health(health.down), rand.NewPCG(1, 2), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, c := kvPick(t, p, kvReq(kvPrompt), kvCands("A", "B")); c["A"] != c["B"] {
				t.Fatalf("costs %v: A's index entries must be ignored while its events are down", c)
			}
			r := kvReq(kvPrompt)
			kvRoute(t, p, r, "B")
			p.Finished(r.ID)
			r = kvReq(kvPrompt)
			kvRoute(t, p, r, "A") // the prediction learns A now holds the prompt
			p.Finished(r.ID)
			if _, c := kvPick(t, p, kvReq(kvPrompt), kvCands("A", "C")); c["A"] != 4 || c["C"] != 8 {
				t.Fatalf("costs %v: want A predicted to hold the prompt (4), C idle (8)", c)
			}
			health.down["A"] = false
			ix.Clear("A") // events flow again and say A holds nothing
			if _, c := kvPick(t, p, kvReq(kvPrompt), kvCands("A", "C")); c["A"] != 8 {
				t.Fatalf("costs %v: with events back, the index decides", c)
			}
		})
	}
}

func TestApproximate(t *testing.T) {
	small := []scoring.Endpoint{{Address: "A", Metrics: scoring.Metrics{Valid: true, NumGPUBlocks: 6, BlockSize: 16}},
		{Address: "B", Metrics: scoring.Metrics{Valid: true, NumGPUBlocks: 6, BlockSize: 16}}}
	tests := []struct {
		name  string
		setup func(t *testing.T, p kvPolicy)
		want  map[string]float64
	}{
		{
			name: "nothing routed, nothing predicted",
			want: map[string]float64{"A": 8, "B": 8},
		},
		{
			name: "a routed prompt is predicted cached",
			setup: func(t *testing.T, p kvPolicy) {
				r := kvReq(kvPrompt)
				p.Pick(r, small[:1])
				p.Routed(r, "A")
				p.Finished(r.ID)
			},
			want: map[string]float64{"A": 4, "B": 8},
		},
		{
			name: "the prediction holds at most num_gpu_blocks, evicting the oldest",
			setup: func(t *testing.T, p kvPolicy) {
				for _, toks := range [][]uint32{kvPrompt, kvOther} {
					r := kvReq(toks)
					p.Pick(r, small[:1])
					p.Routed(r, "A")
					p.Finished(r.ID)
				}
			},
			// 8 blocks into 6: other's 4 are newest; of prompt's, the tail went first,
			// leaving its first 2 blocks.
			want: map[string]float64{"A": 2 + 4, "B": 8},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(1, 2), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, p)
			}
			if _, got := kvPick(t, p, kvReq(kvPrompt), small); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("costs = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestKVConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mut  func(*scoring.KVConfig)
		want string
	}{
		{"defaults are valid", func(*scoring.KVConfig) {}, ""},
		{"negative prefill scale", func(c *scoring.KVConfig) { c.PrefillLoadScale = -1 }, "prefill_load_scale"},
		{"overlap credit above 1", func(c *scoring.KVConfig) { c.OverlapCredit = 1.5 }, "overlap_credit"},
		{"negative request weight", func(c *scoring.KVConfig) { c.DecodeActiveRequestWeight = -1 }, "decode_active_request_weight"},
		{"negative temperature", func(c *scoring.KVConfig) { c.Temperature = -0.1 }, "temperature"},
		{"zero block size", func(c *scoring.KVConfig) { c.BlockSize = 0 }, "block_size"},
		{"zero approx blocks", func(c *scoring.KVConfig) { c.ApproxBlocks = 0 }, "approx_blocks"},
		{"zero max tracked", func(c *scoring.KVConfig) { c.MaxTracked = 0 }, "max_tracked"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := scoring.DefaultKVConfig()
			tc.mut(&cfg)
			err := cfg.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.want)
			}
			if _, nerr := scoring.NewKV(cfg, testindex.New(), nil, nil, nil); (nerr == nil) != (err == nil) {
				t.Fatalf("NewKV error %v disagrees with Validate %v", nerr, err)
			}
		})
	}
}

func TestKVNoCandidates(t *testing.T) {
	p, _ := scoring.NewKV(scoring.DefaultKVConfig(), testindex.New(), nil, nil, nil)
	if _, err := p.Pick(kvReq(kvPrompt), nil); err != scoring.ErrNoCandidates {
		t.Fatalf("err = %v, want ErrNoCandidates", err)
	}
}

func TestKVMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ix := testindex.New()
	ix.Hold("A", kvKeysOf(kvPrompt)[:3])
	p, _ := scoring.NewKV(scoring.DefaultKVConfig(), ix, kvFakeHealth{down: map[string]bool{"B": true}}, nil, reg)
	r := kvReq(kvPrompt)
	p.Pick(r, kvCands("A", "B"))
	p.Routed(r, "A")
	want := `
# HELP kvrouter_scoring_matched_blocks_total Of those, the leading blocks the chosen endpoint held (or was predicted to hold) at the pick.
# TYPE kvrouter_scoring_matched_blocks_total counter
kvrouter_scoring_matched_blocks_total{policy="kv"} 3
# HELP kvrouter_scoring_predicted_overlaps_total Candidate overlaps taken from the predicted cache because the endpoint's KV events were not healthy (kv) or by design (approximate).
# TYPE kvrouter_scoring_predicted_overlaps_total counter
kvrouter_scoring_predicted_overlaps_total{policy="kv"} 1
# HELP kvrouter_scoring_routed_blocks_total Full prompt blocks of routed requests.
# TYPE kvrouter_scoring_routed_blocks_total counter
kvrouter_scoring_routed_blocks_total{policy="kv"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kvrouter_scoring_matched_blocks_total", "kvrouter_scoring_predicted_overlaps_total",
		"kvrouter_scoring_routed_blocks_total"); err != nil {
		t.Fatal(err)
	}
	// Both policies may share a registry.
	if _, err := scoring.NewApproximate(scoring.DefaultKVConfig(), nil, reg); err != nil {
		t.Fatal(err)
	}
}

// TestKVConcurrent races picks and the observer calls (run with -race) and checks that
// once every request finished, no load is left.
func TestKVConcurrent(t *testing.T) {
	ix := testindex.New()
	ix.Hold("A", kvKeysOf(kvPrompt)[:2])
	p, _ := scoring.NewKV(scoring.DefaultKVConfig(), ix, kvFakeHealth{down: map[string]bool{"C": true}}, nil, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				r := &scoring.Request{ID: fmt.Sprint(g, "-", i), Model: "m", TokenIDs: kvTokens(i%5*16, 64)}
				if i%7 == 0 {
					r.TokenIDs = nil
				}
				d, err := p.Pick(r, kvCands("A", "B", "C"))
				if err != nil {
					t.Error(err)
					return
				}
				p.Routed(r, d.Endpoint)
				if i%3 != 0 {
					p.FirstToken(r.ID)
				}
				p.Finished(r.ID)
			}
		})
	}
	wg.Wait()
	d, c := kvPick(t, p, kvReq(kvOther), kvCands("A", "B", "C"))
	if c["A"] != 8 || c["B"] != 8 || c["C"] != 8 {
		t.Fatalf("costs %v after every request finished, want 8 each", c)
	}
	if !slices.Contains([]string{"A", "B", "C"}, d.Endpoint) {
		t.Fatal(d)
	}
}

// TestKVWithRealIndex runs the kv policy over the real block index fed as the event
// adapter feeds it, with data-parallel ranks: the endpoint scores its best rank.
func TestKVWithRealIndex(t *testing.T) {
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	long := kvTokens(0, 2371)
	store := func(ep string, rank int, toks []uint32, handleBase uint64) {
		nb := len(toks) / 16
		hs := make([]uint64, nb)
		for i := range hs {
			hs[i] = handleBase + uint64(i)
		}
		if err := ix.Store(ep, rank, index.Blocks{Root: index.Root("m", "", ""), Handles: hs,
			Tokens: toks[:nb*16], BlockSize: 16}); err != nil {
			t.Fatal(err)
		}
	}
	store("A", 0, long[:16*40], 1000)  // rank 0 holds 40 blocks
	store("A", 1, long[:16*127], 5000) // rank 1 holds the whole 127-block prefix
	store("B", 0, long[:16*100], 9000)
	p, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, nil, rand.NewPCG(1, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	d, c := kvPick(t, p, kvReq(long), kvCands("A", "B", "C"))
	// prefill: 2371/16 - overlap; decode: 148 new blocks.
	want := map[string]float64{"A": 2371.0/16 - 127 + 148, "B": 2371.0/16 - 100 + 148, "C": 2371.0/16 + 148}
	if fmt.Sprint(c) != fmt.Sprint(want) || d.Endpoint != "A" {
		t.Fatalf("chose %s with costs %v, want A with %v", d.Endpoint, c, want)
	}
}

func TestApproximateCapacityFollowsMetrics(t *testing.T) {
	ep := func(blocks int) []scoring.Endpoint {
		return []scoring.Endpoint{{Address: "A", Metrics: scoring.Metrics{Valid: true, NumGPUBlocks: blocks, BlockSize: 16}}}
	}
	p, err := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(1, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, toks := range [][]uint32{kvOther, kvPrompt} {
		r := kvReq(toks)
		p.Pick(r, ep(8))
		p.Routed(r, "A")
		p.Finished(r.ID)
	}
	tests := []struct {
		name   string
		blocks int
		want   float64
	}{
		{"both prompts fit in 8 blocks", 8, 4},
		{"shrinking to 6 evicts the oldest: kvOther's tail, then its head", 6, 4},
		{"shrinking to 2 keeps kvPrompt's first 2 blocks", 2, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, c := kvPick(t, p, kvReq(kvPrompt), ep(tc.blocks)); c["A"] != tc.want {
				t.Fatalf("cost %v, want %v", c, tc.want)
			}
		})
	}
}

func TestForget(t *testing.T) {
	p, _ := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(1, 2), nil)
	r := kvReq(kvPrompt)
	kvRoute(t, p, r, "A")
	p.Forget("A")
	if _, c := kvPick(t, p, kvReq(kvPrompt), kvCands("A")); c["A"] != 8 {
		t.Fatalf("cost %v after Forget, want 8 (nothing predicted, no load)", c)
	}
	p.Finished(r.ID) // the forgotten endpoint's request may still finish
	k, _ := scoring.NewKV(scoring.DefaultKVConfig(), testindex.New(), nil, rand.NewPCG(1, 2), nil)
	kvRoute(t, k, kvReq(kvOther), "A")
	k.Forget("A")
	if _, c := kvPick(t, k, kvReq(kvPrompt), kvCands("A")); c["A"] != 8 {
		t.Fatalf("kv cost %v after Forget, want 8", c)
	}
}

// A prefix in flight on several endpoints at once: each holder counts its own active
// blocks, and finishing the requests in any order leaves the others' counts right.
func TestKVSharedPrefixInFlightOnSeveralEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []int // indexes into the routed requests, in finishing order
	}{
		{"first routed finishes first", []int{0, 1, 2}},
		{"last routed finishes first", []int{2, 1, 0}},
		{"middle first", []int{1, 0, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := scoring.NewKV(scoring.DefaultKVConfig(), testindex.New(), nil, rand.NewPCG(1, 2), nil)
			if err != nil {
				t.Fatal(err)
			}
			eps := []string{"A", "B", "C"}
			var reqs []*scoring.Request
			for i, ep := range eps {
				// The prompt's 4 blocks in flight on every endpoint, and a tail block of its own.
				r := kvReq(append(slices.Clone(kvPrompt), kvTokens(5000+16*i, 16)...))
				kvRoute(t, p, r, ep)
				p.FirstToken(r.ID)
				reqs = append(reqs, r)
			}
			costs := func() map[string]float64 {
				_, c := kvPick(t, p, kvReq(kvPrompt), kvCands("A", "B", "C", "D"))
				return c
			}
			busy, idle := costs()["A"], costs()["D"]
			if busy != 9 || idle != 8 {
				t.Fatalf("costs %v: want 9 where the prompt is in flight (prefill 4 + 5 active blocks, none new), 8 idle (prefill 4 + 4 new)", costs())
			}
			done := map[string]bool{}
			for _, i := range tc.order {
				p.Finished(reqs[i].ID)
				done[eps[i]] = true
				c := costs()
				for _, ep := range eps {
					want := busy
					if done[ep] {
						want = idle
					}
					if c[ep] != want {
						t.Fatalf("after finishing %v: costs %v, want %s at %v", done, c, ep, want)
					}
				}
			}
		})
	}
}

// A request the proxy served on a fallback (Moved) counts where it went: its load
// leaves the first choice, and Finished releases it at the served endpoint.
func TestKVMovedFollowsTheRequest(t *testing.T) {
	newKV := func() kvPolicy {
		p, err := scoring.NewKV(scoring.DefaultKVConfig(), testindex.New(), nil, rand.NewPCG(1, 2), nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	newApprox := func() kvPolicy {
		p, err := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(1, 2), nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name      string
		policy    func() kvPolicy
		predicted int // blocks of the moved prompt predicted cached at the served endpoint
	}{
		{"kv", newKV, 0},
		{"approximate", newApprox, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.policy()
			r := kvReq(kvPrompt)
			kvRoute(t, p, r, "A")
			p.Moved(r.ID, "B")
			terms := func(req *scoring.Request) map[string]scoring.CandidateScore {
				ex, err := p.Explain(req, kvCands("A", "B"))
				if err != nil {
					t.Fatal(err)
				}
				out := map[string]scoring.CandidateScore{}
				for _, c := range ex.Candidates {
					out[c.Address] = c
				}
				return out
			}
			c := terms(kvReq(kvOther))
			if c["A"].ActiveRequests != 0 || c["B"].ActiveRequests != 1 {
				t.Fatalf("active requests A=%d B=%d after Moved, want 0 and 1", c["A"].ActiveRequests, c["B"].ActiveRequests)
			}
			// The unprefilled prompt (4 blocks) and its 4 blocks in flight moved too.
			if c["A"].PrefillBlocks != 4 || c["B"].PrefillBlocks != 8 {
				t.Errorf("prefill blocks A=%v B=%v, want 4 (the request's own) and 8 (plus the moved prompt's)", c["A"].PrefillBlocks, c["B"].PrefillBlocks)
			}
			if c["A"].DecodeBlocks != 4 || c["B"].DecodeBlocks != 8 {
				t.Errorf("decode blocks A=%v B=%v, want 4 and 8 (the moved prompt's blocks in flight at B)", c["A"].DecodeBlocks, c["B"].DecodeBlocks)
			}
			if got := terms(kvReq(kvPrompt))["B"].OverlapBlocks; got != tc.predicted {
				t.Errorf("overlap of the moved prompt at B = %d, want %d", got, tc.predicted)
			}
			p.Finished(r.ID)
			c = terms(kvReq(kvOther))
			if c["A"].ActiveRequests != 0 || c["B"].ActiveRequests != 0 || c["B"].PrefillBlocks != 4 || c["B"].DecodeBlocks != 4 {
				t.Fatalf("after Finished: A %+v, B %+v, want no load left", c["A"], c["B"])
			}
		})
	}
}
