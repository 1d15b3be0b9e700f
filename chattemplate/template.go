package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"
	"unsafe"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// ErrBadRequest is wrapped by errors for request bodies vLLM itself rejects (invalid
// JSON, a message without a role, a malformed tool call): the request fails wherever
// it is routed.
var ErrBadRequest = errors.New("chattemplate: bad request")

// UnsupportedError reports a request the renderer cannot reproduce byte for byte (for
// example an image part, a template supplied with the request, or a chat template the
// engine refuses). The router should route such requests by load.
type UnsupportedError struct {
	// Reason is a short stable label (one of the Reason constants) for metrics.
	Reason string
	// Err is the underlying cause, when there is one (the construct the engine
	// refused).
	Err error
}

// Error implements error.
func (e *UnsupportedError) Error() string {
	if e.Err != nil {
		return "chattemplate: unsupported request: " + e.Reason + ": " + e.Err.Error()
	}
	return "chattemplate: unsupported request: " + e.Reason
}

// Unwrap returns the underlying cause.
func (e *UnsupportedError) Unwrap() error { return e.Err }

// RefusedError reports a chat template the engine refuses at compile time: it uses a
// construct (a tag, filter, test or method) outside the Jinja2 subset implemented here
// (internal/jinja/README.md), or it does not parse. Such a template is never rendered
// differently from Jinja2: every request it would render returns *UnsupportedError
// (ReasonTemplateRefused) and is routed by load.
type RefusedError struct {
	// Template is which of the model's templates: "default" or "tool_use".
	Template string
	// Construct names what the engine refused, e.g. "filter 'wordwrap'"; empty for a
	// syntax error.
	Construct string
	// Err is the engine's error (with the line for a syntax error).
	Err error
}

// Error implements error.
func (e *RefusedError) Error() string {
	return "chattemplate: " + e.Template + " chat template refused: " + e.Err.Error()
}

// Unwrap returns the engine's error.
func (e *RefusedError) Unwrap() error { return e.Err }

// TemplateError is raised by the template itself through raise_exception, as vLLM
// would report it (HTTP 400).
type TemplateError struct {
	Message string
}

// Error implements error.
func (e *TemplateError) Error() string { return "chattemplate: template raised: " + e.Message }

// Options configure a compiled template for one model.
type Options struct {
	// SpecialTokens are the variables transformers adds from the tokenizer's
	// special_tokens_map: bos_token, eos_token, unk_token, pad_token, ... (strings) and
	// additional_special_tokens ([]string). Absent keys are undefined in the template.
	SpecialTokens map[string]any
	// DefaultKwargs is the server's --default-chat-template-kwargs (a JSON object), merged
	// under each request's chat_template_kwargs as vLLM merges them.
	DefaultKwargs json.RawMessage
	// MessageCacheBytes bounds the memo of request messages converted for the
	// template (a conversation's history, a shared system prompt) and of their
	// rendered loop iterations (incremental rendering): 0 means
	// DefaultMessageCacheBytes, negative disables both.
	MessageCacheBytes int64
	// Metrics, when not nil, reports the message cache under the label Model.
	Metrics *Metrics
	// Model labels this template's metrics.
	Model string
	// Now is strftime_now's clock; nil means time.Now. vLLM renders with the pod's
	// local clock, so dates can only match when clocks and time zones agree.
	Now func() time.Time
}

// Input is the part of a chat request the template sees, as raw JSON so that objects
// keep their request key order.
type Input struct {
	// Messages is the request's messages array (required).
	Messages json.RawMessage
	// Tools is the request's tools array, or empty.
	Tools json.RawMessage
	// ChatTemplateKwargs is the request's chat_template_kwargs object, or empty.
	ChatTemplateKwargs json.RawMessage
	// Documents is the request's documents array, or empty.
	Documents json.RawMessage
	// ReasoningEffort is the request's reasoning_effort ("" when absent); vLLM passes it
	// to the template and derives enable_thinking from it.
	ReasoningEffort string
	// AddGenerationPrompt is the request's add_generation_prompt (vLLM's default: true).
	AddGenerationPrompt bool
	// ContinueFinalMessage is the request's continue_final_message; unsupported.
	ContinueFinalMessage bool
	// RequestTemplate is true when the request carries its own chat_template;
	// unsupported.
	RequestTemplate bool
}

