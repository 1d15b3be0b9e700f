package chattemplate

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
	// Imported under another name: openai is a flag throughout this package.
	openaijson "github.com/kvrouter/kvrouter/openai"
)

// Messages recur across requests: a conversation's whole history is re-sent with each
// turn, and a shared system prompt with every request. Their preprocessed form is
// memoised, keyed by the message's raw JSON (a seeded hash, confirmed by comparing the
// bytes), so that decoding and converting them is paid once. A converted message is
// never changed after it is stored (template values are immutable); its entry also
// keeps the loop iterations the engine rendered over it (jinja's incremental
// rendering), counted in the entry's size. Entries are evicted least recently used
// first under a byte budget.
const (
	// DefaultMessageCacheBytes is the message cache's default budget: 64 MiB, the
	// tokenizer prefix cache's default memory, holds about 4M tokens of conversation
	// history with its rendered iterations (about 17 bytes per token), some 29
	// conversations of 128k tokens.
	DefaultMessageCacheBytes = 64 << 20
	// messageOverhead is what an entry costs beside its strings and values: the LRU's
	// list element and map slot, the entry and the message dict's header (measured by
	// BenchmarkMessageCacheMemory: accounted bytes match the live heap it adds).
	messageOverhead = 336
	// valueBytes is the size of a template value (jinja.Value) in a list or dict.
	valueBytes = 48
)

type messageCache struct {
	seed     maphash.Seed
	maxBytes int64
	counters *cacheMetrics

	mu     sync.Mutex
	lru    *simplelru.LRU[uint64, *cachedMessage]
	byDict map[*jinja.Dict]*cachedMessage // the entries by their converted message
	bytes  int64
	// clock counts the moves to the LRU's front: an entry moved at stamp s has at
	// most clock-s entries before it (see touch).
	clock uint64
}

type cachedMessage struct {
	key    uint64 // its key in the LRU
	raw    string
	openai bool
	msg    jinja.Value
	// next is the message that followed this one in the last request that had
	// both (nil: none): the conversation's chain, which the next turn walks instead of
	// looking each message up (walk). A hint, checked before use. Set under c.mu, and
	// cleared there when either entry is evicted (prev is the entry whose next this
	// is), so that an entry kept never keeps an evicted one.
	next atomic.Pointer[cachedMessage]
	prev *cachedMessage // c.mu
	// stamp is c.clock when the entry was last moved to the LRU's front; c.mu.
	stamp uint64
	gone  bool  // evicted or replaced; c.mu
	size  int64 // the entry's memory, its iterations included; c.mu
	// iters are the message's rendered loop iterations (jinja's incremental
	// rendering), at most maxIterations, newest last: an immutable slice replaced
	// under c.mu, read without it.
	iters atomic.Pointer[[]storedIteration]
}

type storedIteration struct {
	key jinja.IterationKey
	it  *jinja.Iteration
}

// maxIterations bounds the rendered iterations kept per message: the template's
// message loop (and a second one, like Qwen3's reverse scan for the last query), for
// the default and tool_use templates.
const maxIterations = 4

func newMessageCache(maxBytes int64, counters *cacheMetrics) *messageCache {
	if maxBytes < 0 {
		return nil
	}
	if maxBytes == 0 {
		maxBytes = DefaultMessageCacheBytes
	}
	c := &messageCache{seed: maphash.MakeSeed(), maxBytes: maxBytes, counters: counters, byDict: map[*jinja.Dict]*cachedMessage{}}
	// The byte budget is what bounds the cache; the count bound only has to be larger
	// than the number of entries the budget can hold.
	l, err := simplelru.NewLRU[uint64, *cachedMessage](int(min(maxBytes/messageOverhead+1, 1<<30)), func(_ uint64, e *cachedMessage) {
		c.bytes -= e.size
		c.forget(e)
	})
	if err != nil {
		return nil
	}
	c.lru = l
	return c
}

// message returns the conversation message for one raw messages element, from the
// cache when it has been converted before.
func (c *messageCache) message(raw []byte, openai bool) (jinja.Value, *cachedMessage, error) {
	var key uint64
	if c != nil {
		key = maphash.Bytes(c.seed, raw)
		if openai {
			key ^= 1
		}
		c.mu.Lock()
		e, ok := c.lru.Get(key)
		if ok {
			e.stamp = c.clock
			c.clock++
		}
		c.mu.Unlock()
		if ok && e.openai == openai && e.raw == string(raw) {
			c.counters.lookup(true)
			return e.msg, e, nil
		}
		c.counters.lookup(false)
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return jinja.Value{}, nil, badRequest("%v", err)
	}
	d := v.Dict()
	if d == nil {
		return jinja.Value{}, nil, badRequest("message must be an object")
	}
	msg, err := conversationMessage(d, openai)
	if err != nil {
		return jinja.Value{}, nil, err
	}
	if c == nil {
		return msg, nil, nil
	}
	size := messageOverhead + int64(len(raw)) + valueSize(msg)
	if size > c.maxBytes/8 {
		// Too large to keep (see add): copying its raw bytes would cost a huge message
		// another copy of itself for nothing.
		return msg, nil, nil
	}
	e := &cachedMessage{key: key, raw: string(raw), openai: openai, msg: msg, size: size}
	if !c.add(key, e) {
		e = nil
	}
	return msg, e, nil
}

