package kvbench

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
)

// API is the OpenAI endpoint a workload's requests are written for.
type API string

const (
	// APICompletions sends /v1/completions requests whose prompt is prefix + tail.
	APICompletions API = "completions"
	// APIChat sends /v1/chat/completions requests with one user message whose content is
	// prefix + tail; the chat template adds its own tokens around it.
	APIChat API = "chat"
)

// WorkloadConfig describes the requests of one run. The zero value is not valid; start
// from DefaultWorkloadConfig.
type WorkloadConfig struct {
	// Prefixes is N, the number of distinct shared prefixes.
	Prefixes int
	// PrefixTokens (P) and TailTokens (T) are the token counts of each shared prefix and
	// of each request's unique tail.
	PrefixTokens int
	TailTokens   int
	// OutputTokens (O) is max_tokens of every request (with ignore_eos, the exact count).
	OutputTokens int
	// Requests are measured; Warmup requests run before them and are not (0 = measure
	// from empty caches).
	Requests int
	Warmup   int
	// Seed fixes the texts and the order of prefixes: the same seed gives the same
	// requests in the same order.
	Seed uint64
	// Zipf is the exponent s of the prefix popularity, P(k) proportional to 1/(k+1)^s;
	// 0 draws prefixes uniformly.
	Zipf float64
	// API selects completions or chat requests.
	API API
}

// DefaultWorkloadConfig returns the reference experiment's workload: 7 prefixes of 2,032
// tokens, 339-token tails (2,371 prompt tokens), uniform popularity, and 240 requests from
// empty caches (the reference's 5% of unavoidable misses at N=2 with 6 workers is 12/240).
// The reference did not publish its output length; 100 tokens is our assumption.
func DefaultWorkloadConfig() WorkloadConfig {
	return WorkloadConfig{
		Prefixes:     7,
		PrefixTokens: 2032,
		TailTokens:   339,
		OutputTokens: 100,
		Requests:     240,
		Warmup:       0,
		Seed:         1,
		API:          APICompletions,
	}
}

// Validate reports the first invalid field.
func (c WorkloadConfig) Validate() error {
	switch {
	case c.Prefixes < 1:
		return fmt.Errorf("kvbench: prefixes must be at least 1, got %d", c.Prefixes)
	case c.PrefixTokens < 1:
		return fmt.Errorf("kvbench: prefix tokens must be at least 1, got %d", c.PrefixTokens)
	case c.TailTokens < 1:
		return fmt.Errorf("kvbench: tail tokens must be at least 1 (tails make requests unique), got %d", c.TailTokens)
	case c.OutputTokens < 1:
		return fmt.Errorf("kvbench: output tokens must be at least 1, got %d", c.OutputTokens)
	case c.Requests < 1:
		return fmt.Errorf("kvbench: requests must be at least 1, got %d", c.Requests)
	case c.Warmup < 0:
		return fmt.Errorf("kvbench: warmup must not be negative, got %d", c.Warmup)
	case c.Zipf < 0 || math.IsNaN(c.Zipf) || math.IsInf(c.Zipf, 0):
		return fmt.Errorf("kvbench: zipf exponent must be 0 (uniform) or positive, got %v", c.Zipf)
	case c.API != APICompletions && c.API != APIChat:
		return fmt.Errorf("kvbench: api must be %q or %q, got %q", APICompletions, APIChat, c.API)
	}
	return nil
}

// Tokenizer turns text into token ids exactly as the served model does (for completions:
// with the model's special tokens added, which for Qwen3 adds none).
type Tokenizer interface {
	Encode(text string) ([]uint32, error)
}

// Request is one request of a workload.
type Request struct {
	// Seq is the request's position in dispatch order, warmup requests first.
	Seq int
	// Warmup is true for the requests sent before measuring.
	Warmup bool
	// Prefix is the index of the shared prefix, in [0, Prefixes).
	Prefix int
	// Tail is the request's unique text, TailTokens tokens long; TailIDs are its ids.
	Tail    string
	TailIDs []uint32
}