// Template is a compiled chat template. It is immutable after Compile; Render is safe
// for concurrent use.
type Template struct {
	main     compiled
	toolUse  *compiled // used when the request has tools, if the model defines one
	special  map[string]jinja.Value
	defaults *jinja.Dict
	now      func() time.Time
	messages *messageCache // nil: disabled
}

type compiled struct {
	tmpl          *jinja.Template // nil when refused
	refusal       *RefusedError   // why tmpl is nil
	openaiContent bool
}

// contentLoop finds `for x in message['content']`-style loops: vLLM then passes
// content as a list of parts (its "openai" content format). vLLM inspects the template's
// syntax tree for a loop over the content of a loop variable over messages; this
// pattern is the same test on the source text.
var contentLoop = regexp.MustCompile(`for\s+\w+\s+in\s+\w+(?:\.content\b|\[\s*['"]content['"]\s*\])`)

// Compile parses a Jinja chat template with the environment transformers uses:
// trim_blocks, lstrip_blocks, loop controls, transformers' tojson, raise_exception and
// strftime_now. A template using a construct the engine does not implement, or one it
// cannot parse, compiles to a Template that reports it in Refusal and answers every
// Render with *UnsupportedError (ReasonTemplateRefused), so its requests are routed by
// load rather than the router failing to start on a template it cannot check.
func Compile(src string, opts Options) (*Template, error) {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	defaults, err := kwargsDict("default chat template kwargs", opts.DefaultKwargs)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	t := &Template{
		special:  make(map[string]jinja.Value, len(opts.SpecialTokens)),
		defaults: defaults, now: now, messages: newMessageCache(opts.MessageCacheBytes, newCacheMetrics(opts.Metrics, opts.Model)),
	}
	for k, v := range opts.SpecialTokens {
		switch v := v.(type) {
		case string:
			t.special[k] = jinja.String(v)
		case []string:
			items := make([]jinja.Value, len(v))
			for i, s := range v {
				items[i] = jinja.String(s)
			}
			t.special[k] = jinja.ListOf(items)
		case []any:
			items := make([]jinja.Value, len(v))
			for i, s := range v {
				str, ok := s.(string)
				if !ok {
					return nil, fmt.Errorf("chattemplate: special token %s: list of non-strings", k)
				}
				items[i] = jinja.String(str)
			}
			t.special[k] = jinja.ListOf(items)
		default:
			return nil, fmt.Errorf("chattemplate: special token %s: %T is neither a string nor a list of strings", k, v)
		}
	}
	if t.main, err = t.compileSource(src, "default"); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Template) compileSource(src, name string) (compiled, error) {
	c := compiled{openaiContent: contentLoop.MatchString(src)}
	tmpl, err := jinja.Compile(src, jinja.Options{TrimBlocks: true, LStripBlocks: true, Globals: t.globals()})
	if err != nil {
		c.refusal = &RefusedError{Template: name, Err: err}
		var refused *jinja.UnsupportedError
		if errors.As(err, &refused) {
			c.refusal.Construct = refused.Construct
		}
		return c, nil
	}
	c.tmpl = tmpl
	return c, nil
}

// globals are transformers' raise_exception and strftime_now for the native engine.
func (t *Template) globals() map[string]jinja.Value {
	return map[string]jinja.Value{
		"raise_exception": jinja.FuncValue(func(args []jinja.Value, kwargs []jinja.KwArg) (jinja.Value, error) {
			if len(args) != 1 || len(kwargs) != 0 {
				return jinja.Value{}, errors.New("raise_exception() takes one argument")
			}
			msg, err := jinja.ToStr(args[0])
			if err != nil {
				return jinja.Value{}, err
			}
			return jinja.Value{}, &TemplateError{Message: msg}
		}),
		"strftime_now": jinja.FuncValue(func(args []jinja.Value, kwargs []jinja.KwArg) (jinja.Value, error) {
			if len(args) != 1 || len(kwargs) != 0 || args[0].Kind() != jinja.KindString {
				return jinja.Value{}, errors.New("strftime_now takes one string argument")
			}
			return jinja.String(strftime(t.now(), args[0].Str())), nil
		}),
	}
}

