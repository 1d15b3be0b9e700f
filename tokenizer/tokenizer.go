package tokenizer

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Tokenizer is a HuggingFace byte-level BPE tokenizer loaded from tokenizer.json. It is
// safe for concurrent use; its only mutable state is the prefix cache.
type Tokenizer struct {
	model       bpeModel
	nfc         bool      // normalizer NFC
	split       splitKind // pre-tokenizer regex
	rawMatcher  *matcher  // added tokens matched before normalisation
	normMatcher *matcher  // added tokens with normalized=true, matched after it
	added       map[string]uint32
	addedByID   map[uint32]string // an added token's content by id (Decode)
	vocabSize   int               // one more than the largest id, added tokens included

	prefix, suffix []uint32 // TemplateProcessing ids around the text

	bos, eos, chatTemplate string

	// cut marks the raw added tokens text splits exactly before (see cutSafe), by index
	// in rawMatcher.tokens: where the prefix cache keys prefixes.
	cut []bool
	// inner marks the bytes some raw added token holds past its first byte: a cut
	// token starting with one of them could be straddled by a longer match, so the
	// prefix cache's walk takes no cut there (see walkCut). walkable is false when every
	// cut token starts with one.
	inner    [256]bool
	walkable bool
	cache    *prefixCache // nil: off
}

// Option configures a Tokenizer at load time.
type Option func(*options)

type options struct {
	cacheBytes int64
	metrics    *Metrics
	model      string
}

// DefaultPrefixCacheBytes bounds each tokenizer's prefix cache: 64 MiB holds about 14M
// tokens of conversation history (4 bytes an id plus a per-span overhead), e.g. a
// hundred 128k-token conversations, for a few percent of a router's memory.
const DefaultPrefixCacheBytes = 64 << 20

func defaultOptions() options {
	return options{cacheBytes: DefaultPrefixCacheBytes}
}

// WithPrefixCache bounds the memory of the prefix cache to maxBytes (ids at 4 bytes
// each plus a fixed overhead per cached span); 0 disables the cache. See the package
// README: the ids of a text's prefix ending before an added token such as
// <|im_start|> are memoised, so a conversation's next turn (or any request sharing a
// system prompt) tokenizes only what follows the longest cached prefix.
func WithPrefixCache(maxBytes int64) Option {
	return func(o *options) { o.cacheBytes = maxBytes }
}

func (t *Tokenizer) initCache(o options) error {
	if o.cacheBytes < 0 {
		return fmt.Errorf("tokenizer: invalid prefix cache size %d bytes", o.cacheBytes)
	}
	if t.rawMatcher != nil {
		t.cut = make([]bool, len(t.rawMatcher.tokens))
		for _, tk := range t.rawMatcher.tokens {
			for j := 1; j < len(tk.Content); j++ {
				t.inner[tk.Content[j]] = true
			}
		}
		for i, tk := range t.rawMatcher.tokens {
			t.cut[i] = cutSafe(tk)
			t.walkable = t.walkable || t.cut[i] && !t.inner[tk.Content[0]]
		}
	}
	t.cache = newPrefixCache(o.cacheBytes, newCacheCounters(o.metrics, o.model))
	return nil
}