// walkBatch is how many chained entries walk takes from the cache under one lock.
const walkBatch = 64

// walk converts the messages array raw as conversation does with the cache, but
// follows the chain of cached messages the conversation's previous requests left
// (cachedMessage.next): an element whose bytes are those of the entry the chain
// predicts is that entry, with no hash or lookup of its own. A turn of a long
// conversation re-sends hundreds of messages, and looking each up cost more than
// comparing its bytes. An element off the chain is looked up as message does, and
// links the chain. ok is false when raw is not a well-formed array or an element
// fails to convert: conversation then does it all again, with its errors.
//
// Exact: a cached entry's raw is a whole JSON object, so an element that starts with
// those bytes ends where they do, and the same bytes convert to the same message.
func (c *messageCache) walk(raw []byte, openai bool) (conv []jinja.Value, entries []*cachedMessage, ok bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, nil, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return []jinja.Value{}, nil, skipSpace(raw, i+1) == len(raw)
	}
	n := min(max(len(raw)/1024, 8), 8192) // a guess: messages of a long conversation are ~1 KB
	conv = make([]jinja.Value, 0, n)
	entries = make([]*cachedMessage, 0, n)
	var predBuf [walkBatch]*cachedMessage
	pred := predBuf[:0]
	var prev *cachedMessage
	chained := 0 // entries taken from the chain, touched at the end
	defer func() {
		clear(predBuf[:])
		if ok {
			c.touch(entries, chained)
		}
	}()
	for {
		if len(pred) == 0 && prev != nil {
			pred = c.predict(prev, predBuf[:0])
		}
		var e *cachedMessage
		var msg jinja.Value
		var end int
		if len(pred) > 0 && pred[0].openai == openai && len(raw)-i >= len(pred[0].raw) && string(raw[i:i+len(pred[0].raw)]) == pred[0].raw {
			e, msg, end = pred[0], pred[0].msg, i+len(pred[0].raw)
			pred = pred[1:]
			chained++
		} else {
			pred = pred[:0]
			var good bool
			if end, good = openaijson.ValueEnd(raw, i); !good {
				return nil, nil, false
			}
			var err error
			if msg, e, err = c.message(raw[i:end], openai); err != nil {
				return nil, nil, false
			}
		}
		conv = append(conv, msg)
		entries = append(entries, e)
		prev = e
		if i = skipSpace(raw, end); i >= len(raw) {
			return nil, nil, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return conv, entries, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, nil, false
		}
	}
}

// predict appends to pred the entries that followed prev last time, at most
// walkBatch (the chain may be a cycle: a message repeated).
func (c *messageCache) predict(prev *cachedMessage, pred []*cachedMessage) []*cachedMessage {
	for e := prev.next.Load(); e != nil && len(pred) < walkBatch; e = e.next.Load() {
		pred = append(pred, e)
	}
	return pred
}

// touch marks the entries of a walked conversation as used, as message's lookups do,
// links each to the next in the chain, and counts the chained ones (which had no
// lookup of their own) as hits. An entry moved to the LRU's front fewer than half the
// LRU's length moves ago is in its front half, far from eviction: it is not moved
// again, which spares a long conversation's turn hundreds of map lookups and list
// moves and leaves the order of eviction least recently used but for that half.
func (c *messageCache) touch(entries []*cachedMessage, chained int) {
	c.counters.hits(chained)
	c.mu.Lock()
	defer c.mu.Unlock()
	near := uint64(c.lru.Len() / 2)
	var prev *cachedMessage
	for _, e := range entries {
		if e == nil || e.gone {
			prev = nil // not cached (too large, or evicted meanwhile)
			continue
		}
		if c.clock-e.stamp >= near {
			c.lru.Get(e.key)
			e.stamp = c.clock
			c.clock++
		}
		if prev != nil && prev.next.Load() != e {
			if old := prev.next.Load(); old != nil && old.prev == prev {
				old.prev = nil
			}
			prev.next.Store(e)
			e.prev = prev
		}
		prev = e
	}
}

// add stores e unless it alone would take more than an eighth of the budget (one
// message must not flush a cache that serves many conversations), then evicts down
// to the budget.
func (c *messageCache) add(key uint64, e *cachedMessage) bool {
	if e.size > c.maxBytes/8 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.lru.Peek(key); ok {
		c.bytes -= old.size // Add replaces it without calling the eviction callback
		c.forget(old)
	}
	c.lru.Add(key, e)
	e.stamp = c.clock
	c.clock++
	c.bytes += e.size
	if d := e.msg.Dict(); d != nil {
		c.byDict[d] = e
	}
	c.evict()
	return true
}

