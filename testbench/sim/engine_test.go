package sim_test

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/testbench/sim"
)

// small is a hand-checkable engine: 4-token blocks, blocks 1..n-1 usable.
func small(t *testing.T, numBlocks int, mod func(*sim.Config)) *sim.Engine {
	t.Helper()
	c := sim.DefaultConfig()
	c.BlockSize = 4
	c.NumGPUBlocks = numBlocks
	c.MaxModelLen = 64
	c.Timing = sim.Timing{Base: 1}
	if mod != nil {
		mod(&c)
	}
	e, err := sim.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func seq(start, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(start + i)
	}
	return s
}

type tracker struct {
	results map[string]sim.Result
	first   map[string]int
	tokens  map[string]int
}

func newTracker() *tracker {
	return &tracker{results: map[string]sim.Result{}, first: map[string]int{}, tokens: map[string]int{}}
}

func (tr *tracker) cb(id string) sim.Callbacks {
	return sim.Callbacks{
		FirstToken: func(_ uint32, cached int) { tr.first[id] = cached },
		Token:      func(uint32) { tr.tokens[id]++ },
		Finish:     func(r sim.Result) { tr.results[id] = r },
	}
}

func add(t *testing.T, e *sim.Engine, tr *tracker, id string, prompt []uint32, maxTokens int) {
	t.Helper()
	if err := e.AddRequest(id, prompt, maxTokens, tr.cb(id)); err != nil {
		t.Fatal(err)
	}
}

// drain steps until idle and returns every event.
func drain(t *testing.T, e *sim.Engine) []kvevents.Event {
	t.Helper()
	var ev []kvevents.Event
	for i := 0; e.HasWork(); i++ {
		if i > 1000 {
			t.Fatal("engine never went idle")
		}
		ev = append(ev, e.Step().Events...)
	}
	return ev
}

func stored(ev kvevents.Event) *kvevents.BlockStored {
	s, _ := ev.(*kvevents.BlockStored)
	return s
}

func TestNumBlocks(t *testing.T) {
	if got := sim.Qwen3_0_6B.BytesPerToken(); got != 114688 {
		t.Errorf("bytes per token = %d, want 114688", got)
	}
	tests := []struct {
		name  string
		bytes int64
		want  int
	}{
		{"1GiB", 1 << 30, 585},
		{"one block exactly", 16 * 114688, 1},
		{"just short of one block", 16*114688 - 1, 0},
		{"zero", 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := sim.Qwen3_0_6B.NumBlocks(tc.bytes, 16); got != tc.want {
				t.Errorf("NumBlocks(%d) = %d, want %d", tc.bytes, got, tc.want)
			}
		})
	}
}

