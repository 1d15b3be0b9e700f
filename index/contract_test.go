package index_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/index"
)

const bs = 4 // small blocks keep the tests readable

var root = index.Root("model", "", "")

// pod mimics one vLLM rank: its handles are its own seeded hash of the block chain, so
// two pods never agree on handles, as without PYTHONHASHSEED.
type pod struct{ seed uint64 }

// handles returns the pod's handles for every full block of tokens.
func (p pod) handles(tokens []uint32) []uint64 {
	keys := index.Keys(root^p.seed, tokens, bs, nil)
	for i := range keys {
		keys[i] ^= 0x5a5a // anything but our key
	}
	return keys
}

// stored is the BlockStored event for blocks [from, to) of tokens.
func (p pod) stored(tokens []uint32, from, to int) index.Blocks {
	h := p.handles(tokens[:to*bs])
	b := index.Blocks{Root: root, Handles: h[from:to], Tokens: tokens[from*bs : to*bs], BlockSize: bs}
	if from > 0 {
		b.Parent, b.HasParent = h[from-1], true
	}
	return b
}

func newIndex(t testing.TB, mut func(*index.Config)) *index.Index {
	t.Helper()
	cfg := index.DefaultConfig()
	if mut != nil {
		mut(&cfg)
	}
	ix, err := index.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

func lead(ix *index.Index, tokens []uint32, eps ...string) []int {
	return ix.LeadingBlocks(index.Keys(root, tokens, bs, nil), eps, nil)
}

func mustStore(t testing.TB, ix *index.Index, ep string, rank int, b index.Blocks) {
	t.Helper()
	if err := ix.Store(ep, rank, b); err != nil {
		t.Fatal(err)
	}
}

func TestContract(t *testing.T) {
	a, b := pod{1}, pod{2}
	prompt := seq(100, 10*bs)
	other := seq(900, 10*bs)
	tests := []struct {
		name string
		run  func(t *testing.T, ix *index.Index)
		eps  []string
		want []int
	}{
		{
			name: "empty index holds nothing",
			run:  func(t *testing.T, ix *index.Index) {},
			eps:  []string{"A", "B"}, want: []int{0, 0},
		},
		{
			name: "a chain stored in two events is matched whole",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 3))
				mustStore(t, ix, "A", 0, a.stored(prompt, 3, 6))
			},
			eps: []string{"A", "B"}, want: []int{6, 0},
		},
		{
			name: "pods with different handles match the same tokens",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 10))
				mustStore(t, ix, "B", 0, b.stored(prompt, 0, 4))
			},
			eps: []string{"A", "B", "C"}, want: []int{10, 4, 0},
		},
		{
			name: "other tokens do not match",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(other, 0, 10))
			},
			eps: []string{"A"}, want: []int{0},
		},
		{
			name: "another root does not match",
			run: func(t *testing.T, ix *index.Index) {
				ev := a.stored(prompt, 0, 10)
				ev.Root = index.Root("model", "adapter", "")
				mustStore(t, ix, "A", 0, ev)
			},
			eps: []string{"A"}, want: []int{0},
		},
		{
			name: "a removed middle block ends the leading run",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 10))
				ix.Remove("A", 0, a.handles(prompt)[5:6])
			},
			eps: []string{"A"}, want: []int{5},
		},
		{
			name: "a duplicate store needs two removals",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
				ix.Remove("A", 0, a.handles(prompt)[:4])
			},
			eps: []string{"A"}, want: []int{4},
		},
		{
			name: "a duplicate store is gone after two removals",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
				ix.Remove("A", 0, a.handles(prompt)[:4])
				ix.Remove("A", 0, a.handles(prompt)[:4])
			},
			eps: []string{"A"}, want: []int{0},
		},
		{
			name: "two handles with one key: the key stays until both go",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
				mustStore(t, ix, "A", 0, b.stored(prompt, 0, 4)) // same tokens, other handles
				ix.Remove("A", 0, a.handles(prompt)[:4])
			},
			eps: []string{"A"}, want: []int{4},
		},
		{
			name: "an orphan is not guessed at, nor are its children",
			run: func(t *testing.T, ix *index.Index) {
				if err := ix.Store("A", 0, a.stored(prompt, 3, 6)); !errors.Is(err, index.ErrOrphan) {
					t.Fatalf("err = %v, want ErrOrphan", err)
				}
				if err := ix.Store("A", 0, a.stored(prompt, 6, 8)); !errors.Is(err, index.ErrOrphan) {
					t.Fatalf("err = %v, want ErrOrphan", err)
				}
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 2))
			},
			eps: []string{"A"}, want: []int{2},
		},
		{
			name: "a parent held only by another rank is an orphan",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 3))
				if err := ix.Store("A", 1, a.stored(prompt, 3, 6)); !errors.Is(err, index.ErrOrphan) {
					t.Fatalf("err = %v, want ErrOrphan", err)
				}
			},
			eps: []string{"A"}, want: []int{3},
		},
		{
			name: "parent handle 0 that is unknown starts a sequence",
			run: func(t *testing.T, ix *index.Index) {
				ev := a.stored(prompt, 0, 3)
				ev.Parent, ev.HasParent = 0, true
				mustStore(t, ix, "A", 0, ev)
			},
			eps: []string{"A"}, want: []int{3},
		},
		{
			name: "clear drops one rank only",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 6))
				mustStore(t, ix, "A", 1, b.stored(prompt, 0, 2))
				mustStore(t, ix, "B", 0, b.stored(prompt, 0, 5))
				ix.Clear("A", 0)
			},
			eps: []string{"A", "B"}, want: []int{2, 5},
		},
		{
			name: "ranks combine by the best rank",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 3))
				mustStore(t, ix, "A", 1, b.stored(prompt, 0, 7))
				mustStore(t, ix, "A", 2, b.stored(other, 0, 9))
			},
			eps: []string{"A"}, want: []int{7},
		},
		{
			name: "purge forgets the endpoint and its id is reused cleanly",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 6))
				ix.Purge("A")
				mustStore(t, ix, "B", 0, b.stored(other, 0, 2)) // takes A's id
			},
			eps: []string{"A", "B"}, want: []int{0, 0},
		},
		{
			name: "over capacity the oldest blocks go first",
			run: func(t *testing.T, ix *index.Index) {
				ix.SetCapacity("A", 8) // headroom 1: 8 blocks
				mustStore(t, ix, "A", 0, a.stored(other, 0, 4))
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 8)) // evicts all of other's 4
			},
			eps: []string{"A"}, want: []int{8},
		},
		{
			name: "a duplicate store refreshes a block's age",
			run: func(t *testing.T, ix *index.Index) {
				ix.SetCapacity("A", 8)
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
				mustStore(t, ix, "A", 0, a.stored(other, 0, 4))
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4)) // prompt's blocks are newest again
				mustStore(t, ix, "A", 0, a.stored(other, 4, 6))  // evicts other's first two
			},
			eps: []string{"A"}, want: []int{4},
		},
		{
			name: "lowering the capacity evicts at once",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(other, 0, 4))
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 8))
				ix.SetCapacity("A", 8)
			},
			eps: []string{"A"}, want: []int{8},
		},
		{
			name: "an endpoint asked twice gets the same answer twice",
			run: func(t *testing.T, ix *index.Index) {
				mustStore(t, ix, "A", 0, a.stored(prompt, 0, 5))
			},
			eps: []string{"A", "Z", "A"}, want: []int{5, 0, 5},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, func(c *index.Config) { c.Headroom = 1 })
			tc.run(t, ix)
			if got := lead(ix, prompt, tc.eps...); !slices.Equal(got, tc.want) {
				t.Errorf("LeadingBlocks = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStoreRejectsMalformedBlocks(t *testing.T) {
	tests := []struct {
		name string
		b    index.Blocks
	}{
		{"block size 0", index.Blocks{Handles: []uint64{1}, Tokens: seq(0, 4), BlockSize: 0}},
		{"negative block size", index.Blocks{Handles: []uint64{1}, Tokens: seq(0, 4), BlockSize: -4}},
		{"too few tokens", index.Blocks{Handles: []uint64{1, 2}, Tokens: seq(0, 7), BlockSize: 4}},
		{"too many tokens", index.Blocks{Handles: []uint64{1}, Tokens: seq(0, 5), BlockSize: 4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := newIndex(t, nil)
			if err := ix.Store("A", 0, tc.b); !errors.Is(err, index.ErrInvalidBlocks) {
				t.Fatalf("err = %v, want ErrInvalidBlocks", err)
			}
			if blocks, keys := ix.Len(); blocks != 0 || keys != 0 {
				t.Fatalf("Len = %d, %d after a rejected store", blocks, keys)
			}
		})
	}
}

func TestStats(t *testing.T) {
	ix := newIndex(t, func(c *index.Config) { c.Headroom = 1 })
	a := pod{1}
	prompt := seq(0, 10*bs)
	ix.SetCapacity("A", 6)
	mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
	mustStore(t, ix, "A", 0, a.stored(prompt, 4, 8))  // evicts 2, blocks 0 and 1: block 2 loses its parent (detached)
	_ = ix.Store("A", 0, pod{9}.stored(prompt, 2, 3)) // orphan
	ix.Remove("A", 0, []uint64{a.handles(prompt)[7], 12345})
	mustStore(t, ix, "A", 1, a.stored(prompt, 0, 1))
	ix.Clear("A", 1)
	got := ix.Stats()
	want := []index.EndpointStats{{Endpoint: "A", NumGPUBlocks: 6, Blocks: 5, Ranks: []index.RankStats{
		{Rank: 0, Blocks: 5, Capacity: 6, Stored: 8, Removed: 1, Orphans: 1, Evicted: 2, UnknownRemovals: 1, Detached: 1},
		{Rank: 1, Blocks: 0, Capacity: 6, Stored: 1, Clears: 1},
	}}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Stats =\n%+v\nwant\n%+v", got, want)
	}
	if blocks, keys := ix.Len(); blocks != 5 || keys != 5 {
		t.Fatalf("Len = %d, %d, want 5, 5", blocks, keys)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ix, err := index.New(index.DefaultConfig(), reg)
	if err != nil {
		t.Fatal(err)
	}
	a := pod{1}
	prompt := seq(0, 10*bs)
	mustStore(t, ix, "A", 0, a.stored(prompt, 0, 4))
	mustStore(t, ix, "B", 0, a.stored(prompt, 0, 2))
	_ = ix.Store("A", 0, pod{9}.stored(prompt, 5, 7))
	_ = ix.Store("A", 0, index.Blocks{Handles: []uint64{1}, BlockSize: 4})
	ix.Remove("A", 0, a.handles(prompt)[3:4])
	ix.Remove("C", 0, []uint64{1, 2})
	ix.Purge("B")
	want := `
# HELP kvrouter_index_blocks Blocks held, summed over endpoint ranks.
# TYPE kvrouter_index_blocks gauge
kvrouter_index_blocks 3
# HELP kvrouter_index_blocks_removed_total Block references removed by BlockRemoved events.
# TYPE kvrouter_index_blocks_removed_total counter
kvrouter_index_blocks_removed_total 1
# HELP kvrouter_index_blocks_stored_total Blocks added to the index from BlockStored events (duplicates included).
# TYPE kvrouter_index_blocks_stored_total counter
kvrouter_index_blocks_stored_total 6
# HELP kvrouter_index_endpoints Endpoints known to the index.
# TYPE kvrouter_index_endpoints gauge
kvrouter_index_endpoints 1
# HELP kvrouter_index_keys Distinct block keys held by at least one endpoint rank.
# TYPE kvrouter_index_keys gauge
kvrouter_index_keys 3
# HELP kvrouter_index_orphan_blocks_total Blocks of BlockStored events whose parent handle was unknown, not indexed.
# TYPE kvrouter_index_orphan_blocks_total counter
kvrouter_index_orphan_blocks_total 2
# HELP kvrouter_index_purges_total Endpoints purged from the index.
# TYPE kvrouter_index_purges_total counter
kvrouter_index_purges_total 1
# HELP kvrouter_index_rejected_events_total Store calls rejected as malformed, by reason.
# TYPE kvrouter_index_rejected_events_total counter
kvrouter_index_rejected_events_total{reason="token_count"} 1
# HELP kvrouter_index_unknown_removals_total BlockRemoved handles the index did not hold.
# TYPE kvrouter_index_unknown_removals_total counter
kvrouter_index_unknown_removals_total 2
`
	names := []string{"kvrouter_index_blocks", "kvrouter_index_blocks_removed_total", "kvrouter_index_blocks_stored_total",
		"kvrouter_index_endpoints", "kvrouter_index_keys", "kvrouter_index_orphan_blocks_total", "kvrouter_index_purges_total",
		"kvrouter_index_rejected_events_total", "kvrouter_index_unknown_removals_total"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

// TestManyEndpoints crosses the 64-rank boundary, where every key's endpoint set widens.
func TestManyEndpoints(t *testing.T) {
	ix := newIndex(t, nil)
	prompt := seq(0, 10*bs)
	var eps []string
	var want []int
	for i := range 150 {
		ep := fmt.Sprintf("10.0.0.%d:8000", i)
		eps = append(eps, ep)
		want = append(want, i%11)
		if i%11 > 0 {
			mustStore(t, ix, ep, 0, pod{uint64(i)}.stored(prompt, 0, i%11-1))
			mustStore(t, ix, ep, 0, pod{uint64(i)}.stored(prompt, i%11-1, i%11))
		}
	}
	want[149] = 10
	mustStore(t, ix, eps[149], 3, pod{7}.stored(prompt, 0, 10))
	if got := lead(ix, prompt, eps...); !slices.Equal(got, want) {
		t.Fatalf("LeadingBlocks =\n%v\nwant\n%v", got, want)
	}
	for _, ep := range eps[:100] {
		ix.Purge(ep)
	}
	if got := lead(ix, prompt, eps[100:]...); !slices.Equal(got, want[100:]) {
		t.Fatalf("after purge LeadingBlocks =\n%v\nwant\n%v", got, want[100:])
	}
}

// model is the index's behaviour written plainly: per rank, handle -> (key, refs, age).
type model struct {
	ranks map[string]*modelRank
	cap   int
}

type modelRec struct {
	key    uint64
	refs   int
	age    int
	parent uint64 // the handle stored before it in its chain; 0 for a chain's first
}

type modelRank struct {
	recs map[uint64]*modelRec
	now  int
}

func (m *model) rank(ep string, r int) *modelRank {
	k := fmt.Sprint(ep, "/", r)
	if m.ranks[k] == nil {
		m.ranks[k] = &modelRank{recs: map[uint64]*modelRec{}}
	}
	return m.ranks[k]
}

func (m *model) store(ep string, r int, b index.Blocks) {
	mr := m.rank(ep, r)
	prev, parent := b.Root, uint64(0)
	if b.HasParent {
		p, ok := mr.recs[b.Parent]
		if !ok {
			return
		}
		prev, parent = p.key, b.Parent
	}
	for i, h := range b.Handles {
		if i > 0 {
			parent = b.Handles[i-1]
		}
		prev = index.Keys(prev, b.Tokens[i*bs:(i+1)*bs], bs, nil)[0]
		mr.now++
		if rec, ok := mr.recs[h]; ok {
			rec.refs++
			rec.age = mr.now
			continue
		}
		for len(mr.recs) >= m.cap {
			var oldest uint64
			first := true
			for h, rec := range mr.recs {
				if first || rec.age < mr.recs[oldest].age {
					oldest, first = h, false
				}
			}
			delete(mr.recs, oldest)
		}
		mr.recs[h] = &modelRec{key: prev, refs: 1, age: mr.now, parent: parent}
	}
}

func (m *model) remove(ep string, r int, hs []uint64) {
	mr := m.rank(ep, r)
	for _, h := range hs {
		if rec, ok := mr.recs[h]; ok {
			if rec.refs--; rec.refs == 0 {
				delete(mr.recs, h)
			}
		}
	}
}

func (m *model) lead(keys []uint64, ep string, ranks int) int {
	best := 0
	for r := range ranks {
		have := map[uint64]bool{}
		for _, rec := range m.rank(ep, r).recs {
			have[rec.key] = true
		}
		n := 0
		for n < len(keys) && have[keys[n]] {
			n++
		}
		best = max(best, n)
	}
	return best
}

// ops is a random but reproducible stream of events for one endpoint over a few shared
// prompts, with duplicates, removals of known and unknown handles, clears and orphans.
func ops(rng *rand.Rand, ep string, ranks, n int, prompts [][]uint32, ix *index.Index, m *model) {
	for range n {
		r := rng.IntN(ranks)
		p := pod{uint64(r + 1)}
		prompt := prompts[rng.IntN(len(prompts))]
		nb := len(prompt) / bs
		switch x := rng.IntN(100); {
		case x < 55:
			from := rng.IntN(nb)
			to := from + 1 + rng.IntN(nb-from)
			b := p.stored(prompt, from, to)
			_ = ix.Store(ep, r, b)
			if m != nil {
				m.store(ep, r, b)
			}
		case x < 90:
			h := p.handles(prompt)
			from := rng.IntN(nb)
			hs := slices.Clone(h[from : from+1+rng.IntN(min(3, nb-from))])
			if rng.IntN(10) == 0 {
				hs = append(hs, rng.Uint64())
			}
			ix.Remove(ep, r, hs)
			if m != nil {
				m.remove(ep, r, hs)
			}
		case x < 92:
			ix.Clear(ep, r)
			if m != nil {
				delete(m.ranks, fmt.Sprint(ep, "/", r))
			}
		}
	}
}

// leaf returns a handle of the rank that no other held block was stored under, as vLLM
// evicts them (it frees a request's blocks tail first), or false when it holds none.
func (m *model) leaf(rng *rand.Rand, ep string, r int) (uint64, bool) {
	mr := m.rank(ep, r)
	parents := map[uint64]bool{}
	for _, rec := range mr.recs {
		parents[rec.parent] = true
	}
	var leaves []uint64
	for h := range mr.recs {
		if !parents[h] {
			leaves = append(leaves, h)
		}
	}
	if len(leaves) == 0 {
		return 0, false
	}
	slices.Sort(leaves)
	return leaves[rng.IntN(len(leaves))], true
}

func testPrompts(rng *rand.Rand) [][]uint32 {
	var prompts [][]uint32
	base := seq(0, 6*bs)
	for i := range 6 {
		tail := make([]uint32, (2+rng.IntN(6))*bs)
		for j := range tail {
			tail[j] = uint32(rng.IntN(3) + 1000*i)
		}
		prompts = append(prompts, append(slices.Clone(base[:bs*rng.IntN(6)]), tail...))
	}
	return prompts
}

func TestAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			capacity := 8 + rng.IntN(40)
			ix := newIndex(t, func(c *index.Config) { c.Headroom = 1 })
			m := &model{ranks: map[string]*modelRank{}, cap: capacity}
			eps := []string{"A", "B", "C"}
			for _, ep := range eps {
				ix.SetCapacity(ep, capacity)
			}
			prompts := testPrompts(rng)
			for step := range 40 {
				for _, ep := range eps {
					ops(rng, ep, 2, 10, prompts, ix, m)
				}
				for _, p := range prompts {
					keys := index.Keys(root, p, bs, nil)
					got := ix.LeadingBlocks(keys, eps, nil)
					for i, ep := range eps {
						if want := m.lead(keys, ep, 2); got[i] != want {
							t.Fatalf("step %d endpoint %s: %d leading blocks, model says %d", step, ep, got[i], want)
						}
					}
				}
			}
			blocks := 0
			for _, mr := range m.ranks {
				blocks += len(mr.recs)
			}
			if got, _ := ix.Len(); got != blocks {
				t.Fatalf("Len = %d blocks, model holds %d", got, blocks)
			}
		})
	}
}

