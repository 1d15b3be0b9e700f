package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/testbench/sim"
)

// Tokenizer turns text into token ids exactly as vLLM's tokenizer for the model does.
type Tokenizer interface {
	Encode(text string, addSpecial bool) ([]uint32, error)
}

// ChatPrompter renders a chat request's template and tokenizes it as vLLM does.
type ChatPrompter interface {
	ChatTokens(req *openai.Request) ([]uint32, error)
}

// Options are the server's collaborators; all may be nil.
type Options struct {
	Logger *zap.Logger
	// Registry receives vLLM's metrics and is served on /metrics; nil uses a new one.
	Registry *prometheus.Registry
	// Tokenizer enables text prompts and /tokenize; Chat enables /v1/chat/completions.
	Tokenizer Tokenizer
	Chat      ChatPrompter
	// Now is the clock for created timestamps and latency metrics.
	Now func() time.Time
}

// Server is a simulated vLLM OpenAI-compatible server: one engine per data-parallel rank,
// each stepping in (scaled) real time and publishing its KV events. New starts nothing;
// Run starts the engine loops and publishers; Handler serves HTTP. Handler is safe for
// concurrent use.
type Server struct {
	cfg     Config
	opts    Options
	log     *zap.Logger
	reg     *prometheus.Registry
	ranks   []*rank
	metrics *metrics
	nextID  atomic.Uint64
	// text is each generated id's text when the engines draw from a vocabulary.
	text    map[uint32]string
	started time.Time
	// stallUntil (Unix ns) holds /metrics answers until then (a fault injection).
	stallUntil atomic.Int64
}

type rank struct {
	idx  int
	mu   sync.Mutex
	eng  *sim.Engine
	wake chan struct{}
	pub  *publisher
}

func (r *rank) stats() sim.Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Stats()
}

// New builds a server.
func New(cfg Config, opts Options) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, opts: opts, log: opts.Logger, reg: opts.Registry, started: opts.Now()}
	vocab, err := s.vocabulary()
	if err != nil {
		return nil, err
	}
	for i := range cfg.DataParallelSize {
		ec := cfg.Engine
		ec.Vocabulary = vocab
		ec.EnableEvents = cfg.KVEvents.EnableKVCacheEvents
		if !cfg.HashSeeded {
			ec.HashSeed = cfg.Engine.HashSeed + uint64(i)
		}
		e, err := sim.New(ec)
		if err != nil {
			return nil, err
		}
		r := &rank{idx: i, eng: e, wake: make(chan struct{}, 1)}
		if cfg.KVEvents.EnableKVCacheEvents && cfg.KVEvents.Publisher == "zmq" {
			r.pub = newPublisher(cfg.KVEvents, i, s.log)
		}
		s.ranks = append(s.ranks, r)
	}
	m, err := newMetrics(s, s.reg)
	if err != nil {
		return nil, fmt.Errorf("server: metrics: %w", err)
	}
	s.metrics = m
	return s, nil
}

// Run steps every engine and runs the publishers until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, r := range s.ranks {
		if r.pub != nil {
			g.Go(func() error { return r.pub.run(ctx) })
		}
		g.Go(func() error { s.loop(ctx, r); return nil })
	}
	return g.Wait()
}

// PublisherAddr waits until rank's publisher is up and returns the addresses its PUB and
// replay sockets are bound to (replay is "" without a replay endpoint), for endpoints
// given with port 0.
func (s *Server) PublisherAddr(ctx context.Context, rank int) (pub, replay string, err error) {
	if rank < 0 || rank >= len(s.ranks) || s.ranks[rank].pub == nil {
		return "", "", errors.New("server: no publisher for that rank")
	}
	p := s.ranks[rank].pub
	select {
	case <-p.ready:
	case <-ctx.Done():
		return "", "", ctx.Err()
	}
	p.addrMu.Lock()
	defer p.addrMu.Unlock()
	if p.repAdr != nil {
		replay = p.repAdr.String()
	}
	return p.addr.String(), replay, nil
}