type word struct {
	text string
	id   uint32
}

// Workload is a deterministic list of requests. It is immutable once built and safe for
// concurrent use.
type Workload struct {
	cfg       WorkloadConfig
	prefixes  []string
	prefixIDs [][]uint32
	requests  []Request
}

// ErrTokenCount is returned when a text cannot be made to tokenize to the wanted count.
var ErrTokenCount = errors.New("kvbench: text does not tokenize to the wanted token count")

// NewWorkload builds the requests of cfg. Texts are made of words that Qwen3 encodes as
// one token each, so every prefix is exactly PrefixTokens tokens and every tail exactly
// TailTokens. With a tokenizer, the word list is first re-checked word by word (words that
// do not encode to one token are dropped, and the tokenizer's ids are used), then every
// prefix and tail is encoded and trimmed or extended until its count is exact; with nil,
// the ids are the embedded Qwen3 ones.
func NewWorkload(cfg WorkloadConfig, tok Tokenizer) (*Workload, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	words, err := wordList(tok)
	if err != nil {
		return nil, err
	}
	w := &Workload{cfg: cfg}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6b7662656e6368)) // "kvbench"

	// Prefixes must differ in their first block so no two share cached blocks; tails must
	// differ in their first block so every request has its own.
	seenPrefix := map[string]bool{}
	for k := 0; k < cfg.Prefixes; k++ {
		text, ids, err := uniqueText(rng, words, cfg.PrefixTokens, seenPrefix, tok)
		if err != nil {
			return nil, fmt.Errorf("kvbench: prefix %d: %w", k, err)
		}
		w.prefixes = append(w.prefixes, text)
		w.prefixIDs = append(w.prefixIDs, ids)
	}
	pick := prefixPicker(cfg.Prefixes, cfg.Zipf)
	seenTail := map[string]bool{}
	total := cfg.Warmup + cfg.Requests
	w.requests = make([]Request, total)
	for i := 0; i < total; i++ {
		p := pick(rng)
		text, ids, err := uniqueText(rng, words, cfg.TailTokens, seenTail, tok)
		if err != nil {
			return nil, fmt.Errorf("kvbench: tail of request %d: %w", i, err)
		}
		w.requests[i] = Request{Seq: i, Warmup: i < cfg.Warmup, Prefix: p, Tail: text, TailIDs: ids}
	}
	return w, nil
}

// Config returns the workload's configuration.
func (w *Workload) Config() WorkloadConfig { return w.cfg }

// Requests returns every request in dispatch order, warmup first. Callers must not
// modify the result.
func (w *Workload) Requests() []Request { return w.requests }

// PrefixText returns the text of prefix k.
func (w *Workload) PrefixText(k int) string { return w.prefixes[k] }

// PrefixIDs returns the token ids of prefix k; callers must not modify them.
func (w *Workload) PrefixIDs(k int) []uint32 { return w.prefixIDs[k] }

// Text returns the request's prompt text (completions) or message content (chat).
func (w *Workload) Text(r *Request) string { return w.prefixes[r.Prefix] + r.Tail }

// TokenIDs returns the prompt's token ids for completions: the prefix's then the tail's.
func (w *Workload) TokenIDs(r *Request) []uint32 {
	p := w.prefixIDs[r.Prefix]
	out := make([]uint32, 0, len(p)+len(r.TailIDs))
	return append(append(out, p...), r.TailIDs...)
}