// TestAgainstModelInVLLMOrder checks the lookups of ranks whose blocks are removed as
// vLLM evicts them, a block never before one stored under it (the index then bisects
// for their counts instead of walking), beside an endpoint removed in any order (walked),
// against the model, and that the former never lose a block's parent (Detached 0).
func TestAgainstModelInVLLMOrder(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 2))
			ix := newIndex(t, nil)
			m := &model{ranks: map[string]*modelRank{}, cap: 1 << 20}
			eps := []string{"A", "B", "C"}
			prompts := testPrompts(rng)
			for step := range 60 {
				for _, ep := range eps[:2] {
					for range 10 {
						r := rng.IntN(2)
						p := pod{uint64(r + 1)}
						prompt := prompts[rng.IntN(len(prompts))]
						nb := len(prompt) / bs
						switch x := rng.IntN(100); {
						case x < 45:
							from := rng.IntN(nb)
							to := from + 1 + rng.IntN(nb-from)
							b := p.stored(prompt, from, to)
							_ = ix.Store(ep, r, b)
							m.store(ep, r, b)
						case x < 98:
							for range 1 + rng.IntN(3) {
								if h, ok := m.leaf(rng, ep, r); ok {
									ix.Remove(ep, r, []uint64{h})
									m.remove(ep, r, []uint64{h})
								}
							}
						default:
							ix.Clear(ep, r)
							delete(m.ranks, fmt.Sprint(ep, "/", r))
						}
					}
				}
				ops(rng, "C", 2, 10, prompts, ix, m)
				for _, p := range prompts {
					for n := range len(p)/bs + 1 {
						keys := index.Keys(root, p[:n*bs], bs, nil)
						got := ix.LeadingBlocks(keys, eps, nil)
						for i, ep := range eps {
							if want := m.lead(keys, ep, 2); got[i] != want {
								t.Fatalf("step %d endpoint %s, %d keys: %d leading blocks, model says %d", step, ep, len(keys), got[i], want)
							}
						}
					}
				}
			}
			for _, es := range ix.Stats() {
				for _, rs := range es.Ranks {
					if es.Endpoint != "C" && rs.Detached != 0 {
						t.Errorf("%s rank %d: %d detachments from removals in vLLM's order", es.Endpoint, rs.Rank, rs.Detached)
					}
				}
			}
		})
	}
}

