package tokenizer

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
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
// budget; every encode moves the chain it used and stored to the front of the recency
// list, each parent just ahead of its child, so a parent is always used more recently
// than its children and eviction removes leaves first.
//
// The hash is of the text the router rendered, never of anything a client names.
const (
	// spanOverhead is what a span costs beside its ids: its map slot, the span
	// header (with its recency list links, parent pointer and provenance key), the
	// slice header and its slot in the proven map (an upper bound:
	// BenchmarkConversationCacheMemory in prompt compares the accounted bytes with the
	// live heap).
	spanOverhead = 240
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
	spans map[uint64]*span // by key
	// proven maps a provenance key (see Provenance) to the deepest span whose cut is at
	// or before the end of the text that key names; each span is the value of at most
	// its own proof.
	proven map[uint64]*span
	// idSeed mixes provenance ids into provenance keys.
	idSeed uint64
	// recent is the sentinel of the spans' recency list, a ring through it:
	// recent.older is the most recently used span, recent.newer the least.
	recent span
	bytes  int64
}

// span is the ids between a stored cut and the previous one; never changed once
// stored, apart from the block keys a Prefix stores on it.
type span struct {
	parent  uint64 // key of the previous stored cut; 0: this span starts the text
	key     uint64 // the span's own cut's key
	textLen int    // bytes of text between the previous stored cut and this one
	at      int    // bytes of text before the cut (the key's text is that long)
	// up is the span of parent, set when the span is stored (nil: the first span, or
	// parent was evicted then) and cleared when it is evicted: a resumed encode (see
	// resume) follows it to the text's start instead of looking each parent up.
	// Parents outlive their children (see store), so a span kept normally keeps no
	// evicted one through it, and an evicted one keeps nothing.
	up atomic.Pointer[span]
	// proof is the provenance key whose entry in the cache's proven map this span
	// is, 0 when none; under the cache's lock.
	proof uint64
	// inner are the cuts between the previous stored cut and this one that were not
	// stored (short spans), as offsets into the span's text: a cut's key chains
	// through every cut before it (see chainKey), so a walk over the span needs them.
	inner []int32
	ids   []uint32
	// next is the span that last followed this one in an encode (nil: none, or
	// evicted): the chain an encode walks (see walk). Set by store and cleared by
	// eviction, both under the cache's lock, so a span kept never keeps an evicted one.
	next atomic.Pointer[span]
	// keys are the block keys of the blocks ending in the span (see Prefix), at most
	// maxSpanKeys sets, newest last: an immutable slice replaced under the cache's
	// lock, read without it. Counted in size.
	keys atomic.Pointer[[]spanKeys]
	// older and newer link the span into the cache's recency list, under the cache's
	// lock; nil once evicted. The list is the span's own fields rather than a map
	// lookup away, so that touching a conversation's chain of hundreds of spans each
	// turn follows pointers (see touch).
	older, newer *span
}

// spanKeys is one set of block keys: those of a root and block size.
type spanKeys struct {
	root      uint64
	blockSize int
	keys      []uint64
}

const (
	// maxSpanKeys bounds the sets of block keys kept per span: a conversation has one
	// root (model, adapter, cache_salt) and a fleet one block size, so two leave room
	// for a second block size or a shared system prompt under two roots.
	maxSpanKeys = 2
	// spanKeysHeader is what a span holding keys pays beside them: the boxed slice
	// header and the array of maxSpanKeys sets (root, block size, slice header).
	spanKeysHeader = 24 + maxSpanKeys*40
)

// size is the span's memory; read under the cache's lock (keys change under it).
func (s *span) size() int64 {
	n := spanOverhead + 4*int64(cap(s.ids)) + 4*int64(cap(s.inner))
	if p := s.keys.Load(); p != nil {
		n += spanKeysHeader
		for _, k := range *p {
			n += 8 * int64(cap(k.keys))
		}
	}
	return n
}