// TestEvictionOrderAndPartialHit walks a 6-usable-block cache through the sequence worked
// out by hand in the comments, checking every event.
func TestEvictionOrderAndPartialHit(t *testing.T) {
	e := small(t, 7, nil) // free queue [1 2 3 4 5 6]
	tr := newTracker()
	pA, pB := seq(100, 9), seq(200, 9)

	// A takes blocks 1,2,3; caches a0,a1 (the 9th token's block is partial).
	add(t, e, tr, "A", pA, 1)
	evA := drain(t, e)
	if len(evA) != 1 {
		t.Fatalf("A events = %d, want 1 BlockStored", len(evA))
	}
	sA := stored(evA[0])
	if sA == nil || len(sA.BlockHashes) != 2 || sA.HasParent || sA.BlockSize != 4 ||
		!reflect.DeepEqual(sA.TokenIDs, pA[:8]) {
		t.Fatalf("A stored = %+v", evA[0])
	}
	a0, a1 := sA.BlockHashes[0], sA.BlockHashes[1]
	// Freed tail first: queue [4 5 6 3 2 1].

	add(t, e, tr, "B", pB, 1) // takes 4,5,6 (never cached): no removal
	evB := drain(t, e)
	if len(evB) != 1 || stored(evB[0]) == nil {
		t.Fatalf("B events = %v", evB)
	}
	b1 := stored(evB[0]).BlockHashes[1]
	// Queue [3 2 1 6 5 4].

	// C needs two blocks: 3 (A's partial, uncached) and 2 (a1, evicted).
	add(t, e, tr, "C", seq(300, 5), 1)
	evC := drain(t, e)
	if len(evC) != 2 {
		t.Fatalf("C events = %v", evC)
	}
	if r, ok := evC[0].(*kvevents.BlockRemoved); !ok || !reflect.DeepEqual(r.BlockHashes, []uint64{a1}) {
		t.Errorf("C first event = %#v, want BlockRemoved[a1]", evC[0])
	}
	if s := stored(evC[1]); s == nil || len(s.BlockHashes) != 1 || s.HasParent {
		t.Errorf("C second event = %#v, want BlockStored of one block", evC[1])
	}
	// Queue [1 6 5 4 2 3]: A's head block 1 survived its tail.

	// D repeats A's prompt: a0 hits (4 tokens), a1 must be recomputed into blocks 6 and 5,
	// evicting b1 from block 5.
	add(t, e, tr, "D", pA, 1)
	evD := drain(t, e)
	if tr.first["D"] != 4 || tr.results["D"].CachedTokens != 4 {
		t.Errorf("D cached = %d / %d, want 4", tr.first["D"], tr.results["D"].CachedTokens)
	}
	if len(evD) != 2 {
		t.Fatalf("D events = %v", evD)
	}
	if r, ok := evD[0].(*kvevents.BlockRemoved); !ok || !reflect.DeepEqual(r.BlockHashes, []uint64{b1}) {
		t.Errorf("D first event = %#v, want BlockRemoved[b1]", evD[0])
	}
	s := stored(evD[1])
	if s == nil || !reflect.DeepEqual(s.BlockHashes, []uint64{a1}) || !s.HasParent || s.ParentHash != a0 ||
		!reflect.DeepEqual(s.TokenIDs, pA[4:8]) {
		t.Errorf("D stored = %#v, want a1 with parent a0", evD[1])
	}
	st := e.Stats()
	if st.PrefixCacheQueries != 9+9+5+9 || st.PrefixCacheHits != 4 {
		t.Errorf("prefix cache queries/hits = %d/%d, want 32/4", st.PrefixCacheQueries, st.PrefixCacheHits)
	}
	if st.KVCacheUsage != 0 {
		t.Errorf("usage after all finished = %v, want 0", st.KVCacheUsage)
	}
}

func TestLastTokenNeverCounted(t *testing.T) {
	tests := []struct {
		name       string
		prompt     []uint32
		wantCached int
	}{
		{"whole prompt cached, block aligned", seq(100, 8), 4},
		{"whole prompt cached, 9 tokens", seq(100, 9), 8},
		{"shorter than a block", seq(100, 3), 0},
		{"diverges in second block", append(seq(100, 6), 1, 2, 3), 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := small(t, 20, nil)
			tr := newTracker()
			add(t, e, tr, "warm", seq(100, 12), 1)
			drain(t, e)
			add(t, e, tr, "x", tc.prompt, 1)
			drain(t, e)
			if got := tr.results["x"].CachedTokens; got != tc.wantCached {
				t.Errorf("cached = %d, want %d", got, tc.wantCached)
			}
		})
	}
}

// TestRefCountingSharedBlocks: blocks are cached when scheduled, so a second request
// admitted in the same step shares them; they return to the free queue only when both
// requests are done. Both requests' blocks of the same tokens are not de-duplicated.
func TestRefCountingSharedBlocks(t *testing.T) {
	e := small(t, 9, nil) // 8 usable
	tr := newTracker()
	p := seq(100, 9)
	add(t, e, tr, "X", p, 3)
	add(t, e, tr, "Y", p, 1)
	if _, ok := e.Begin(); !ok {
		t.Fatal("nothing scheduled")
	}
	// X: 3 blocks; Y shares X's 2 full blocks and adds one: 4 of 8 in use.
	if got := e.Stats().KVCacheUsage; got != 0.5 {
		t.Errorf("usage = %v, want 0.5", got)
	}
	res := e.Complete()
	if len(res.Events) != 1 {
		t.Errorf("events = %v, want one BlockStored (Y reused X's blocks)", res.Events)
	}
	if tr.first["Y"] != 8 || tr.first["X"] != 0 {
		t.Errorf("cached X=%d Y=%d, want 0 and 8", tr.first["X"], tr.first["Y"])
	}
	// Y finished: its own block is free, the shared ones are still held by X.
	if got := e.Stats().KVCacheUsage; got != 3.0/8 {
		t.Errorf("usage after Y = %v, want 0.375", got)
	}
	drain(t, e)
	if got := e.Stats().KVCacheUsage; got != 0 {
		t.Errorf("usage after X = %v, want 0", got)
	}
}

