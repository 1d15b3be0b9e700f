package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"unsafe"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/tokenizer"
)

// Reasons reported in UnsupportedError.Reason, besides chattemplate's.
const (
	// ReasonPromptBatch is a completions prompt holding several prompts: vLLM serves it
	// as a batch of sequences.
	ReasonPromptBatch = "prompt_batch"
	// ReasonNoTokenizer is a model whose tokenizer kind is not implemented.
	ReasonNoTokenizer = "unsupported_tokenizer"
	// ReasonKind is a request that is neither completions nor chat.
	ReasonKind = "unknown_endpoint"
	// ReasonTruncated is a prompt longer than its truncate_prompt_tokens: vLLM cuts it,
	// on a side that depends on the tokenizer and the request.
	ReasonTruncated = "truncate_prompt_tokens"
)

// UnsupportedError reports a request whose prompt ids cannot be reproduced exactly;
// the router should route it by load.
type UnsupportedError struct {
	// Reason is a short stable label for metrics.
	Reason string
	// Err is the underlying error, if any.
	Err error
}

// Error implements error.
func (e *UnsupportedError) Error() string {
	if e.Err != nil {
		return "prompt: unsupported request (" + e.Reason + "): " + e.Err.Error()
	}
	return "prompt: unsupported request: " + e.Reason
}

// Unwrap returns the underlying error.
func (e *UnsupportedError) Unwrap() error { return e.Err }

// UnknownModelError is returned by Registry for a model it has no files for.
type UnknownModelError struct {
	Model string
}

// Error implements error.
func (e *UnknownModelError) Error() string { return "prompt: unknown model " + strconv.Quote(e.Model) }

// ErrBadRequest is wrapped by errors for bodies vLLM itself rejects: the request fails
// wherever it goes.
var ErrBadRequest = errors.New("prompt: bad request")

// Builder computes vLLM's prompt token ids for one model. It is safe for concurrent use.
type Builder struct {
	tok     *tokenizer.Tokenizer
	tmpl    *chattemplate.Template
	metrics *Metrics
	// renders holds what a chat render reuses (*renderScratch): a 128k-token
	// conversation renders to ~600 KB, and allocating that afresh per request cost
	// about as much CPU as the whole incremental render.
	renders sync.Pool
}

// renderScratch is a render's buffer and the provenance of its text, which the
// template reports and the tokenizer takes: the history a conversation's turn
// re-sends is then checked once, by the message cache comparing its messages' bytes,
// rather than hashed again by the tokenizer (see chattemplate.Provenance).
//
// The render defers the bytes of the iterations it replays (prov.Deferred): the
// tokenizer takes the ids of the history they render from its cache and reads only
// what follows, so a long conversation's ~600 KB of history is not copied into text
// each turn; fill writes what the tokenizer does read (tokenizer.Provenance.Fill).
type renderScratch struct {
	text []byte
	prov chattemplate.Provenance
	// rendered is the render being encoded, fill (sc.fillFrom, bound once per
	// scratch rather than per request) writes its deferred bytes.
	rendered []byte
	fill     func(from int)
}

// testHookDeferred, set by the package's tests (nil otherwise), sees each render
// before it is encoded: they overwrite the deferred bytes, so that ids that depended
// on bytes never filled would differ from a builder's without caches.
var testHookDeferred func(rendered []byte, prov *chattemplate.Provenance)

func (sc *renderScratch) fillFrom(from int) { sc.prov.Fill(sc.rendered, from) }

// maxPooledText bounds the render buffers kept for reuse.
const maxPooledText = 8 << 20

// New returns a Builder for a model's tokenizer and chat template. tmpl may be nil
// for a model without one (chat requests then fail as they do in vLLM); metrics may be
// nil.
func New(tok *tokenizer.Tokenizer, tmpl *chattemplate.Template, metrics *Metrics) *Builder {
	return &Builder{tok: tok, tmpl: tmpl, metrics: metrics}
}

// PromptTokens returns exactly the prompt token ids vLLM computes for req:
// completions encode the prompt string (add_special_tokens, default true) or take
// token ids as given; chat renders the model's chat template and encodes the result
// (add_special_tokens, default false). Requests it cannot reproduce return
// *UnsupportedError; bodies vLLM rejects return an error wrapping ErrBadRequest.
func (b *Builder) PromptTokens(req *openai.Request) ([]uint32, error) {
	return b.AppendPromptTokens(nil, req, 0)
}

// AppendPromptTokens appends the ids PromptTokens returns for req to dst (which may be
// a buffer reused across requests) and returns the extended slice. On error it returns
// nil; dst's contents are then undefined past its length. maxTokens > 0 appends only
// the first maxTokens ids (a router needs no more than a KV cache or a context holds)
// and stops tokenizing there, so that a huge prompt costs what its prefix does.
func (b *Builder) AppendPromptTokens(dst []uint32, req *openai.Request, maxTokens int) ([]uint32, error) {
	return b.AppendPromptTokensPrefix(dst, req, maxTokens, nil)
}

// AppendPromptTokensPrefix is AppendPromptTokens that also fills p (when not nil) with
// the tokenizer's cached spans the appended ids start with (tokenizer.Prefix; empty when
// none), on which the router's policies keep the ids' block keys across a
// conversation's turns (index.PrefixedKeys).
func (b *Builder) AppendPromptTokensPrefix(dst []uint32, req *openai.Request, maxTokens int, p *tokenizer.Prefix) ([]uint32, error) {
	if p != nil {
		p.Reset()
	}
	ids, err := b.promptTokens(dst, req, maxTokens, p)
	if err != nil {
		if p != nil {
			p.Reset()
		}
		b.metrics.observe(err)
		return nil, err
	}
	return ids, nil
}