func newPrefixCache(maxBytes int64, counters cacheCounters) *prefixCache {
	if maxBytes <= 0 {
		return nil
	}
	c := &prefixCache{seed: maphash.MakeSeed(), maxBytes: maxBytes, counters: counters, spans: make(map[uint64]*span), proven: make(map[uint64]*span)}
	c.idSeed = maphash.String(c.seed, "provenance")
	c.recent.older, c.recent.newer = &c.recent, &c.recent
	return c
}

// insertAfter links s, not in the list, as the span used just before at (at =
// &c.recent: as the most recently used).
func (c *prefixCache) insertAfter(at, s *span) {
	s.newer, s.older = at, at.older
	s.older.newer = s
	at.older = s
}

// moveAfter moves s, in the list, to just after at; a no-op when it is there.
func (c *prefixCache) moveAfter(at, s *span) {
	if at.older == s {
		return
	}
	s.older.newer, s.newer.older = s.newer, s.older
	c.insertAfter(at, s)
}

// evictOldest removes the least recently used span; false if none.
func (c *prefixCache) evictOldest() bool {
	s := c.recent.newer
	if s == &c.recent {
		return false
	}
	s.older.newer, s.newer.older = s.newer, s.older
	s.older, s.newer = nil, nil
	delete(c.spans, s.key)
	c.bytes -= s.size()
	// No hint keeps an evicted span (and what it points to) alive.
	s.next.Store(nil)
	s.up.Store(nil)
	if s.proof != 0 && c.proven[s.proof] == s {
		delete(c.proven, s.proof)
	}
	if p, ok := c.spans[s.parent]; ok {
		p.next.CompareAndSwap(s, nil)
	}
	return true
}

// evict evicts down to the budget; under the cache's lock.
func (c *prefixCache) evict() {
	for c.bytes > c.maxBytes && c.evictOldest() {
	}
	c.counters.setBytes(c.bytes)
}

// cutPoint is a cut of the text being encoded.
type cutPoint struct {
	piece int    // index of the added-token piece that starts at the cut
	at    int    // the cut's position in the text
	key   uint64 // hash of the prefix before the cut, never 0
	n     int    // len(out) before the cut token, once known
}