func TestPreemptionByRecompute(t *testing.T) {
	e := small(t, 5, func(c *sim.Config) { c.ReserveFullISL = false }) // 4 usable
	tr := newTracker()
	add(t, e, tr, "R1", seq(100, 4), 8)
	add(t, e, tr, "R2", seq(200, 4), 8)
	preempted := 0
	var order []string
	for i := 0; e.HasWork() && i < 100; i++ {
		r := e.Step()
		preempted += r.Preempted
		for _, f := range r.Finished {
			order = append(order, f.ID)
		}
	}
	if preempted != 1 {
		t.Errorf("preemptions = %d, want 1", preempted)
	}
	if !reflect.DeepEqual(order, []string{"R1", "R2"}) {
		t.Errorf("finish order = %v, want R1 then R2 (the newest is preempted)", order)
	}
	r2 := tr.results["R2"]
	if r2.Preemptions != 1 || r2.OutputTokens != 8 || tr.tokens["R2"] != 8 || r2.CachedTokens != 0 {
		t.Errorf("R2 = %+v tokens %d", r2, tr.tokens["R2"])
	}
	st := e.Stats()
	if st.Preemptions != 1 || st.PrefixCacheQueries != 8 || st.PrefixCacheHits != 0 {
		t.Errorf("stats = %+v: the resumed admission must not count as a query", st)
	}
}

func TestReserveFullISLWaitsInsteadOfPreempting(t *testing.T) {
	e := small(t, 7, nil) // 6 usable
	tr := newTracker()
	add(t, e, tr, "big", seq(100, 16), 4)  // 5 blocks at the end
	add(t, e, tr, "late", seq(200, 12), 2) // 4 blocks: must wait
	r := e.Step()
	if e.Stats().Waiting != 1 || r.PrefillTokens != 16 {
		t.Fatalf("after step 1: waiting %d prefill %d", e.Stats().Waiting, r.PrefillTokens)
	}
	total := 0
	for e.HasWork() {
		total += e.Step().Preempted
	}
	if total != 0 || tr.results["late"].OutputTokens != 2 {
		t.Errorf("preempted %d, late %+v", total, tr.results["late"])
	}
}