// evict removes the least recently used entries down to the budget. c.mu is held.
func (c *messageCache) evict() {
	for c.bytes > c.maxBytes {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
	c.counters.setBytes(c.bytes)
}

// forget drops e from byDict and unlinks it from the conversation chain. c.mu is held.
func (c *messageCache) forget(e *cachedMessage) {
	if d := e.msg.Dict(); d != nil && c.byDict[d] == e {
		delete(c.byDict, d)
	}
	e.gone = true
	if p := e.prev; p != nil && p.next.Load() == e {
		p.next.Store(nil)
	}
	if n := e.next.Load(); n != nil && n.prev == e {
		n.prev = nil
	}
	e.next.Store(nil)
	e.prev = nil
}

// renderIterations is the jinja.IterationCache of one render: the message cache,
// with the entries of the render's messages by index, so that an iteration over
// messages[i] (or messages[i+1], for templates that loop over messages[1:]) finds its
// message's stored iterations without a lock; other items are looked up by dict.
type renderIterations struct {
	c       *messageCache
	entries []*cachedMessage // nil where the message is not cached
}

func (r *renderIterations) entry(item *jinja.Dict, index int) *cachedMessage {
	for _, i := range [2]int{index, index + 1} {
		if i < len(r.entries) {
			if e := r.entries[i]; e != nil && e.msg.Dict() == item {
				return e
			}
		}
	}
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.byDict[item]
}

// Iteration implements jinja.IterationCache: the stored rendering of one loop
// iteration over a cached message.
func (r *renderIterations) Iteration(item *jinja.Dict, key jinja.IterationKey) *jinja.Iteration {
	e := r.entry(item, key.Index)
	if e == nil {
		return nil
	}
	if iters := e.iters.Load(); iters != nil {
		for _, s := range *iters {
			if s.key == key {
				return s.it
			}
		}
	}
	return nil
}

// KeepsIteration tells jinja whether StoreIteration would keep the iteration: only one
// over a message the cache holds.
func (r *renderIterations) KeepsIteration(item *jinja.Dict, key jinja.IterationKey) bool {
	return r.entry(item, key.Index) != nil
}

// StoreIteration implements jinja.IterationCache. An iteration over a message the
// cache does not hold is not kept (its identity would stand for nothing); it counts
// toward its message's entry, which it is evicted with.
func (r *renderIterations) StoreIteration(item *jinja.Dict, key jinja.IterationKey, it *jinja.Iteration) {
	e := r.entry(item, key.Index)
	if e == nil {
		return
	}
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byDict[item] != e {
		return // evicted meanwhile
	}
	var old []storedIteration
	if p := e.iters.Load(); p != nil {
		old = *p
	}
	iters := make([]storedIteration, 0, min(len(old)+1, maxIterations))
	size := e.size
	for _, s := range old {
		if s.key == key {
			size -= s.it.Bytes()
			continue
		}
		iters = append(iters, s)
	}
	if size+it.Bytes() > c.maxBytes/8 {
		return
	}
	if len(iters) == maxIterations {
		size -= iters[0].it.Bytes()
		iters = iters[1:]
	}
	iters = append(iters, storedIteration{key, it})
	size += it.Bytes()
	c.bytes += size - e.size
	e.size = size
	e.iters.Store(&iters)
	c.evict()
}

// valueSize is the memory a converted message holds beside the entry: its strings
// (which may share memory with each other, so this errs high) and its lists' and
// dicts' values.
func valueSize(v jinja.Value) int64 {
	switch v.Kind() {
	case jinja.KindString:
		return int64(len(v.Str()))
	case jinja.KindList:
		items := v.List().Items
		n := int64(cap(items)) * valueBytes
		for _, it := range items {
			n += valueSize(it)
		}
		return n
	case jinja.KindDict:
		pairs := v.Dict().Pairs()
		n := int64(cap(pairs)) * 2 * valueBytes
		for _, p := range pairs {
			n += valueSize(p.Key) + valueSize(p.Value)
		}
		return n
	case jinja.KindInt, jinja.KindFloat, jinja.KindBool, jinja.KindNone:
		return 0
	}
	return valueBytes
}

// splitArray returns the raw elements of a JSON array, or ok=false when raw is not a
// well-formed array at this level (the caller then decodes it whole to report why).
func splitArray(raw []byte, elems [][]byte) ([][]byte, bool) {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, false
	}
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return elems, skipSpace(raw, i+1) == len(raw)
	}
	for {
		end, ok := openaijson.ValueEnd(raw, i)
		if !ok {
			return nil, false
		}
		elems = append(elems, raw[i:end])
		i = skipSpace(raw, end)
		if i >= len(raw) {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i = skipSpace(raw, i+1)
		case ']':
			return elems, skipSpace(raw, i+1) == len(raw)
		default:
			return nil, false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