// encodeCached appends the ids of text to out, taking the longest cached prefix from
// the cache and storing the cuts after it. base is len(out) before the prefix special
// tokens, which the first span includes.
//
// It first walks the chain of spans the previous encodes of the same text left (see
// walk), then splits the rest of the text on its added tokens and looks its cuts up;
// a conversation's next turn so scans and looks up only its new messages.
//
// It stops once out holds limit ids: only the cuts whose prefix was wholly encoded are
// stored.
//
// p, when not nil, is filled with the spans of the cached prefix the ids start with,
// the ones found and the ones stored.
func (t *Tokenizer) encodeCached(text string, out []uint32, base int, add bool, limit int, sc *splitScratch, p *Prefix, prov *Provenance) []uint32 {
	c := t.cache
	key := startKey(add)
	var proofs []proof // the provenance's boundaries past the one resumed from
	walked, pos := sc.chain[:0], 0
	if prov != nil && t.walkable && prov.valid(len(text)) {
		all := c.provenKeys(text, add, prov, sc.proofs[:0])
		defer func() { sc.proofs = all[:0] }()
		proofs = all
		var from int
		walked, pos, from = t.resume(text, proofs, walked, prov)
		if pos > 0 {
			key = walked[len(walked)-1].key
			c.counters.resumed()
		}
		proofs = proofs[from:]
	}
	// Everything from pos on is read below (all of the text when nothing was resumed).
	prov.fill(pos)
	walked, pos = t.walk(text, &key, walked, pos)
	defer func() { clear(walked); sc.chain = walked[:0] }() // no reference to cached ids kept
	// Invalid UTF-8 is replaced before encoding (see AppendEncodeMax). The walked
	// prefix has the bytes of a text stored before, which was valid, and ends before an
	// added token, at a rune boundary: only the rest needs checking, and replacing.
	if !utf8.ValidString(text[pos:]) {
		text = text[:pos] + strings.ToValidUTF8(text[pos:], "\uFFFD")
		proofs = nil // its offsets are those of the text before the replacement
	}
	rest := text[pos:]
	pieces := t.rawMatcher.splitWith(rest, sc.pieces[:0], &sc.matches)
	defer func() { sc.pieces = pieces }()
	cuts := sc.cuts[:0]
	defer func() { sc.cuts = cuts[:0] }()
	prev := 0
	for i, p := range pieces {
		if p.tok >= 0 && p.at > 0 && t.cut[p.tok] {
			key = c.chainKey(key, rest[prev:p.at])
			prev = p.at
			cuts = append(cuts, cutPoint{piece: i, at: pos + p.at, key: key})
		}
	}
	if len(cuts) == 0 && len(walked) == 0 {
		return t.encodePieces(pieces, out, limit)
	}
	hit, chain := -1, sc.found[:0]
	if len(cuts) > 0 {
		hit, chain = c.lookup(cuts, chain)
	}
	defer func() { clear(chain); sc.found = chain[:0] }()
	start, cached := 0, 0
	parent, from, fromAt := uint64(0), base, 0 // the cut the stored spans continue from
	switch {
	case hit >= 0: // a cut of the rest, whose chain runs through the walked spans or not
		out = out[:base]
		for i := len(chain) - 1; i >= 0; i-- {
			out = append(out, chain[i].ids...)
		}
		start = cuts[hit].piece
		parent, from, fromAt = cuts[hit].key, len(out), cuts[hit].at
		cached = len(out) - base
		p.fill(c, chain, true)
	case len(walked) > 0: // the walk's end
		out = out[:base]
		for _, s := range walked {
			out = append(out, s.ids...)
		}
		parent, from, fromAt = walked[len(walked)-1].key, len(out), pos
		cached = len(out) - base
		p.fill(c, walked, false)
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
	c.counters.lookup(cached > 0, cached, len(out)-base-cached)
	if hit >= 0 {
		c.store(cuts[hit+1:], chain, true, parent, from, fromAt, out, base, p, proofs)
	} else {
		c.store(cuts, walked, false, parent, from, fromAt, out, base, p, proofs)
	}
	return out
}

// Provenance is what the caller knows of the text it encodes: from Start on, the text
// is contents named by IDs, back to back, the i-th ending at Ends[i] (byte offsets
// into the text). An id must name one content (one sequence of bytes) for the
// process's life, as chattemplate.Provenance's loop iterations do: the prefix cache
// then finds the ids of a prefix of the text that a previous encode with the same
// bytes before Start and the same ids up to some i stored, without hashing or
// comparing the text up to Ends[i] again. Whatever the provenance does not cover (the
// text before Start, and after the last Ends[i] the cache knows) is checked as without
// it.
//
// Fill, when not nil, says that some of the text's bytes from Start on are not written
// yet (the render deferred what it replayed: chattemplate.Provenance's Deferred): the
// encoder calls Fill(from) before it reads any byte at or after Start, from the first
// offset it will read, and Fill must then write every byte from there on into the
// memory text aliases. With the cache's ids of a conversation's history, an encode
// reads only what follows them, so the history's text need not be written at all.
type Provenance struct {
	Start int
	Ends  []int
	IDs   []uint64
	Fill  func(from int)
}

// fill calls p.Fill(from) when p defers bytes.
func (p *Provenance) fill(from int) {
	if p != nil && p.Fill != nil {
		p.Fill(from)
	}
}

// valid reports whether p describes a text of n bytes.
func (p *Provenance) valid(n int) bool {
	if len(p.IDs) == 0 || len(p.Ends) != len(p.IDs) || p.Start < 0 {
		return false
	}
	prev := p.Start
	for _, e := range p.Ends {
		if e < prev {
			return false
		}
		prev = e
	}
	return prev <= n
}

// proof is one boundary of a provenance: the end of the i-th content and its
// provenance key, which stands for the text before it.
type proof struct {
	key uint64
	end int
}

// provenKeys appends each boundary of prov with its provenance key: the text before
// Start hashed as a cut key is (with whether special tokens are added), then each id
// mixed in, in order. Two texts with the same key up to a boundary have the same bytes
// up to it (bar a collision of the seeded 64-bit keys, as for the cut keys).
func (c *prefixCache) provenKeys(text string, add bool, prov *Provenance, proofs []proof) []proof {
	k := c.chainKey(^startKey(add), text[:prov.Start])
	for i, id := range prov.IDs {
		x := k*0x9e3779b97f4a7c15 ^ (id + c.idSeed)
		x ^= x >> 29
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 32
		k = x | 1
		proofs = append(proofs, proof{key: k, end: prov.Ends[i]})
	}
	return proofs
}

// maxResumeTries bounds the boundaries resume looks up, deepest first: a conversation's
// next turn resumes from one of its last few, and a text with none known (a new
// conversation, an edit far back) is then walked as without provenance rather than
// looked up once per message under the cache's lock.
const maxResumeTries = 64

// resume finds the deepest boundary of proofs whose key the cache knows (among the
// last maxResumeTries), and appends
// to spans the chain of spans from the text's start to the span that key was proved
// for (the deepest one stored whose cut is at or before the boundary), following
// their up pointers: the bytes before the boundary are those of the text the chain
// was stored for, which the provenance proved, so neither are hashed. It returns the
// spans, the position of the last one's cut and the index of the first boundary past
// the one it resumed from; no spans, 0 and 0 when none can be resumed from.
//
// The ids are those a split of the whole text gives: the split of the stored text had
// a cut at the span's, and walkCut checks that this text's split has one too.
//
// The bytes it reads, from the span's cut on, are filled first (see Provenance.Fill).
func (t *Tokenizer) resume(text string, proofs []proof, spans []*span, prov *Provenance) ([]*span, int, int) {
	c := t.cache
	var s *span
	i, last := len(proofs)-1, max(len(proofs)-maxResumeTries, 0)
	c.mu.Lock()
	for ; i >= last; i-- {
		if s = c.proven[proofs[i].key]; s != nil && s.at <= proofs[i].end {
			break
		}
	}
	c.mu.Unlock()
	if i < last {
		return spans, 0, 0
	}
	prov.fill(s.at)
	if !t.walkCut(text, s.at) {
		return spans, 0, 0
	}
	n := len(spans)
	for x := s; ; x = x.up.Load() {
		if x == nil {
			clear(spans[n:]) // a parent evicted meanwhile: the chain is broken
			return spans[:n], 0, 0
		}
		spans = append(spans, x)
		if x.parent == 0 {
			break
		}
	}
	slices.Reverse(spans[n:])
	return spans, s.at, i + 1
}

// startKey is the key a text's chain of cut keys starts from: whether special tokens
// are added is part of every key.
func startKey(add bool) uint64 {
	if add {
		return 0x6b76_726f_7574_6531
	}
	return 0x6b76_726f_7574_6530
}

// chainKey is the key of a cut: the previous cut's key (startKey for the first) mixed
// with a seeded hash of the text between the two cuts. A cut's key thus stands for
// the text before it and where its cuts are, which the split of that text decides; it
// is never 0. One hash per segment, rather than a streaming hash of the whole text,
// hashes a long conversation's text in one call per message instead of one per 128
// bytes. For a given previous key the mixing is a bijection of the segment's hash
// (before the low bit is set), so two texts' keys collide only where their segments'
// seeded hashes nearly do.
func (c *prefixCache) chainKey(prev uint64, segment string) uint64 {
	x := prev*0x9e3779b97f4a7c15 ^ maphash.String(c.seed, segment)
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x | 1
}

// maxScanAhead bounds the cuts walk scans past the end of the chain it follows to find
// where the text's stored chain continues (after a shared system prompt, another
// conversation's next message is the hint; short messages' cuts are not stored).
const maxScanAhead = 8

// walk follows the cache's chain along text from its start: from each span it takes
// the one that followed it last time (span.next) when the text has the same bytes up
// to that span's cut (its key chains the text's segments between the cuts before it:
// key, continued over the span's text and its inner cuts) and the split of text has a
// cut there (walkCut), else
// it scans up to maxScanAhead cuts ahead for a stored span continuing the chain (store
// then relinks the hints along this text, under the cache's lock, so that no span
// kept points to an evicted one). It continues from spans (walked or resumed before,
// ending at pos, key then being the last one's key). It returns the spans walked, in
// order, and the position of the last one's cut (0 when none), key then being its
// key.
//
// The ids are those a split of the whole text gives: a span is taken only where the
// whole text's split has a cut, and the ids of the text before a cut are those of the
// text the span was stored for.
func (t *Tokenizer) walk(text string, key *uint64, spans []*span, pos int) ([]*span, int) {
	if !t.walkable {
		return spans, pos
	}
	c := t.cache
	var cur *span
	if len(spans) > 0 {
		cur = spans[len(spans)-1]
	}
	for {
		if cur != nil {
			if nx := cur.next.Load(); nx != nil && nx.parent == cur.key && t.walkCut(text, pos+nx.textLen) {
				k, from := *key, pos
				for _, o := range nx.inner {
					k = c.chainKey(k, text[from:pos+int(o)])
					from = pos + int(o)
				}
				if k = c.chainKey(k, text[from:pos+nx.textLen]); k == nx.key {
					*key, pos, cur = k, pos+nx.textLen, nx
					spans = append(spans, nx)
					continue
				}
			}
		}
		var parent uint64
		if cur != nil {
			parent = cur.key
		}
		nx, end := t.scanAhead(text, pos, parent, key)
		if nx == nil {
			return spans, pos
		}
		pos, cur = end, nx
		spans = append(spans, nx)
	}
}

// walkCut reports whether the split of text has a cut at c: an added token whose
// matches text splits exactly before (cutSafe) matches at c, and no added token
// holds its first byte further in, so that no match starting before c can end after
// it (and so the split before c is that of any text with the same bytes before c).
func (t *Tokenizer) walkCut(text string, c int) bool {
	if c <= 0 || c >= len(text) {
		return false
	}
	tok, _ := t.rawMatcher.longestAt(text, c)
	return tok >= 0 && t.cut[tok] && !t.inner[text[c]]
}

// scanAhead scans the split of text from pos (a cut, or 0) for the first stored span
// of its next maxScanAhead cuts; it returns that span and its cut when the span
// continues the chain at parent, key then being the cut's key, else nil and key
// unchanged.
func (t *Tokenizer) scanAhead(text string, pos int, parent uint64, key *uint64) (*span, int) {
	m := t.rawMatcher
	k := *key
	prev, from := pos, pos
	for n := 0; n < maxScanAhead; {
		tok, at, end := m.nextMatch(text, from)
		if tok < 0 {
			return nil, 0
		}
		from = end
		if at <= pos || !t.cut[tok] {
			continue
		}
		n++
		k = t.cache.chainKey(k, text[prev:at])
		prev = at
		t.cache.mu.Lock()
		s, ok := t.cache.spans[k]
		t.cache.mu.Unlock()
		switch {
		case !ok:
			continue // not stored (a short span), or the end of the cached prefix
		case s.parent != parent:
			return nil, 0 // stored with other cuts before it: lookup finds it
		}
		*key = k
		return s, at
	}
	return nil, 0
}

// lookup returns the index of the longest cut whose prefix is cached with its whole
// chain, and the chain's spans from that cut back to the text's start; -1 if none.
func (c *prefixCache) lookup(cuts []cutPoint, chain []*span) (int, []*span) {
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
			if s, ok = c.spans[key]; !ok {
				break
			}
			chain = append(chain, s)
			key = s.parent
		}
		if ok && key == 0 {
			return i, chain
		}
	}
	return -1, chain[:0]
}

