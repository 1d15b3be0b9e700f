package chattemplate

import (
	"bytes"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
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
	messageOverhead = 304
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
}

type cachedMessage struct {
	raw    string
	openai bool
	msg    jinja.Value
	size   int64 // the entry's memory, its iterations included; c.mu
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
	e := &cachedMessage{raw: string(raw), openai: openai, msg: msg, size: size}
	if !c.add(key, e) {
		e = nil
	}
	return msg, e, nil
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

// forget drops e from byDict. c.mu is held.
func (c *messageCache) forget(e *cachedMessage) {
	if d := e.msg.Dict(); d != nil && c.byDict[d] == e {
		delete(c.byDict, d)
	}
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
		end, ok := skipValue(raw, i)
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

// skipValue returns the end of the JSON value starting at i, tracking strings and
// nesting only; the value is validated when it is decoded.
func skipValue(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			end, ok := jsonStringEnd(b, i+1)
			if !ok {
				return 0, false
			}
			i = end
			if depth == 0 {
				return i, true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth < 0 {
				return 0, false
			}
			if depth == 0 {
				return i + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, true
			}
		}
		i++
	}
	return i, depth == 0
}

// jsonStringEnd returns the index after the closing quote of a JSON string whose body
// starts at i, finding quotes with IndexByte (long message texts are most of a body).
func jsonStringEnd(b []byte, i int) (int, bool) {
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false
		}
		q += i
		n := 0 // backslashes before the quote
		for j := q - 1; j >= i && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		i = q + 1
	}
}