func (s *Server) loop(ctx context.Context, r *rank) {
	timer := time.NewTimer(0)
	<-timer.C
	for {
		r.mu.Lock()
		d, ok := r.eng.Begin()
		r.mu.Unlock()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-r.wake:
				continue
			}
		}
		timer.Reset(time.Duration(d / s.cfg.TimeScale * float64(time.Second)))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		r.mu.Lock()
		res := r.eng.Complete()
		r.publish(s.opts.Now(), res.Events)
		r.mu.Unlock()
	}
}

// publish queues a batch of the rank's events (none: nothing). Called under r.mu, so
// that batches are queued in the engine's order whoever produced them (a step, or
// POST /reset_prefix_cache).
func (r *rank) publish(now time.Time, events []kvevents.Event) {
	if len(events) > 0 && r.pub != nil {
		r.pub.publish(kvevents.Batch{TS: float64(now.UnixNano()) / 1e9, Events: events,
			DPRank: r.idx, HasDPRank: true})
	}
}

// pick chooses the least loaded rank the way vLLM's DP coordinator scores engines
// (waiting x 4 + running).
func (s *Server) pick() *rank {
	best, bestScore := s.ranks[0], -1
	for _, r := range s.ranks {
		st := r.stats()
		if score := st.Waiting*4 + st.Running; bestScore < 0 || score < bestScore {
			best, bestScore = r, score
		}
	}
	return best
}

// Handler serves vLLM's HTTP API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		// A stalled endpoint (POST /debug/stall-metrics) answers nothing until the stall
		// ends or the client gives up.
		if d := time.Until(time.Unix(0, s.stallUntil.Load())); d > 0 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(d):
			}
		}
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /debug/cache", s.handleDebugCache)
	mux.HandleFunc("POST /debug/stall-metrics", s.handleStallMetrics)
	mux.HandleFunc("POST /debug/drop-kv-events", s.handleDropKVEvents)
	mux.HandleFunc("POST /debug/reset-kv-connections", s.handleResetKVConnections)
	mux.HandleFunc("POST /reset_prefix_cache", s.handleResetPrefixCache)
	return mux
}

// apiError is a vLLM error response.
type apiError struct {
	status int
	typ    string
	msg    string
}

func badRequest(format string, a ...any) *apiError {
	return &apiError{http.StatusBadRequest, "BadRequestError", fmt.Sprintf(format, a...)}
}