// store adds cuts (filled in by encodeCached), continuing the chain at the stored cut
// parent (0: the text's start), whose ids end at out[from] and text at fromAt, and
// touches the chain they extend, prefix (the spans from the text's start to parent,
// deepest first when reversed), linking each span's hint to the span after it on this
// text; then it evicts down to the budget. p, when not nil, gets the spans the cache
// holds for those cuts.
func (c *prefixCache) store(cuts []cutPoint, prefix []*span, reversed bool, parent uint64, from, fromAt int, out []uint32, base int, p *Prefix, proofs []proof) {
	var newBuf [64]struct {
		key uint64
		s   *span
		end int // cut's n
	}
	news := newBuf[:0]
	skipped := 0 // cuts since the last stored one, not stored
	for j := range cuts {
		if cuts[j].n-from < minSpanIDs && j < len(cuts)-lastCuts {
			skipped++
			continue
		}
		s := &span{parent: parent, key: cuts[j].key, textLen: cuts[j].at - fromAt, at: cuts[j].at, ids: slices.Clone(out[from:cuts[j].n])}
		if skipped > 0 {
			s.inner = make([]int32, skipped)
			for i, cp := range cuts[j-skipped : j] {
				s.inner[i] = int32(cp.at - fromAt)
			}
			skipped = 0
		}
		if s.size() > c.maxBytes {
			break // its children would have no parent
		}
		news = append(news, struct {
			key uint64
			s   *span
			end int
		}{cuts[j].key, s, cuts[j].n})
		parent, from, fromAt = cuts[j].key, cuts[j].n, cuts[j].at
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// The chain they extend, root first, then the new spans go to the front of the
	// recency list in one block, each just more recent than the span after it on this
	// text, so parents outlive their children; each span's hint is linked to the span
	// after it. A conversation's next turn finds its chain already there in that
	// order: touching it moves nothing and costs a pointer comparison per span.
	at := &c.recent // the span the next one goes after
	var prev *span  // the span before the one being linked, on this text
	link := func(s *span) {
		if prev != nil && s.parent == prev.key && prev.next.Load() != s {
			prev.next.Store(s)
		}
		at, prev = s, s
	}
	for i := range prefix {
		s := prefix[i]
		if reversed {
			s = prefix[len(prefix)-1-i]
		}
		if s.older == nil {
			break // evicted meanwhile: what follows it on this text is no chain
		}
		c.moveAfter(at, s)
		link(s)
	}
	for i := range news {
		if old, ok := c.spans[news[i].key]; ok {
			news[i].s = old // the same prefix, so the same ids
			c.moveAfter(at, old)
		} else {
			s := news[i].s
			if prev != nil && prev.key == s.parent {
				s.up.Store(prev)
			}
			c.spans[news[i].key] = s
			c.bytes += s.size()
			c.insertAfter(at, s)
		}
		link(news[i].s)
	}
	if len(proofs) > 0 {
		c.prove(proofs, prefix, reversed, news)
	}
	if p != nil && len(news) > 0 {
		// A span stored before for the same cut may start elsewhere (other cuts were
		// skipped then): its end is the cut's either way.
		p.c = c
		for _, ns := range news {
			p.spans = append(p.spans, ns.s)
			p.ends = append(p.ends, ns.end-base)
		}
	}
	c.evict()
}

// prove records the boundaries of an encode's provenance (see resume): each one's
// key is the proof of the deepest span of the encode's chain (prefix, deepest first
// when reversed, then news) whose cut is at or before it. Under the cache's lock.
func (c *prefixCache) prove(proofs []proof, prefix []*span, reversed bool, news []struct {
	key uint64
	s   *span
	end int
}) {
	n := len(prefix) + len(news)
	at := func(j int) *span { // the chain's j-th span, root first
		if j >= len(prefix) {
			return news[j-len(prefix)].s
		}
		if reversed {
			return prefix[len(prefix)-1-j]
		}
		return prefix[j]
	}
	j := n - 1
	var last *span // the span given the last (deepest) boundary seen
	for i := len(proofs) - 1; i >= 0; i-- {
		for j >= 0 && at(j).at > proofs[i].end {
			j--
		}
		if j < 0 {
			return
		}
		s := at(j)
		if s == last || s.older == nil {
			continue // a deeper boundary has it; or evicted meanwhile
		}
		last = s
		if s.proof == proofs[i].key {
			continue
		}
		if s.proof != 0 && c.proven[s.proof] == s {
			delete(c.proven, s.proof)
		}
		if old := c.proven[proofs[i].key]; old != nil {
			old.proof = 0
		}
		s.proof = proofs[i].key
		c.proven[s.proof] = s
	}
}

// Prefix describes the ids of an encode that the prefix cache holds: the spans they
// start with, found or stored by the encode, as segments on which a caller stores what
// it derives from those ids (the block keys of a KV cache index: Prefix implements
// index.PrefixKeys), so that the next encode sharing the spans (the conversation's next
// turn) finds it. What is stored counts in the cache's byte budget and is evicted with
// its span. The zero value is ready to use; one Prefix is reused across encodes (each
// resets it) and must not be used by two goroutines at once.
type Prefix struct {
	c     *prefixCache
	spans []*span
	ends  []int
}

// fill sets p's spans to spans (deepest first when reversed), ending at their
// cumulated ids; p may be nil.
func (p *Prefix) fill(c *prefixCache, spans []*span, reversed bool) {
	if p == nil {
		return
	}
	p.c = c
	n := 0
	for i := range spans {
		s := spans[i]
		if reversed {
			s = spans[len(spans)-1-i]
		}
		n += len(s.ids)
		p.spans = append(p.spans, s)
		p.ends = append(p.ends, n)
	}
}

// Reset empties p, dropping its references to the cache (an encode resets it too).
func (p *Prefix) Reset() {
	clear(p.spans)
	p.c, p.spans, p.ends = nil, p.spans[:0], p.ends[:0]
}

// Ends returns where each span ends, in ids from the first id the encode appended
// (the prefix special tokens included), increasing. Spans may end past an encode cut at
// maxTokens.
func (p *Prefix) Ends() []int { return p.ends }

// SegmentKeys returns the block keys stored on span i for root and blockSize, or nil.
func (p *Prefix) SegmentKeys(i int, root uint64, blockSize int) []uint64 {
	if sets := p.spans[i].keys.Load(); sets != nil {
		for _, k := range *sets {
			if k.root == root && k.blockSize == blockSize {
				return k.keys
			}
		}
	}
	return nil
}

// StoreSegmentKeys stores a copy of keys on span i for root and blockSize, unless the
// span was evicted meanwhile, and evicts down to the budget.
func (p *Prefix) StoreSegmentKeys(i int, root uint64, blockSize int, keys []uint64) {
	p.c.storeKeys(p.spans[i], root, blockSize, keys)
}

func (c *prefixCache) storeKeys(s *span, root uint64, blockSize int, keys []uint64) {
	set := spanKeys{root: root, blockSize: blockSize, keys: make([]uint64, len(keys))}
	copy(set.keys, keys)
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.spans[s.key]; !ok || cur != s {
		return // evicted: nothing would find the keys
	}
	var old []spanKeys
	if p := s.keys.Load(); p != nil {
		old = *p
	}
	sets := make([]spanKeys, 0, maxSpanKeys)
	for _, k := range old {
		if k.root != root || k.blockSize != blockSize {
			sets = append(sets, k)
		}
	}
	if len(sets) == maxSpanKeys {
		sets = sets[1:]
	}
	sets = append(sets, set)
	before := s.size()
	s.keys.Store(&sets)
	c.bytes += s.size() - before
	c.evict()
}