// TestConcurrentStress runs ingestion for several endpoints, lookups, capacity changes and
// purges at once (run with -race), then checks that each endpoint ends exactly where its
// own event stream, applied alone, would leave it.
func TestConcurrentStress(t *testing.T) {
	ix := newIndex(t, func(c *index.Config) { c.Headroom = 1 })
	rng := rand.New(rand.NewPCG(42, 42))
	prompts := testPrompts(rng)
	eps := []string{"A", "B", "C", "D"}
	n := 3000
	if testing.Short() {
		n = 500
	}
	var wg sync.WaitGroup
	for i, ep := range eps {
		ix.SetCapacity(ep, 30)
		wg.Go(func() { ops(rand.New(rand.NewPCG(uint64(i), 7)), ep, 2, n, prompts, ix, nil) })
	}
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, p := range prompts {
					for _, v := range lead(ix, p, eps...) {
						if v < 0 || v > len(p)/bs {
							t.Errorf("impossible leading count %d", v)
						}
					}
				}
				_ = ix.Stats()
			}
		})
	}
	readers.Go(func() { // churn: an endpoint that comes and goes
		for i := range 200 {
			mustStore(t, ix, "E", i%2, pod{5}.stored(prompts[i%len(prompts)], 0, 2))
			if i%3 == 0 {
				ix.Purge("E")
			}
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	ix.Purge("E")

	want := newIndex(t, func(c *index.Config) { c.Headroom = 1 })
	for i, ep := range eps {
		want.SetCapacity(ep, 30)
		ops(rand.New(rand.NewPCG(uint64(i), 7)), ep, 2, n, prompts, want, nil)
	}
	for _, p := range prompts {
		if got, w := lead(ix, p, eps...), lead(want, p, eps...); !slices.Equal(got, w) {
			t.Fatalf("after the stress LeadingBlocks = %v, sequential replay gives %v", got, w)
		}
	}
	gb, gk := ix.Len()
	wb, wk := want.Len()
	if gb != wb || gk != wk {
		t.Fatalf("Len = %d blocks, %d keys; sequential replay gives %d, %d", gb, gk, wb, wk)
	}
}