func (b *Builder) promptTokens(dst []uint32, req *openai.Request, maxTokens int, p *tokenizer.Prefix) ([]uint32, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: no request", ErrBadRequest)
	}
	var ids []uint32
	var err error
	complete := true
	switch req.Kind {
	case openai.KindCompletions:
		ids, complete, err = b.completion(dst, req, maxTokens, p)
	case openai.KindChat:
		ids, complete, err = b.chat(dst, req, maxTokens, p)
	default:
		return nil, &UnsupportedError{Reason: ReasonKind}
	}
	// truncate_prompt_tokens N >= 0 cuts longer prompts; -1 (cut to the context length)
	// only matters for prompts vLLM would otherwise reject.
	// A prompt cut at maxTokens may be longer than N: its prefix is then unknown too.
	if n := req.TruncatePromptTokens; err == nil && n != nil && *n >= 0 && (len(ids)-len(dst) > *n || !complete) {
		return nil, &UnsupportedError{Reason: ReasonTruncated}
	}
	return ids, err
}

func (b *Builder) chat(dst []uint32, req *openai.Request, maxTokens int, p *tokenizer.Prefix) ([]uint32, bool, error) {
	if b.tmpl == nil {
		if req.ChatTemplate != "" {
			return nil, false, &UnsupportedError{Reason: chattemplate.ReasonRequestChatTemplate}
		}
		return nil, false, fmt.Errorf("%w: model has no chat template", ErrBadRequest)
	}
	sc, _ := b.renders.Get().(*renderScratch)
	if sc == nil {
		sc = &renderScratch{prov: chattemplate.Provenance{Deferred: true}}
		sc.fill = sc.fillFrom
	}
	defer func() {
		sc.rendered = nil
		sc.prov.Reset() // drops its references to the stored iterations' outputs
		if cap(sc.text) <= maxPooledText && cap(sc.prov.Ends) <= maxPooledText/64 {
			b.renders.Put(sc)
		}
	}()
	rendered, err := b.tmpl.AppendRenderTraced(sc.text[:0], chattemplate.Input{
		Messages:             req.Messages,
		Tools:                req.Tools,
		ChatTemplateKwargs:   req.ChatTemplateKwargs,
		Documents:            req.Documents,
		ReasoningEffort:      req.ReasoningEffort,
		AddGenerationPrompt:  req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage,
		RequestTemplate:      req.ChatTemplate != "",
	}, &sc.prov)
	if err != nil {
		var unsupported *chattemplate.UnsupportedError
		var raised *chattemplate.TemplateError
		switch {
		case errors.As(err, &unsupported):
			return nil, false, &UnsupportedError{Reason: unsupported.Reason, Err: err}
		case errors.Is(err, chattemplate.ErrBadRequest), errors.As(err, &raised):
			return nil, false, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		return nil, false, fmt.Errorf("prompt: %w", err)
	}
	sc.text = rendered[:0]
	// The tokenizer keeps no reference to the text, so it may alias the buffer; the
	// deferred bytes it reads are written by sc.fill before it reads them.
	text := unsafe.String(unsafe.SliceData(rendered), len(rendered))
	sc.rendered = rendered
	if testHookDeferred != nil {
		testHookDeferred(rendered, &sc.prov)
	}
	var prov *tokenizer.Provenance
	if len(sc.prov.IDs) > 0 {
		prov = &tokenizer.Provenance{Start: sc.prov.Start, Ends: sc.prov.Ends, IDs: sc.prov.IDs, Fill: sc.fill}
	} else {
		sc.prov.Fill(rendered, 0) // (none deferred without ids)
	}
	ids, complete := b.tok.AppendEncodeProvenance(dst, text, req.AddSpecialTokens, maxTokens, p, prov)
	return ids, complete, nil
}

func (b *Builder) completion(dst []uint32, req *openai.Request, maxTokens int, p *tokenizer.Prefix) ([]uint32, bool, error) {
	raw := bytes.TrimSpace(req.Prompt)
	if len(raw) == 0 {
		return nil, false, fmt.Errorf("%w: completions request without a prompt", ErrBadRequest)
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, false, fmt.Errorf("%w: prompt: %w", ErrBadRequest, err)
		}
		ids, complete := b.tok.AppendEncodePrefix(dst, s, req.AddSpecialTokens, maxTokens, p)
		return ids, complete, nil
	case '[':
	default:
		return nil, false, fmt.Errorf("%w: prompt must be a string or a list", ErrBadRequest)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, false, fmt.Errorf("%w: prompt: %w", ErrBadRequest, err)
	}
	if len(items) == 0 {
		return nil, false, fmt.Errorf("%w: empty prompt", ErrBadRequest)
	}
	switch bytes.TrimSpace(items[0])[0] {
	case '"', '[':
		// A list of prompts. vLLM serves several as a batch; a single one is that prompt.
		if len(items) > 1 {
			return nil, false, &UnsupportedError{Reason: ReasonPromptBatch}
		}
		one := *req
		one.Prompt = items[0]
		return b.completion(dst, &one, maxTokens, p)
	}
	ids := slices.Grow(dst, len(items))
	for i, it := range items {
		v, err := strconv.ParseUint(string(bytes.TrimSpace(it)), 10, 32)
		if err != nil {
			return nil, false, fmt.Errorf("%w: prompt[%d] is not a token id", ErrBadRequest, i)
		}
		ids = append(ids, uint32(v))
	}
	return ids, true, nil
}