// Body returns the JSON body of the request for model, streaming with usage.
// ignoreEOS asks vLLM for exactly OutputTokens tokens.
func (w *Workload) Body(r *Request, model string, ignoreEOS bool) []byte {
	body := map[string]any{
		"model":          model,
		"max_tokens":     w.cfg.OutputTokens,
		"temperature":    0,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if ignoreEOS {
		body["ignore_eos"] = true
	}
	if w.cfg.API == APIChat {
		body["messages"] = []map[string]string{{"role": "user", "content": w.Text(r)}}
	} else {
		body["prompt"] = w.Text(r)
	}
	b, _ := json.Marshal(body) // maps of strings, ints and bools always marshal
	return b
}

// Path returns the HTTP path of the workload's API.
func (w *Workload) Path() string {
	if w.cfg.API == APIChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// wordList returns the words to build texts from: the embedded Qwen3 list, re-checked with
// tok when there is one.
func wordList(tok Tokenizer) ([]word, error) {
	if tok == nil {
		return qwen3Words[:], nil
	}
	var out []word
	for _, wd := range qwen3Words {
		ids, err := tok.Encode(" " + wd.text)
		if err != nil {
			return nil, fmt.Errorf("kvbench: tokenizing word %q: %w", wd.text, err)
		}
		if len(ids) == 1 {
			out = append(out, word{wd.text, ids[0]})
		}
	}
	if len(out) < 64 {
		return nil, fmt.Errorf("kvbench: only %d of %d words are one token each with this tokenizer: %w",
			len(out), len(qwen3Words), ErrTokenCount)
	}
	return out, nil
}

// uniqueText draws n words whose first block (16 words) is not in seen, and records it.
func uniqueText(rng *rand.Rand, words []word, n int, seen map[string]bool, tok Tokenizer) (string, []uint32, error) {
	for attempt := 0; attempt < 100; attempt++ {
		var sb strings.Builder
		ids := make([]uint32, 0, n)
		var key strings.Builder
		for i := 0; i < n; i++ {
			wd := words[rng.IntN(len(words))]
			sb.WriteByte(' ')
			sb.WriteString(wd.text)
			ids = append(ids, wd.id)
			if i < 16 {
				key.WriteString(wd.text)
				key.WriteByte(' ')
			}
		}
		if seen[key.String()] {
			continue
		}
		seen[key.String()] = true
		text := sb.String()
		if tok == nil {
			return text, ids, nil
		}
		return fitText(text, n, words, rng, tok)
	}
	return "", nil, errors.New("kvbench: could not draw a unique text")
}

// fitText encodes text with tok and, should the count differ from n (a tokenizer that
// merges across words), drops or appends words until it is exact.
func fitText(text string, n int, words []word, rng *rand.Rand, tok Tokenizer) (string, []uint32, error) {
	for attempt := 0; attempt < 64; attempt++ {
		ids, err := tok.Encode(text)
		if err != nil {
			return "", nil, fmt.Errorf("tokenizing: %w", err)
		}
		switch {
		case len(ids) == n:
			return text, ids, nil
		case len(ids) > n:
			i := strings.LastIndexByte(text, ' ')
			if i <= 0 {
				return "", nil, fmt.Errorf("%w: want %d, got %d", ErrTokenCount, n, len(ids))
			}
			text = text[:i]
		default:
			text += " " + words[rng.IntN(len(words))].text
		}
	}
	return "", nil, fmt.Errorf("%w: want %d after trimming", ErrTokenCount, n)
}

// prefixPicker returns a function drawing a prefix index: uniform when s is 0, else
// Zipf(s) over ranks 1..n (prefix 0 the most popular).
func prefixPicker(n int, s float64) func(*rand.Rand) int {
	if s == 0 {
		return func(r *rand.Rand) int { return r.IntN(n) }
	}
	cdf := make([]float64, n)
	sum := 0.0
	for k := 0; k < n; k++ {
		sum += 1 / math.Pow(float64(k+1), s)
		cdf[k] = sum
	}
	for k := range cdf {
		cdf[k] /= sum
	}
	return func(r *rand.Rand) int {
		u := r.Float64()
		lo, hi := 0, n-1
		for lo < hi {
			mid := (lo + hi) / 2
			if cdf[mid] < u {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		return lo
	}
}