// Refusal reports why the engine refuses the model's chat template (its default
// template first, then its tool_use one), or nil when it renders them all. A refused
// template answers Render with *UnsupportedError (ReasonTemplateRefused); callers log
// the refusal once when they load the model.
func (t *Template) Refusal() *RefusedError {
	for _, c := range []*compiled{&t.main, t.toolUse} {
		if c != nil && c.refusal != nil {
			return c.refusal
		}
	}
	return nil
}

// CompileConfig compiles the chat template(s) of a tokenizer config. The config's
// special tokens are used unless opts.SpecialTokens is set. It returns ErrNoTemplate
// when the config defines none.
func CompileConfig(c *TokenizerConfig, opts Options) (*Template, error) {
	if c.Template == "" {
		return nil, ErrNoTemplate
	}
	if opts.SpecialTokens == nil {
		opts.SpecialTokens = c.SpecialTokens
	}
	t, err := Compile(c.Template, opts)
	if err != nil {
		return nil, err
	}
	if c.ToolUseTemplate != "" {
		tu, err := t.compileSource(c.ToolUseTemplate, "tool_use")
		if err != nil {
			return nil, err
		}
		t.toolUse = &tu
	}
	return t, nil
}

// Render renders the conversation as vLLM would before tokenizing it. Errors:
// *UnsupportedError for shapes it cannot reproduce, ErrBadRequest (wrapped) for bodies
// vLLM rejects, *TemplateError when the template raises.
func (t *Template) Render(in Input) (string, error) {
	out, err := t.AppendRender(make([]byte, 0, len(in.Messages)+len(in.Tools)+1024), in)
	if err != nil {
		return "", err
	}
	return unsafe.String(unsafe.SliceData(out), len(out)), nil // out is not used again
}

// AppendRender appends what Render renders to dst, which may be a buffer the caller
// reuses across requests (a long conversation renders to hundreds of KB): nothing
// keeps a reference to it. On error it returns nil.
func (t *Template) AppendRender(dst []byte, in Input) ([]byte, error) {
	return t.AppendRenderTraced(dst, in, nil)
}

// Provenance tells which of a render's output the template wrote from loop iterations
// it stored (its message cache's): from Start, the outputs of the iterations named by
// IDs, back to back, the i-th ending at Ends[i] (offsets from the start of what the
// render appended). An id names one immutable output and is never reused, so a
// render whose output agrees with an earlier one's up to Start and whose IDs agree with
// its IDs up to i has the same output up to Ends[i]: the caller may take what it
// derived from the earlier output's bytes up to there (prompt: the tokenizer's ids)
// without comparing them again.
type Provenance = jinja.Provenance

// AppendRenderTraced is AppendRender that also fills prov (when not nil; it is reset
// first, and left empty on error or with the message cache off) with the provenance of
// the output.
func (t *Template) AppendRenderTraced(dst []byte, in Input, prov *Provenance) ([]byte, error) {
	if prov != nil {
		prov.Reset()
	}
	if in.RequestTemplate {
		return nil, &UnsupportedError{Reason: ReasonRequestChatTemplate}
	}
	if in.ContinueFinalMessage {
		return nil, &UnsupportedError{Reason: ReasonContinueFinalMessage}
	}
	c := &t.main
	if t.toolUse != nil && hasValue(in.Tools) {
		c = t.toolUse
	}
	vars, err := t.variables(in, c.openaiContent)
	if err != nil {
		return nil, err
	}
	if c.tmpl == nil {
		return nil, &UnsupportedError{Reason: ReasonTemplateRefused, Err: c.refusal}
	}
	if need := renderSizeHint(in, vars); cap(dst)-len(dst) < need {
		dst = slices.Grow(dst, need) // once, rather than doubling through the render
	}
	var iterations jinja.IterationCache // nil: the message cache is off
	if t.messages != nil {
		iterations = &renderIterations{c: t.messages, entries: vars.entries}
	}
	out, stats, err := c.tmpl.RenderTraced(dst, vars, iterations, prov)
	if t.messages != nil {
		t.messages.counters.iterations(stats)
	}
	if err != nil {
		var raised *TemplateError
		if errors.As(err, &raised) {
			return nil, raised
		}
		// An operation the engine does not implement for these operands (a
		// %-format flag, a str.format spec): this one request is routed by load.
		var refused *jinja.UnsupportedError
		if errors.As(err, &refused) {
			return nil, &UnsupportedError{Reason: ReasonTemplateConstruct, Err: err}
		}
		return nil, fmt.Errorf("chattemplate: render: %w", err)
	}
	return out, nil
}

