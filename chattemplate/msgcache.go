package chattemplate

import (
	"bytes"
	"hash/maphash"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// Long messages, a shared system prompt above all, recur across requests: their
// preprocessed form is memoised, keyed by the message's raw JSON, so that decoding and
// converting them is paid once. Entries are never changed after they are stored
// (template values are immutable).
const (
	defaultMessageCacheSize = 128
	minCachedMessage        = 1 << 10 // shorter messages are cheaper to decode than to look up
	maxCachedMessage        = 1 << 18
)

type messageCache struct {
	seed  maphash.Seed
	cache *lru.Cache[uint64, cachedMessage]
}

type cachedMessage struct {
	raw    []byte
	openai bool
	msg    jinja.Value
}

func newMessageCache(size int) *messageCache {
	if size < 0 {
		return nil
	}
	if size == 0 {
		size = defaultMessageCacheSize
	}
	c, err := lru.New[uint64, cachedMessage](size)
	if err != nil {
		return nil
	}
	return &messageCache{seed: maphash.MakeSeed(), cache: c}
}

// message returns the conversation message for one raw messages element, from the
// cache when it has been converted before.
func (c *messageCache) message(raw []byte, openai bool) (jinja.Value, error) {
	cacheable := c != nil && len(raw) >= minCachedMessage && len(raw) <= maxCachedMessage
	var key uint64
	if cacheable {
		key = maphash.Bytes(c.seed, raw)
		if openai {
			key ^= 1
		}
		if e, ok := c.cache.Get(key); ok && e.openai == openai && bytes.Equal(e.raw, raw) {
			return e.msg, nil
		}
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
	if cacheable {
		c.cache.Add(key, cachedMessage{raw: bytes.Clone(raw), openai: openai, msg: msg})
	}
	return msg, nil
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
