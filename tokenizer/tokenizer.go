package tokenizer

import (
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Tokenizer is a HuggingFace byte-level BPE tokenizer loaded from tokenizer.json. It is
// safe for concurrent use; its only mutable state is the segment cache.
type Tokenizer struct {
	model       bpeModel
	nfc         bool      // normalizer NFC
	split       splitKind // pre-tokenizer regex
	rawMatcher  *matcher  // added tokens matched before normalisation
	normMatcher *matcher  // added tokens with normalized=true, matched after it
	added       map[string]uint32
	pieces      []string // id -> raw bytes (vocabulary) or content (added token)

	prefix, suffix []uint32 // TemplateProcessing ids around the text

	bos, eos, chatTemplate string

	cache       *lru.Cache[string, []uint32]
	cacheMinLen int
	cacheMaxLen int
	counters    cacheCounters
	// seen is the cache's doorkeeper: a direct-mapped table of the hashes of segments
	// that missed once. A segment is memoised on its second miss, so text seen once (a
	// request's own user turn) is neither copied into the cache nor evicts the shared
	// system prompts. Lost updates between goroutines only delay an admission.
	seen     []atomic.Uint64
	seenSeed maphash.Seed
}

// seenSlots is the doorkeeper's size: hashes of the last few thousand distinct
// segments that missed.
const seenSlots = 4096

// Option configures a Tokenizer at load time.
type Option func(*options)

type options struct {
	cacheSize   int
	cacheMinLen int
	cacheMaxLen int
	metrics     *Metrics
	model       string
}

// Default segment cache settings: see WithSegmentCache.
const (
	DefaultCacheSize   = 256
	DefaultCacheMinLen = 64
	DefaultCacheMaxLen = 32 << 10
)

func defaultOptions() options {
	return options{cacheSize: DefaultCacheSize, cacheMinLen: DefaultCacheMinLen, cacheMaxLen: DefaultCacheMaxLen}
}

// WithSegmentCache sets how many text segments (the text between added tokens, such
// as a shared system prompt) the LRU memoises (a segment is admitted the second time it
// misses, so text seen once does not evict shared prompts), and the range of segment lengths in
// bytes worth caching: shorter ones are cheap to tokenize, longer ones would make the
// cache's memory unbounded in practice. Memory stays below about size x maxLen x 5
// bytes. size 0 disables the cache.
func WithSegmentCache(size, minLen, maxLen int) Option {
	return func(o *options) { o.cacheSize, o.cacheMinLen, o.cacheMaxLen = size, minLen, maxLen }
}

func (t *Tokenizer) initCache(o options) error {
	if o.cacheSize < 0 || o.cacheMinLen < 0 || o.cacheMaxLen < o.cacheMinLen {
		return fmt.Errorf("tokenizer: invalid segment cache: size %d, lengths %d..%d", o.cacheSize, o.cacheMinLen, o.cacheMaxLen)
	}
	t.cacheMinLen, t.cacheMaxLen = o.cacheMinLen, o.cacheMaxLen
	t.counters = newCacheCounters(o.metrics, o.model)
	if o.cacheSize == 0 {
		return nil
	}
	c, err := lru.New[string, []uint32](o.cacheSize)
	if err != nil {
		return fmt.Errorf("tokenizer: segment cache: %w", err)
	}
	t.cache = c
	t.seen = make([]atomic.Uint64, seenSlots)
	t.seenSeed = maphash.MakeSeed()
	return nil
}

// Derive returns a tokenizer that shares t's (immutable) vocabulary, merges and
// settings but has its own segment cache and metrics, configured by opts from the
// defaults. Deriving is cheap; loading is not.
func (t *Tokenizer) Derive(opts ...Option) (*Tokenizer, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	d := &Tokenizer{
		model: t.model, nfc: t.nfc, split: t.split, rawMatcher: t.rawMatcher, normMatcher: t.normMatcher,
		added: t.added, pieces: t.pieces, prefix: t.prefix, suffix: t.suffix,
		bos: t.bos, eos: t.eos, chatTemplate: t.chatTemplate,
	}
	if err := d.initCache(o); err != nil {
		return nil, err
	}
	return d, nil
}

// Encode returns the token ids of text exactly as HuggingFace tokenizers'
// encode(text, add_special_tokens) does. Added tokens in text (special or not) are
// recognised. Invalid UTF-8 is first replaced with U+FFFD, one per invalid run.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	return t.AppendEncode(nil, text, addSpecialTokens)
}

// AppendEncode appends the ids Encode returns for text to dst and returns the extended
// slice, so that a caller can reuse one buffer across requests. dst's contents are kept.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	out, _ := t.AppendEncodeMax(dst, text, addSpecialTokens, 0)
	return out
}

