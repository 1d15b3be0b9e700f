package tokenizer

import (
	"hash/maphash"
	"slices"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// The prefix cache memoises the ids of text prefixes that end where tokenization
// splits exactly: before a raw added token that is cut-safe (see cutSafe), such as
// <|im_start|>, <|im_end|> or <|eot_id|>. A chat template renders messages in order,
// so the rendered text of a conversation's next turn, and of every request sharing a
// system prompt, starts with such a prefix of an earlier request's text.
//
// Each cut c of a text T is keyed by a seeded 64-bit hash of T[:c] (and of whether
// special tokens are added); its entry, a span, holds the ids between the previous
// stored cut and c and the key of that previous cut. A prefix's ids are the spans
// along the chain of parents, so a conversation's history is stored once however
// many turns share it. Entries are evicted least recently used first under a byte
// budget; every lookup touches a chain from its end to its root, so a parent is
// always used more recently than its children and eviction removes leaves first.
//
// The hash is of the text the router rendered, never of anything a client names.
const (
	// spanOverhead is what a span costs beside its ids: the LRU's list element and
	// map slot, the span header and the slice header (measured by BenchmarkPrefixCacheMemory).
	spanOverhead = 160
	// minSpanIDs: a cut is stored when at least this many ids follow the previous
	// stored cut (or it is one of the text's last lastCuts cuts), so short spans such as
	// "<|im_end|>\n" share an entry with their message instead of paying the overhead.
	minSpanIDs = 32
	// lastCuts: the last cuts of a text are stored whatever their spans, since the
	// next turn of a conversation continues from one of them (before the generation
	// prompt, which a next turn renders differently).
	lastCuts = 4
)

type prefixCache struct {
	seed     maphash.Seed
	maxBytes int64
	counters cacheCounters

	mu    sync.Mutex
	lru   *simplelru.LRU[uint64, *span]
	bytes int64
}

// span is the ids between a stored cut and the previous one; never changed once
// stored.
type span struct {
	parent uint64 // key of the previous stored cut; 0: this span starts the text
	ids    []uint32
}

func (s *span) size() int64 { return spanOverhead + 4*int64(cap(s.ids)) }

func newPrefixCache(maxBytes int64, counters cacheCounters) *prefixCache {
	if maxBytes <= 0 {
		return nil
	}
	c := &prefixCache{seed: maphash.MakeSeed(), maxBytes: maxBytes, counters: counters}
	// The byte budget is what bounds the cache; the count bound only has to be larger
	// than the number of spans the budget can hold.
	l, err := simplelru.NewLRU[uint64, *span](int(min(maxBytes/spanOverhead+1, 1<<30)), func(_ uint64, s *span) {
		c.bytes -= s.size()
	})
	if err != nil {
		return nil
	}
	c.lru = l
	return c
}

// cutPoint is a cut of the text being encoded.
type cutPoint struct {
	piece int    // index of the added-token piece that starts at the cut
	key   uint64 // hash of the prefix before the cut, never 0
	n     int    // len(out) before the cut token, once known
}

// encodeCached appends the ids of pieces (the raw split of text) to out, taking the
// longest cached prefix from the cache and storing the cuts after it. base is len(out)
// before the prefix special tokens, which the first span includes.
//
// It stops once out holds limit ids: only the cuts whose prefix was wholly encoded are
// stored.
func (t *Tokenizer) encodeCached(text string, pieces []piece, out []uint32, base int, add bool, limit int, sc *splitScratch) []uint32 {
	c := t.cache
	cuts := sc.cuts[:0]
	defer func() { sc.cuts = cuts[:0] }()
	var h maphash.Hash
	h.SetSeed(c.seed)
	if add {
		h.WriteByte(1)
	} else {
		h.WriteByte(0)
	}
	pos := 0
	for i, p := range pieces {
		if p.tok >= 0 && p.at > 0 && t.cut[p.tok] {
			h.WriteString(text[pos:p.at])
			pos = p.at
			cuts = append(cuts, cutPoint{piece: i, key: h.Sum64() | 1})
		}
	}
	if len(cuts) == 0 {
		return t.encodePieces(pieces, out, limit)
	}
	hit, chain := c.lookup(cuts, sc.chain[:0])
	defer func() { clear(chain); sc.chain = chain[:0] }() // no reference to cached ids kept
	start, cached := 0, 0
	if hit >= 0 {
		out = out[:base]
		for i := len(chain) - 1; i >= 0; i-- {
			out = append(out, chain[i]...)
		}
		cached = len(out) - base
		cuts[hit].n = len(out)
		start = cuts[hit].piece
	}
	next := hit + 1
	for i := start; i < len(pieces); i++ {
		if len(out) >= limit {
			cuts = cuts[:next] // the later cuts' prefixes were not (wholly) encoded
			break
		}
		if next < len(cuts) && cuts[next].piece == i {
			cuts[next].n = len(out)
			next++
		}
		if p := pieces[i]; p.tok >= 0 {
			out = append(out, t.rawMatcher.tokens[p.tok].ID)
		} else {
			out = t.encodeText(p.text, out, limit)
		}
	}
	c.counters.lookup(hit >= 0, cached, len(out)-base-cached)
	c.store(cuts, hit, out, base)
	return out
}

// lookup returns the index of the longest cut whose prefix is cached with its whole
// chain, and the chain's spans from that cut back to the text's start; -1 if none.
func (c *prefixCache) lookup(cuts []cutPoint, chain [][]uint32) (int, [][]uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Chains are complete (parents outlive children), so the first hit is normally
	// the answer; budget bounds the work should a chain be broken anyway.
	budget := 4*len(cuts) + 64
	for i := len(cuts) - 1; i >= 0 && budget > 0; i-- {
		chain = chain[:0]
		key, ok := cuts[i].key, true
		for key != 0 && budget > 0 {
			budget--
			var s *span
			if s, ok = c.lru.Peek(key); !ok {
				break
			}
			chain = append(chain, s.ids)
			key = s.parent
		}
		if ok && key == 0 {
			return i, chain
		}
	}
	return -1, chain[:0]
}

// store adds the cuts after hit (filled in by encodeCached) and touches the chain they
// extend, from its end to its root, then evicts down to the budget.
func (c *prefixCache) store(cuts []cutPoint, hit int, out []uint32, base int) {
	var newBuf [64]struct {
		key uint64
		s   *span
	}
	news := newBuf[:0]
	parent, from := uint64(0), base
	if hit >= 0 {
		parent, from = cuts[hit].key, cuts[hit].n
	}
	for j := hit + 1; j < len(cuts); j++ {
		if cuts[j].n-from < minSpanIDs && j < len(cuts)-lastCuts {
			continue
		}
		s := &span{parent: parent, ids: slices.Clone(out[from:cuts[j].n])}
		if s.size() > c.maxBytes {
			break // its children would have no parent
		}
		news = append(news, struct {
			key uint64
			s   *span
		}{cuts[j].key, s})
		parent, from = cuts[j].key, cuts[j].n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// Deepest first, then the chain they extend: parents end up more recent than
	// their children.
	for i := len(news) - 1; i >= 0; i-- {
		if c.lru.Contains(news[i].key) {
			continue // the same prefix, so the same ids
		}
		c.lru.Add(news[i].key, news[i].s)
		c.bytes += news[i].s.size()
	}
	if hit >= 0 {
		for key := cuts[hit].key; key != 0; {
			s, ok := c.lru.Get(key)
			if !ok {
				break
			}
			key = s.parent
		}
	}
	for c.bytes > c.maxBytes {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
	c.counters.setBytes(c.bytes)
}