// errorBody is vLLM's ErrorInfo, in its field order.
type errorBody struct {
	Object  string `json:"object,omitempty"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}

func (s *Server) writeError(w http.ResponseWriter, e *apiError) {
	body := errorBody{Message: e.msg, Type: e.typ, Code: e.status}
	var out any = struct {
		Error errorBody `json:"error"`
	}{body}
	if s.cfg.LegacyErrors {
		body.Object = "error"
		out = body
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_ = json.NewEncoder(w).Encode(out)
}

// body is the part of a completions or chat request the simulator reads.
type body struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ChatTemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
	ChatTemplate        string          `json:"chat_template"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	ContinueFinalMsg    bool            `json:"continue_final_message"`
	AddSpecialTokens    *bool           `json:"add_special_tokens"`
	MaxTokens           optionalInt     `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	CacheSalt string `json:"cache_salt"`
	N         *int   `json:"n"`
}

// optionalInt is a member that may be absent, null or a number: vLLM tells absent (the
// field's default) from null (None).
type optionalInt struct {
	set bool // the member is present, null included
	n   *int // nil when absent or null
}

func (o *optionalInt) UnmarshalJSON(b []byte) error {
	o.set = true
	return json.Unmarshal(b, &o.n)
}

const maxBody = 32 << 20

func readBody(r *http.Request) (*body, *apiError) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return nil, badRequest("could not read the request body: %v", err)
	}
	if len(raw) > maxBody {
		return nil, badRequest("the request body exceeds %d bytes", maxBody)
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if b.N != nil && *b.N != 1 {
		return nil, badRequest("vllm-sim supports only n=1")
	}
	return &b, nil
}

// readRequest reads r's body and checks that it names the served model (or none); when
// either fails it answers the request with the error and returns nil.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request) *body {
	b, aerr := readBody(r)
	if aerr == nil {
		aerr = s.checkModel(b.Model)
	}
	if aerr != nil {
		s.writeError(w, aerr)
		return nil
	}
	return b
}

func (s *Server) checkModel(model string) *apiError {
	if model != "" && model != s.cfg.servedName() {
		return &apiError{http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model)}
	}
	return nil
}

// promptTokens reads a completions prompt: a string, a list of token ids, or a list
// holding exactly one of those.
func (s *Server) promptTokens(raw json.RawMessage, addSpecial bool) ([]uint32, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if s.opts.Tokenizer == nil {
			return nil, badRequest("text prompts need --tokenizer; send token ids instead")
		}
		ids, err := s.opts.Tokenizer.Encode(text, addSpecial)
		if err != nil {
			return nil, badRequest("tokenizing the prompt: %v", err)
		}
		return ids, nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil {
		return ids, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return nil, badRequest("vllm-sim accepts one prompt per request, got %d", len(list))
		}
		return s.promptTokens(list[0], addSpecial)
	}
	return nil, badRequest("prompt must be a string, a list of token ids, or a list of one of those")
}

// event is one step of a request's progress, delivered from the engine loop.
type event struct {
	tok    uint32
	cached int
	first  bool
	done   *sim.Result
}

// submitted is a request handed to an engine.
type submitted struct {
	id      string
	ch      chan event
	prompt  int
	start   time.Time
	rank    *rank
	created int64
}

func (s *Server) submit(prefix string, prompt []uint32, maxTokens int, salt string) (*submitted, *apiError) {
	id := fmt.Sprintf("%s-%016x", prefix, s.nextID.Add(1))
	r := s.pick()
	// Room for every token and the finish, so the engine loop never blocks; the engine
	// rejects max_tokens beyond max_model_len below.
	ch := make(chan event, min(maxTokens, s.cfg.Engine.MaxModelLen)+2)
	// FirstToken delivers the first token; Token delivers every later one.
	count := 0
	cb := sim.Callbacks{
		FirstToken: func(tok uint32, cached int) { ch <- event{tok: tok, cached: cached, first: true} },
		Token: func(tok uint32) {
			if count++; count > 1 {
				ch <- event{tok: tok}
			}
		},
		Finish: func(res sim.Result) { ch <- event{done: &res} },
	}
	now := s.opts.Now()
	r.mu.Lock()
	err := r.eng.AddRequestSalted(id, prompt, maxTokens, salt, cb)
	r.mu.Unlock()
	if err != nil {
		var re *sim.RequestError
		if errors.As(err, &re) {
			return nil, badRequest("%s", re.Msg)
		}
		return nil, &apiError{http.StatusInternalServerError, "InternalServerError", err.Error()}
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return &submitted{id: id, ch: ch, prompt: len(prompt), start: now, rank: r, created: now.Unix()}, nil
}

func (s *Server) abort(sub *submitted) {
	sub.rank.mu.Lock()
	sub.rank.eng.Abort(sub.id)
	sub.rank.mu.Unlock()
}

// observe records latency metrics in simulated seconds.
func (s *Server) observe(sub *submitted, first bool) {
	el := s.opts.Now().Sub(sub.start).Seconds() * s.cfg.TimeScale
	h := s.metrics.e2e
	if first {
		h = s.metrics.ttft
	}
	h.WithLabelValues(s.cfg.servedName(), fmt.Sprint(sub.rank.idx)).Observe(el)
}

// observeOutput records a finished request's output tokens (vllm:request_generation_tokens).
func (s *Server) observeOutput(sub *submitted, res *sim.Result) {
	s.metrics.gen.WithLabelValues(s.cfg.servedName(), fmt.Sprint(sub.rank.idx)).Observe(float64(res.OutputTokens))
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (s *Server) usage(prompt, completion, cached int) *usage {
	u := &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	if s.cfg.EnablePromptTokensDetails && cached > 0 {
		u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	}
	return u
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	b := s.readRequest(w, r)
	if b == nil {
		return
	}
	addSpecial := b.AddSpecialTokens == nil || *b.AddSpecialTokens
	prompt, aerr := s.promptTokens(b.Prompt, addSpecial)
	if aerr != nil {
		s.writeError(w, aerr)
		return
	}
	// vLLM's CompletionRequest.max_tokens defaults to 16; an explicit null is None: up to
	// max_model_len, as chat's.
	maxTokens := openai.DefaultCompletionMaxTokens
	switch {
	case b.MaxTokens.n != nil:
		maxTokens = *b.MaxTokens.n
	case b.MaxTokens.set:
		maxTokens = s.cfg.Engine.MaxModelLen - len(prompt)
	}
	s.serve(w, r, b, prompt, maxTokens, false)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	b := s.readRequest(w, r)
	if b == nil {
		return
	}
	if s.opts.Chat == nil {
		s.writeError(w, badRequest("chat completions need --tokenizer (a chat template and tokenizer)"))
		return
	}
	if len(b.Messages) == 0 {
		s.writeError(w, badRequest("messages is required"))
		return
	}
	req := &openai.Request{Model: b.Model, Kind: openai.KindChat, Messages: b.Messages, Tools: b.Tools,
		ChatTemplateKwargs: b.ChatTemplateKwargs, ChatTemplate: b.ChatTemplate,
		AddGenerationPrompt:  b.AddGenerationPrompt == nil || *b.AddGenerationPrompt,
		ContinueFinalMessage: b.ContinueFinalMsg, AddSpecialTokens: b.AddSpecialTokens != nil && *b.AddSpecialTokens,
		Stream: b.Stream, CacheSalt: b.CacheSalt}
	prompt, err := s.opts.Chat.ChatTokens(req)
	if err != nil {
		s.writeError(w, badRequest("rendering the chat template: %v", err))
		return
	}
	maxTokens := s.cfg.Engine.MaxModelLen - len(prompt)
	if b.MaxCompletionTokens != nil {
		maxTokens = *b.MaxCompletionTokens
	} else if b.MaxTokens.n != nil {
		maxTokens = *b.MaxTokens.n
	}
	s.serve(w, r, b, prompt, maxTokens, true)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, b *body, prompt []uint32, maxTokens int, chat bool) {
	if maxTokens < 1 {
		s.writeError(w, badRequest("max_tokens must be at least 1, got %d.", maxTokens))
		return
	}
	prefix := "cmpl"
	if chat {
		prefix = "chatcmpl"
	}
	sub, aerr := s.submit(prefix, prompt, maxTokens, b.CacheSalt)
	if aerr != nil {
		s.writeError(w, aerr)
		return
	}
	includeUsage := b.StreamOptions != nil && b.StreamOptions.IncludeUsage
	if b.Stream {
		s.stream(w, r, sub, chat, includeUsage)
		return
	}
	var text strings.Builder
	var res *sim.Result
	for res == nil {
		select {
		case <-r.Context().Done():
			s.abort(sub)
			return
		case ev := <-sub.ch:
			if ev.done != nil {
				res = ev.done
				break
			}
			if ev.first {
				s.observe(sub, true)
			}
			text.WriteString(s.tokenText(ev.tok))
		}
	}
	s.observe(sub, false)
	s.observeOutput(sub, res)
	u := s.usage(res.PromptTokens, res.OutputTokens, res.CachedTokens)
	var out any
	if chat {
		out = reply(s, sub, "chat.completion", []chatChoice{{Message: &fullMessage{Role: "assistant", Content: text.String(), ToolCalls: []any{}},
			FinishReason: finishReason(res)}}, u)
	} else {
		out = reply(s, sub, "text_completion", []completionChoice{{Text: text.String(), FinishReason: finishReason(res)}}, u)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func finishReason(r *sim.Result) *string {
	reason := r.Reason
	return &reason
}

// response is the body of a completions or chat completions reply, or one chunk of a
// streamed one; C is the endpoint's choice type.
type response[C completionChoice | chatChoice] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

// reply is the response to sub: object names its kind, u (nil: none) its usage.
func reply[C completionChoice | chatChoice](s *Server, sub *submitted, object string, choices []C, u *usage) response[C] {
	return response[C]{ID: sub.id, Object: object, Created: sub.created, Model: s.cfg.servedName(), Choices: choices, Usage: u}
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *fullMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason"`
}