// AppendEncodeMax is AppendEncode stopping once maxTokens ids were appended (0: no
// limit): the ids appended are the first maxTokens of AppendEncode's, and complete is
// false when some were left out. Its cost is that of the text up to the limit (plus a
// linear scan of the rest for added tokens and normalisation), not of the whole text.
func (t *Tokenizer) AppendEncodeMax(dst []uint32, text string, addSpecialTokens bool, maxTokens int) (out []uint32, complete bool) {
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	// The encoders stop once out holds limit ids; limit is one past maxTokens, so that
	// more than maxTokens ids (then cut) tells that some were left out.
	limit := math.MaxInt
	want := len(text)/4 + len(t.prefix) + len(t.suffix) + 4
	if maxTokens > 0 {
		limit = len(dst) + maxTokens + 1
		want = min(want, maxTokens+1)
	}
	out = slices.Grow(dst, want)
	if addSpecialTokens {
		out = append(out, t.prefix...)
	}
	var buf [32]piece
	for _, p := range t.rawMatcher.split(text, buf[:0]) {
		if len(out) >= limit {
			break
		}
		if p.tok >= 0 {
			out = append(out, t.rawMatcher.tokens[p.tok].ID)
			continue
		}
		out = t.encodeSegment(p.text, out, limit)
	}
	if addSpecialTokens {
		out = append(out, t.suffix...)
	}
	if maxTokens > 0 && len(out)-len(dst) > maxTokens {
		return out[:len(dst)+maxTokens], false
	}
	return out, true
}

// encodeSegment appends the ids of text that holds no raw added token, through the
// segment cache, stopping at limit ids in out (a cut segment is not cached).
func (t *Tokenizer) encodeSegment(seg string, out []uint32, limit int) []uint32 {
	cacheable := t.cache != nil && len(seg) >= t.cacheMinLen && len(seg) <= t.cacheMaxLen
	if cacheable {
		ids, ok := t.cache.Get(seg)
		t.counters.count(ok)
		if ok {
			return append(out, ids...)
		}
	}
	start := len(out)
	out = t.encodeText(seg, out, limit)
	if cacheable && len(out) < limit && t.admit(seg) {
		t.cache.Add(strings.Clone(seg), slices.Clone(out[start:]))
	}
	return out
}

// admit reports whether seg, which just missed the cache, missed before (recently
// enough that its hash is still in the doorkeeper), and otherwise remembers it.
func (t *Tokenizer) admit(seg string) bool {
	h := maphash.String(t.seenSeed, seg) | 1 // 0 marks an empty slot
	slot := &t.seen[h%seenSlots]
	if slot.Load() == h {
		return true
	}
	slot.Store(h)
	return false
}

// encodeText normalises seg, splits it on normalized added tokens, pre-tokenises and
// applies BPE.
func (t *Tokenizer) encodeText(seg string, out []uint32, limit int) []uint32 {
	if t.nfc {
		seg = nfc(seg)
	}
	if t.normMatcher.empty() {
		return t.encodeWords(seg, out, limit)
	}
	var buf [8]piece
	for _, p := range t.normMatcher.split(seg, buf[:0]) {
		if len(out) >= limit {
			return out
		}
		if p.tok >= 0 {
			out = append(out, t.normMatcher.tokens[p.tok].ID)
			continue
		}
		out = t.encodeWords(p.text, out, limit)
	}
	return out
}

// encodeWords pre-tokenises s and appends the BPE ids of every piece, until out holds
// limit ids.
func (t *Tokenizer) encodeWords(s string, out []uint32, limit int) []uint32 {
	for i := 0; i < len(s) && len(out) < limit; {
		var e int
		switch t.split {
		case splitQwen2:
			e = matchQwen(s, i, 1)
		case splitLlama3:
			e = matchQwen(s, i, 3)
		case splitGPT2:
			e = matchGPT2(s, i)
		default:
			e = len(s)
		}
		out = t.model.encodeWord(s[i:e], out)
		i = e
	}
	return out
}

// Decode returns the text of ids: vocabulary tokens as their bytes, added tokens
// (special ones included) as their content, like HF's decode(ids,
// skip_special_tokens=False) with a ByteLevel decoder. Each run of bytes that is not
// valid UTF-8 becomes one U+FFFD (HF may emit one per invalid subsequence). Unknown
// ids are skipped.
func (t *Tokenizer) Decode(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		if int(id) < len(t.pieces) {
			b.WriteString(t.pieces[id])
		}
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD")
}

// TokenID returns the id of a token given as it appears in tokenizer.json: an added
// token's content, or a vocabulary entry in its byte-level form (e.g. "Ġthe").
func (t *Tokenizer) TokenID(tok string) (uint32, bool) {
	if id, ok := t.added[tok]; ok {
		return id, true
	}
	return t.vocabID(tok)
}

// ChatTemplate returns the Jinja chat template of tokenizer_config.json, or "".
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

// BOS returns the bos_token string of tokenizer_config.json, or "" when it is null.
func (t *Tokenizer) BOS() string { return t.bos }

// EOS returns the eos_token string of tokenizer_config.json, or "" when it is null.
func (t *Tokenizer) EOS() string { return t.eos }

// VocabSize returns one more than the largest token id, added tokens included.
func (t *Tokenizer) VocabSize() int { return len(t.pieces) }