func TestTokenBudgetAndChunkedPrefill(t *testing.T) {
	e := small(t, 30, func(c *sim.Config) {
		c.MaxNumBatchedTokens = 8
		c.Timing = sim.Timing{Base: 1, PrefillToken: 0.1, DecodeSeq: 0.01}
		c.Speed = 2
	})
	tr := newTracker()
	add(t, e, tr, "A", seq(100, 6), 3)
	add(t, e, tr, "B", seq(200, 6), 3)
	type shape struct{ p, d int }
	var got []shape
	var durs []float64
	for e.HasWork() {
		r := e.Step()
		got = append(got, shape{r.PrefillTokens, r.DecodeSeqs})
		durs = append(durs, r.Duration)
	}
	// Step 1: A's 6 tokens and 2 of B's. Step 2: A decodes first, B's last 4 tokens.
	// Step 3: both decode, A ends. Step 4: B's last token.
	want := []shape{{8, 0}, {4, 1}, {0, 2}, {0, 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("steps = %v, want %v", got, want)
	}
	if math.Abs(durs[0]-(1+0.8)/2) > 1e-12 || math.Abs(durs[1]-(1+0.4+0.01)/2) > 1e-12 {
		t.Errorf("durations = %v", durs)
	}
}

func TestMaxNumSeqs(t *testing.T) {
	e := small(t, 30, func(c *sim.Config) { c.MaxNumSeqs = 1 })
	tr := newTracker()
	add(t, e, tr, "A", seq(100, 4), 2)
	add(t, e, tr, "B", seq(200, 4), 2)
	e.Step()
	if s := e.Stats(); s.Running != 1 || s.Waiting != 1 {
		t.Errorf("running %d waiting %d, want 1 and 1", s.Running, s.Waiting)
	}
	drain(t, e)
	if len(tr.results) != 2 {
		t.Errorf("finished %d, want 2", len(tr.results))
	}
}

func TestHashSeedsDisagree(t *testing.T) {
	hashes := func(seed uint64) []uint64 {
		e := small(t, 10, func(c *sim.Config) { c.HashSeed = seed })
		tr := newTracker()
		add(t, e, tr, "x", seq(100, 9), 1)
		return stored(drain(t, e)[0]).BlockHashes
	}
	if !reflect.DeepEqual(hashes(1), hashes(1)) {
		t.Error("the same seed gave different hashes")
	}
	if reflect.DeepEqual(hashes(1), hashes(2)) {
		t.Error("different seeds gave the same hashes")
	}
}

func TestBadRequests(t *testing.T) {
	e := small(t, 5, nil)
	tests := []struct {
		name   string
		prompt []uint32
		max    int
	}{
		{"empty prompt", nil, 1},
		{"longer than max_model_len", seq(0, 60), 10},
		{"larger than the cache", seq(0, 20), 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var re *sim.RequestError
			if err := e.AddRequest(tc.name, tc.prompt, tc.max, sim.Callbacks{}); !errors.As(err, &re) {
				t.Errorf("err = %v, want *RequestError", err)
			}
		})
	}
	if err := e.AddRequest("a", seq(0, 4), 1, sim.Callbacks{}); err != nil {
		t.Fatal(err)
	}
	if err := e.AddRequest("a", seq(0, 4), 1, sim.Callbacks{}); !errors.Is(err, sim.ErrDuplicateID) {
		t.Errorf("duplicate id err = %v", err)
	}
}

func TestAbort(t *testing.T) {
	e := small(t, 30, nil)
	tr := newTracker()
	add(t, e, tr, "A", seq(100, 8), 50)
	e.Step()
	if !e.Abort("A") {
		t.Fatal("abort of a running request reported unknown")
	}
	if r := tr.results["A"]; r.Reason != "abort" || e.HasWork() || e.Stats().KVCacheUsage != 0 {
		t.Errorf("after abort: %+v, work %v, usage %v", r, e.HasWork(), e.Stats().KVCacheUsage)
	}
	if e.Abort("nope") {
		t.Error("abort of an unknown id reported known")
	}
}

func TestResetPrefixCache(t *testing.T) {
	e := small(t, 10, nil)
	tr := newTracker()
	add(t, e, tr, "A", seq(100, 9), 1)
	drain(t, e)
	if !e.ResetPrefixCache() {
		t.Fatal("reset failed on an idle engine")
	}
	if ev := e.TakeEvents(); len(ev) != 1 {
		t.Errorf("events = %v, want AllBlocksCleared", ev)
	} else if _, ok := ev[0].(*kvevents.AllBlocksCleared); !ok {
		t.Errorf("event = %T", ev[0])
	}
	add(t, e, tr, "B", seq(100, 9), 1)
	drain(t, e)
	if tr.results["B"].CachedTokens != 0 {
		t.Error("hit after reset")
	}
}

