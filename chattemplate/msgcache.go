package chattemplate

import (
	"bytes"
	"hash/maphash"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// Messages recur across requests: a conversation's whole history is re-sent with each
// turn, and a shared system prompt with every request. Their preprocessed form is
// memoised, keyed by the message's raw JSON (a seeded hash, confirmed by comparing the
// bytes), so that decoding and converting them is paid once. Entries are never changed
// after they are stored (template values are immutable). Entries are evicted least
// recently used first under a byte budget.
const (
	// DefaultMessageCacheBytes is the message cache's default budget: 64 MiB, the
	// tokenizer prefix cache's default memory, holds about 6M tokens of conversation
	// history (about 11 bytes per token), some 45 conversations of 128k tokens.
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

	mu    sync.Mutex
	lru   *simplelru.LRU[uint64, *cachedMessage]
	bytes int64
}

type cachedMessage struct {
	raw    string
	openai bool
	msg    jinja.Value
	size   int64
}

func newMessageCache(maxBytes int64, counters *cacheMetrics) *messageCache {
	if maxBytes < 0 {
		return nil
	}
	if maxBytes == 0 {
		maxBytes = DefaultMessageCacheBytes
	}
	c := &messageCache{seed: maphash.MakeSeed(), maxBytes: maxBytes, counters: counters}
	// The byte budget is what bounds the cache; the count bound only has to be larger
	// than the number of entries the budget can hold.
	l, err := simplelru.NewLRU[uint64, *cachedMessage](int(min(maxBytes/messageOverhead+1, 1<<30)), func(_ uint64, e *cachedMessage) {
		c.bytes -= e.size
	})
	if err != nil {
		return nil
	}
	c.lru = l
	return c
}

// message returns the conversation message for one raw messages element, from the
// cache when it has been converted before.
func (c *messageCache) message(raw []byte, openai bool) (jinja.Value, error) {
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
			return e.msg, nil
		}
		c.counters.lookup(false)
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return jinja.Value{}, badRequest("%v", err)
	}
	d := v.Dict()
	if d == nil {
		return jinja.Value{}, badRequest("message must be an object")
	}
	msg, err := conversationMessage(d, openai)
	if err != nil {
		return jinja.Value{}, err
	}
	if c != nil {
		c.add(key, raw, openai, msg)
	}
	return msg, nil
}

// add stores a converted message unless it alone would take more than an eighth of the
// budget (one message must not flush a cache that serves many conversations), then
// evicts down to the budget. The raw bytes are copied only once the entry is kept: a
// huge message would otherwise cost another copy of itself for nothing.
func (c *messageCache) add(key uint64, raw []byte, openai bool, msg jinja.Value) {
	size := messageOverhead + int64(len(raw)) + valueSize(msg)
	if size > c.maxBytes/8 {
		return
	}
	e := &cachedMessage{raw: string(raw), openai: openai, msg: msg, size: size}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.lru.Peek(key); ok {
		c.bytes -= old.size // Add replaces it without calling the eviction callback
	}
	c.lru.Add(key, e)
	c.bytes += e.size
	for c.bytes > c.maxBytes {
		if _, _, ok := c.lru.RemoveOldest(); !ok {
			break
		}
	}
	c.counters.setBytes(c.bytes)
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