// Derive returns a tokenizer that shares t's (immutable) vocabulary, merges and
// settings but has its own prefix cache and metrics, configured by opts from the
// defaults. Deriving is cheap; loading is not.
func (t *Tokenizer) Derive(opts ...Option) (*Tokenizer, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	d := &Tokenizer{
		model: t.model, nfc: t.nfc, split: t.split, rawMatcher: t.rawMatcher, normMatcher: t.normMatcher,
		added: t.added, addedByID: t.addedByID, vocabSize: t.vocabSize, prefix: t.prefix, suffix: t.suffix,
		bos: t.bos, eos: t.eos, chatTemplate: t.chatTemplate, cut: t.cut,
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
// With the prefix cache on, the ids of the longest cached prefix of text that ends
// before an added token are copied, and only the rest is tokenized.
func (t *Tokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	out, _ := t.AppendEncodeMax(dst, text, addSpecialTokens, 0)
	return out
}

// AppendEncodeMax is AppendEncode stopping once maxTokens ids were appended (0: no
// limit): the ids appended are the first maxTokens of AppendEncode's, and complete is
// false when some were left out. Its cost is that of the text up to the limit (plus a
// linear scan of the rest for added tokens and normalisation), not of the whole text.
// It keeps no reference to text once it returns, so text may alias a buffer the caller
// reuses (prompt renders chat templates into one).
func (t *Tokenizer) AppendEncodeMax(dst []uint32, text string, addSpecialTokens bool, maxTokens int) (out []uint32, complete bool) {
	return t.AppendEncodePrefix(dst, text, addSpecialTokens, maxTokens, nil)
}

// AppendEncodePrefix is AppendEncodeMax that also fills p (when not nil) with the
// prefix cache's spans the ids start with (see Prefix; none with the cache off), so
// that the caller can keep what it derives from those ids with them.
func (t *Tokenizer) AppendEncodePrefix(dst []uint32, text string, addSpecialTokens bool, maxTokens int, p *Prefix) (out []uint32, complete bool) {
	return t.AppendEncodeProvenance(dst, text, addSpecialTokens, maxTokens, p, nil)
}

// AppendEncodeProvenance is AppendEncodePrefix for a text whose provenance the caller
// knows (prov, when not nil: see Provenance), so that the prefix cache takes the ids of
// the part a previous encode with the same provenance stored without checking its
// bytes again. The ids are those AppendEncodePrefix returns whenever prov is true of
// text.
func (t *Tokenizer) AppendEncodeProvenance(dst []uint32, text string, addSpecialTokens bool, maxTokens int, p *Prefix, prov *Provenance) (out []uint32, complete bool) {
	if p != nil {
		p.Reset()
	}
	if t.cache == nil {
		prov.fill(0) // read from the start (encodeCached fills from where it reads)
	}
	if t.cache == nil && !utf8.ValidString(text) { // with the cache, encodeCached checks
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
	base := len(out)
	if addSpecialTokens {
		out = append(out, t.prefix...)
	}
	sc := splitScratches.Get().(*splitScratch)
	if t.cache == nil {
		sc.pieces = t.rawMatcher.splitWith(text, sc.pieces[:0], &sc.matches)
		out = t.encodePieces(sc.pieces, out, limit)
	} else {
		out = t.encodeCached(text, out, base, addSpecialTokens, limit, sc, p, prov)
	}
	sc.put(sc.pieces)
	if addSpecialTokens {
		out = append(out, t.suffix...)
	}
	if maxTokens > 0 && len(out)-len(dst) > maxTokens {
		return out[:len(dst)+maxTokens], false
	}
	return out, true
}

// splitScratch is the memory a split of a long text and its prefix-cache lookup
// need (a 128k-token conversation has thousands of added tokens), reused across
// encodes.
type splitScratch struct {
	pieces  []piece
	matches []addedMatch
	cuts    []cutPoint
	chain   []*span // spans walked
	found   []*span // spans looked up
	proofs  []proof // a provenance's boundaries
}

var splitScratches = sync.Pool{New: func() any { return new(splitScratch) }}

// maxPooledPieces bounds the scratch kept for reuse.
const maxPooledPieces = 1 << 16

// put returns the scratch to the pool, dropping its references to the text.
func (sc *splitScratch) put(pieces []piece) {
	if cap(pieces) > maxPooledPieces || cap(sc.matches) > maxPooledPieces || cap(sc.cuts) > maxPooledPieces || cap(sc.chain) > maxPooledPieces || cap(sc.found) > maxPooledPieces || cap(sc.proofs) > maxPooledPieces {
		return
	}
	clear(pieces)
	sc.pieces = pieces[:0]
	splitScratches.Put(sc)
}

// encodePieces appends the ids of the pieces of a raw added-token split, until out
// holds limit ids.
func (t *Tokenizer) encodePieces(pieces []piece, out []uint32, limit int) []uint32 {
	for _, p := range pieces {
		if len(out) >= limit {
			break
		}
		if p.tok >= 0 {
			out = append(out, t.rawMatcher.tokens[p.tok].ID)
			continue
		}
		out = t.encodeText(p.text, out, limit)
	}
	return out
}

// encodeText normalises seg, splits it on normalized added tokens, pre-tokenises and
// applies BPE, until out holds limit ids.
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
			break
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
		if s, ok := t.addedByID[id]; ok {
			b.WriteString(s)
		} else {
			b.WriteString(t.model.vocab.bytes(id))
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
func (t *Tokenizer) VocabSize() int { return t.vocabSize }