// A 100k-token prompt on a long-context server (max_model_len 131072, 16 GiB of KV) is
// prefilled in max_num_batched_tokens chunks, a decoding request riding along in every
// step (vLLM v1 schedules running requests, decodes included, before the rest of the
// budget); when KV runs out the newest running request is preempted by recompute.
func TestLongPromptChunkedPrefillAndPreemption(t *testing.T) {
	e := small(t, sim.Qwen3_0_6B.NumBlocks(16<<30, 4), func(c *sim.Config) { c.MaxModelLen = 131072 })
	tr := newTracker()
	add(t, e, tr, "chat", seq(5_000_000, 100), 400)
	e.Step() // chat's prefill: it decodes from now on
	add(t, e, tr, "long", seq(100, 100_000), 2)
	steps := 0
	for _, ok := tr.first["long"]; !ok && steps < 1000; _, ok = tr.first["long"] {
		r := e.Step()
		steps++
		if tr.results["chat"].ID == "" && r.DecodeSeqs != 1 {
			t.Fatalf("step %d: %d decoding sequences, want the chat request in every step", steps, r.DecodeSeqs)
		}
	}
	// 2,047 tokens of budget per step beside one decode: ceil(100000/2047) = 49 chunks.
	if want := (100_000 + 2046) / 2047; steps < want || steps > want+2 {
		t.Errorf("the long prompt took %d steps, want about %d chunks", steps, want)
	}

	// Preemption by recompute: 9 usable blocks, two requests that outgrow them.
	e = small(t, 10, func(c *sim.Config) { c.ReserveFullISL = false })
	tr = newTracker()
	add(t, e, tr, "old", seq(100, 16), 12)
	add(t, e, tr, "new", seq(300, 16), 12)
	for i := 0; e.HasWork() && i < 1000; i++ {
		e.Step()
	}
	nw := tr.results["new"]
	if nw.Preemptions == 0 || nw.OutputTokens != 12 || tr.results["old"].Preemptions != 0 {
		t.Fatalf("old %+v new %+v: want the newest preempted and both finished", tr.results["old"], nw)
	}
	if st := e.Stats(); st.Preemptions == 0 || st.PrefixCacheQueries != 32 {
		t.Errorf("stats %+v: re-admissions must not count as prefix-cache queries", st)
	}
}

func TestBaselineCellsFromPublishedFigures(t *testing.T) {
	cells, err := sim.BaselineCells()
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 4*6 {
		t.Fatalf("%d cells, want 24 (4 N x 6 figures)", len(cells))
	}
	// Spot checks against the published tables (docs/reference.md).
	want := map[string]float64{"cached_ratio/2/4": 0.814, "hit_rate/24/8": 0.175, "ttft_p99_ms/7/16": 1353, "throughput_rps/12/16": 13.9}
	for _, c := range cells {
		if w, ok := want[fmt.Sprintf("%s/%d/%d", c.Metric, c.N, c.Conc)]; ok && c.Ref != w {
			t.Errorf("%s N=%d C=%d: ref %v, want %v", c.Metric, c.N, c.Conc, c.Ref, w)
		}
	}
}

// TestCachedBlocks: CachedBlocks finds the leading blocks admission would hit (never
// the last prompt token's block), stops at the first block not cached, and changes
// nothing: a prompt looked up twice, or then admitted, finds the same.
func TestCachedBlocks(t *testing.T) {
	e := small(t, 7, nil) // 6 usable blocks
	tr := newTracker()
	pA := seq(100, 9)
	if got := e.CachedBlocks(pA); got != 0 {
		t.Fatalf("empty cache: CachedBlocks = %d, want 0", got)
	}
	add(t, e, tr, "A", pA, 1)
	drain(t, e)
	tests := []struct {
		name   string
		prompt []uint32
		want   int
	}{
		{"same prompt", pA, 2},
		{"prompt extending it", append(seq(100, 8), seq(500, 8)...), 2},
		{"last token in a cached block", seq(100, 8), 1},
		{"first block only shared", append(seq(100, 4), seq(600, 8)...), 1},
		{"other prompt", seq(200, 9), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 {
				if got := e.CachedBlocks(tc.prompt); got != tc.want {
					t.Fatalf("CachedBlocks = %d, want %d", got, tc.want)
				}
			}
		})
	}
	add(t, e, tr, "B", append(seq(100, 8), seq(500, 8)...), 1)
	drain(t, e)
	if tr.first["B"] != 8 {
		t.Errorf("B admitted with %d cached tokens, want the 8 CachedBlocks found", tr.first["B"])
	}
}