// messageFraming is what a template writes around each message beside its content:
// role headers and end-of-turn markers, ~50 bytes in Llama 3's (the longest of the test
// models'), against the ~30 the message's JSON keys and quotes take in the body.
const messageFraming = 64

// renderSizeHint is the room a render needs: the messages' and tools' JSON (decoded
// text is no longer than its JSON), each message's framing and 1 KiB for the template's
// own text. A buffer that grows through the render doubles each time, so a huge prompt
// would cost two to three times its size instead of once.
func renderSizeHint(in Input, vars *renderVars) int {
	n := len(in.Messages) + len(in.Tools) + 1024
	if l := vars.messages.List(); l != nil {
		n += messageFraming * len(l.Items)
	}
	return n
}

// renderVars is the template namespace transformers' render_jinja_template builds:
// special tokens, then the chat template kwargs, then messages, tools, documents and
// add_generation_prompt.
type renderVars struct {
	special                                         map[string]jinja.Value
	kwargs                                          *jinja.Dict
	messages, tools, documents, addGenerationPrompt jinja.Value
	entries                                         []*cachedMessage // the messages' cache entries (nil: not cached)
}

// Lookup implements jinja.Vars.
func (v *renderVars) Lookup(name string) (jinja.Value, bool) {
	switch name {
	case "messages":
		return v.messages, true
	case "tools":
		return v.tools, true
	case "documents":
		return v.documents, true
	case "add_generation_prompt":
		return v.addGenerationPrompt, true
	}
	if !consumedKwargs[name] {
		if val, ok := v.kwargs.Get(name); ok {
			return val, true
		}
	}
	val, ok := v.special[name]
	return val, ok
}

var emptyDict = jinja.NewDict(0)

// variables builds the render's variables; kwargs are merged as vLLM merges them.
func (t *Template) variables(in Input, openaiContent bool) (*renderVars, error) {
	user := emptyDict
	if hasValue(in.ChatTemplateKwargs) {
		var err error
		if user, err = kwargsDict("chat_template_kwargs", in.ChatTemplateKwargs); err != nil {
			return nil, err
		}
		for _, k := range rejectedKwargs {
			if _, ok := dictGet(user, k); ok {
				return nil, &UnsupportedError{Reason: ReasonKwargsOverride}
			}
		}
	}
	documents, err := decodeField("documents", in.Documents)
	if err != nil {
		return nil, err
	}
	kwargs := user
	if in.ReasoningEffort != "" || user.Len() > 0 || t.defaults.Len() > 0 || !documents.IsNone() {
		extra := newDict(
			"add_generation_prompt", jinja.Bool(in.AddGenerationPrompt),
			"continue_final_message", jinja.Bool(false),
			"documents", documents,
		)
		if in.ReasoningEffort != "" {
			dictSet(extra, "reasoning_effort", jinja.String(in.ReasoningEffort))
			if _, ok := dictGet(user, "enable_thinking"); !ok {
				dictSet(extra, "enable_thinking", jinja.Bool(in.ReasoningEffort != "none"))
			}
		}
		kwargs = mergeKwargs(user, extra)
		if t.defaults.Len() > 0 {
			kwargs = mergeKwargs(t.defaults, kwargs)
		}
		if d, ok := dictGet(kwargs, "documents"); ok {
			documents = d
		} else {
			documents = jinja.None()
		}
	}
	messages, entries, err := conversation(in.Messages, openaiContent, t.messages)
	if err != nil {
		return nil, err
	}
	tools, err := toolsDump(in.Tools)
	if err != nil {
		return nil, err
	}
	return &renderVars{
		special: t.special, kwargs: kwargs, messages: messages, tools: tools,
		documents: documents, addGenerationPrompt: jinja.Bool(in.AddGenerationPrompt),
		entries: entries,
	}, nil
}

// hasValue reports whether raw holds a JSON value other than null.
func hasValue(raw json.RawMessage) bool {
	trimmed := bytes.TrimSpace(raw)
	return len(trimmed) > 0 && !bytes.Equal(trimmed, []byte("null"))
}