// chatMessage is a streamed delta.
type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// fullMessage is a non-streamed assistant message with vLLM's fields.
type fullMessage struct {
	Role             string `json:"role"`
	Content          string `json:"content"`
	Refusal          any    `json:"refusal"`
	Annotations      any    `json:"annotations"`
	Audio            any    `json:"audio"`
	FunctionCall     any    `json:"function_call"`
	ToolCalls        []any  `json:"tool_calls"`
	ReasoningContent any    `json:"reasoning_content"`
}

// stream writes Server-Sent Events as vLLM does: one chunk per token, the finish reason on
// the last token's chunk, a usage-only chunk when include_usage, then [DONE].
func (s *Server) stream(w http.ResponseWriter, r *http.Request, sub *submitted, chat, includeUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(v any) {
		raw, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", raw)
		if flusher != nil {
			flusher.Flush()
		}
	}
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
		send(reply(s, sub, object, []chatChoice{{Delta: &chatMessage{Role: "assistant", Content: ""}}}, nil))
	}
	chunk := func(text string, finish *string) any {
		if chat {
			return reply(s, sub, object, []chatChoice{{Delta: &chatMessage{Content: text}, FinishReason: finish}}, nil)
		}
		return reply(s, sub, object, []completionChoice{{Text: text, FinishReason: finish}}, nil)
	}
	// Hold one token back so the last token's chunk carries the finish reason.
	var pending *uint32
	for {
		select {
		case <-r.Context().Done():
			s.abort(sub)
			return
		case ev := <-sub.ch:
			if ev.done != nil {
				text := ""
				if pending != nil {
					text = s.tokenText(*pending)
				}
				send(chunk(text, finishReason(ev.done)))
				s.observe(sub, false)
				s.observeOutput(sub, ev.done)
				if includeUsage {
					u := s.usage(ev.done.PromptTokens, ev.done.OutputTokens, ev.done.CachedTokens)
					if chat {
						send(reply(s, sub, object, []chatChoice{}, u))
					} else {
						send(reply(s, sub, object, []completionChoice{}, u))
					}
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
				if flusher != nil {
					flusher.Flush()
				}
				return
			}
			if ev.first {
				s.observe(sub, true)
			}
			if pending != nil {
				send(chunk(s.tokenText(*pending), nil))
			}
			tok := ev.tok
			pending = &tok
		}
	}
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	out := map[string]any{"object": "list", "data": []any{map[string]any{
		"id": s.cfg.servedName(), "object": "model", "created": s.started.Unix(), "owned_by": "vllm",
		"root": s.cfg.Model, "parent": nil, "max_model_len": s.cfg.Engine.MaxModelLen,
	}}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	b := s.readRequest(w, r)
	if b == nil {
		return
	}
	var ids []uint32
	switch {
	case len(b.Messages) > 0:
		if s.opts.Chat == nil {
			s.writeError(w, badRequest("tokenizing messages needs --tokenizer"))
			return
		}
		req := &openai.Request{Model: b.Model, Kind: openai.KindChat, Messages: b.Messages, Tools: b.Tools,
			ChatTemplateKwargs: b.ChatTemplateKwargs, AddGenerationPrompt: b.AddGenerationPrompt == nil || *b.AddGenerationPrompt,
			AddSpecialTokens: b.AddSpecialTokens != nil && *b.AddSpecialTokens}
		var err error
		if ids, err = s.opts.Chat.ChatTokens(req); err != nil {
			s.writeError(w, badRequest("rendering the chat template: %v", err))
			return
		}
	default:
		var text string
		if err := json.Unmarshal(b.Prompt, &text); err != nil {
			s.writeError(w, badRequest("prompt must be a string"))
			return
		}
		if s.opts.Tokenizer == nil {
			s.writeError(w, badRequest("/tokenize needs --tokenizer"))
			return
		}
		var err error
		if ids, err = s.opts.Tokenizer.Encode(text, b.AddSpecialTokens == nil || *b.AddSpecialTokens); err != nil {
			s.writeError(w, badRequest("tokenizing: %v", err))
			return
		}
	}
	if ids == nil {
		ids = []uint32{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": s.cfg.Engine.MaxModelLen, "tokens": ids, "token_strs": nil})
}

// debugCache is GET /debug/cache: the prefix cache's truth, to compare with a router's
// index.
type debugCache struct {
	// CachedBlocks is the distinct block hashes cached, summed over the ranks.
	CachedBlocks int `json:"cached_blocks"`
	// KVBatches is, per rank, the KV-event batches numbered so far (the next sequence
	// number), sent or not; absent without a publisher. A subscriber whose last
	// sequence number is KVBatches-1 has seen everything.
	KVBatches []uint64 `json:"kv_batches,omitempty"`
}

func (s *Server) handleDebugCache(w http.ResponseWriter, _ *http.Request) {
	var c debugCache
	for _, r := range s.ranks {
		c.CachedBlocks += r.stats().CachedBlocks
		if r.pub != nil {
			c.KVBatches = append(c.KVBatches, r.pub.batches())
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

// handleResetPrefixCache is vLLM's POST /reset_prefix_cache (served by vLLM with
// VLLM_SERVER_DEV_MODE=1): every rank drops its prefix cache and publishes
// AllBlocksCleared. vLLM cannot reset while requests hold blocks and answers 200 anyway
// (it logs the failure); the sim says so with 409, so that a caller knows the cache was
// not reset.
func (s *Server) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	ok := true
	for _, r := range s.ranks {
		r.mu.Lock()
		if r.eng.ResetPrefixCache() {
			r.publish(s.opts.Now(), r.eng.TakeEvents())
		} else {
			ok = false
		}
		r.mu.Unlock()
	}
	if !ok {
		http.Error(w, "requests hold KV blocks: prefix cache not reset", http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// maxDropBatches bounds one drop-kv-events injection.
const maxDropBatches = 10000

// handleDropKVEvents makes every rank's publisher skip sending its next ?batches=N
// batches (at most 10,000) while numbering and buffering them for replay, as libzmq's
// PUB socket drops messages for a subscriber at the high-water mark: a fault the fault
// suite injects (a subscriber sees a sequence gap).
func (s *Server) handleDropKVEvents(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.URL.Query().Get("batches"))
	if err != nil || n < 0 || n > maxDropBatches {
		http.Error(w, "batches must be an integer in [0, 10000]", http.StatusBadRequest)
		return
	}
	if !s.hasPublisher() {
		http.Error(w, "no KV event publisher", http.StatusConflict)
		return
	}
	for _, rk := range s.ranks {
		if rk.pub != nil {
			rk.pub.dropNext(n)
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleResetKVConnections closes every rank's PUB socket, dropping the subscribers'
// connections, and opens it again on the same address with the sequence and replay
// buffer kept: the engine and its cache live on. This is the realistic form of "a
// publisher restarted without its pod": vLLM's publisher lives in the engine process and
// restarts only with it (a pod restart), while the connection between a subscriber and
// a live pod can be reset (a network fault, a proxy or conntrack timeout).
func (s *Server) handleResetKVConnections(w http.ResponseWriter, r *http.Request) {
	if !s.hasPublisher() {
		http.Error(w, "no KV event publisher", http.StatusConflict)
		return
	}
	for _, rk := range s.ranks {
		if rk.pub == nil {
			continue
		}
		if err := rk.pub.resetConnections(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) hasPublisher() bool {
	for _, r := range s.ranks {
		if r.pub != nil {
			return true
		}
	}
	return false
}

// maxStall bounds a metrics stall, so that a forgotten injection ends by itself.
const maxStall = time.Minute

// handleStallMetrics makes /metrics answer nothing for ?for=DURATION (at most a minute),
// as a stuck vLLM metrics endpoint does: a fault the fault suite injects.
func (s *Server) handleStallMetrics(w http.ResponseWriter, r *http.Request) {
	d, err := time.ParseDuration(r.URL.Query().Get("for"))
	if err != nil || d < 0 || d > maxStall {
		http.Error(w, "for must be a duration in [0, 1m]", http.StatusBadRequest)
		return
	}
	s.stallUntil.Store(time.Now().Add(d).UnixNano())
	w.WriteHeader(http.StatusNoContent)
}
