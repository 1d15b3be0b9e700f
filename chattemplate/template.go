package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// ErrBadRequest is wrapped by errors for request bodies vLLM itself rejects (invalid
// JSON, a message without a role, a malformed tool call): the request fails wherever
// it is routed.
var ErrBadRequest = errors.New("chattemplate: bad request")

// UnsupportedError reports a request the renderer cannot reproduce byte for byte (for
// example an image part, or a template supplied with the request). The router should
// route such requests by load.
type UnsupportedError struct {
	// Reason is a short stable label (one of the Reason constants) for metrics.
	Reason string
}

// Error implements error.
func (e *UnsupportedError) Error() string {
	return "chattemplate: unsupported request: " + e.Reason
}

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
	// MessageCacheSize bounds the memo of long messages (1 KiB and more) converted
	// for the template, such as a shared system prompt: 0 means 128, negative disables.
	MessageCacheSize int
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
	special  map[string]any
	defaults *exec.Dict
	now      func() time.Time
	messages *messageCache // nil: disabled
}

type compiled struct {
	tmpl          *exec.Template
	openaiContent bool
}

// contentLoop finds `for x in message['content']`-style loops: vLLM then passes
// content as a list of parts (its "openai" content format). vLLM inspects the template's
// syntax tree for a loop over the content of a loop variable over messages; this
// pattern is the same test on the source text.
var contentLoop = regexp.MustCompile(`for\s+\w+\s+in\s+\w+(?:\.content\b|\[\s*['"]content['"]\s*\])`)

// Compile parses a Jinja chat template with the environment transformers uses:
// trim_blocks, lstrip_blocks, loop controls, transformers' tojson, raise_exception and
// strftime_now.
func Compile(src string, opts Options) (*Template, error) {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	env, err := newEnvironment(now)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: environment: %w", err)
	}
	defaults, err := kwargsDict("default chat template kwargs", opts.DefaultKwargs)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	main, err := compileSource(src, env)
	if err != nil {
		return nil, err
	}
	special := make(map[string]any, len(opts.SpecialTokens))
	for k, v := range opts.SpecialTokens {
		if list, ok := v.([]string); ok {
			items := make([]any, len(list))
			for i, s := range list {
				items[i] = s
			}
			v = items
		}
		special[k] = v
	}
	return &Template{main: main, special: special, defaults: defaults, now: now, messages: newMessageCache(opts.MessageCacheSize)}, nil
}

func compileSource(src string, env *exec.Environment) (compiled, error) {
	const id = "chat_template"
	t, err := exec.NewTemplate(id, engineConfig(), rootLoader{id: id, src: rewriteConditionals(src)}, env)
	if err != nil {
		return compiled{}, fmt.Errorf("chattemplate: compile: %w", err)
	}
	return compiled{tmpl: t, openaiContent: contentLoop.MatchString(src)}, nil
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
		env, err := newEnvironment(t.now)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: environment: %w", err)
		}
		tu, err := compileSource(c.ToolUseTemplate, env)
		if err != nil {
			return nil, fmt.Errorf("chattemplate: tool_use template: %w", err)
		}
		t.toolUse = &tu
	}
	return t, nil
}

// Render renders the conversation as vLLM would before tokenizing it. Errors:
// *UnsupportedError for shapes it cannot reproduce, ErrBadRequest (wrapped) for bodies
// vLLM rejects, *TemplateError when the template raises.
func (t *Template) Render(in Input) (string, error) {
	if in.RequestTemplate {
		return "", &UnsupportedError{Reason: ReasonRequestChatTemplate}
	}
	if in.ContinueFinalMessage {
		return "", &UnsupportedError{Reason: ReasonContinueFinalMessage}
	}
	c := t.main
	if t.toolUse != nil && hasValue(in.Tools) {
		c = *t.toolUse
	}
	vars, err := t.variables(in, c.openaiContent)
	if err != nil {
		return "", err
	}
	// raise_exception is bound per render so that the typed error survives the
	// engine, which reports function errors as text.
	var raised *TemplateError
	vars["raise_exception"] = func(va *exec.VarArgs) (any, error) {
		if raised == nil {
			raised = &TemplateError{Message: va.First().String()}
		}
		return nil, raised
	}
	out, err := execute(c.tmpl, vars)
	if err != nil {
		if raised != nil {
			return "", raised
		}
		return "", fmt.Errorf("chattemplate: render: %w", err)
	}
	return out, nil
}

// ErrEnginePanic is wrapped by the error Render returns when the template engine
// panicked (gonja does on some expressions, e.g. a Python-style '%s' % x formats as an
// integer modulo by zero). The panic is contained to the one request.
var ErrEnginePanic = errors.New("chattemplate: template engine panicked")

// execute runs the engine. gonja panics on some expressions whose operands come from
// the request, so a panic is turned into an error here rather than crashing the
// router: this is a guard around a third-party interpreter, not control flow.
func execute(t *exec.Template, vars map[string]any) (s string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrEnginePanic, r)
		}
	}()
	var out bytes.Buffer
	if err := t.Execute(&out, exec.NewContext(vars)); err != nil {
		return "", err
	}
	return out.String(), nil
}

// variables builds the template namespace as transformers' render_jinja_template
// does: special tokens, then the chat template kwargs, then messages, tools, documents
// and add_generation_prompt.
func (t *Template) variables(in Input, openaiContent bool) (map[string]any, error) {
	user, err := kwargsDict("chat_template_kwargs", in.ChatTemplateKwargs)
	if err != nil {
		return nil, err
	}
	for _, k := range rejectedKwargs {
		if _, ok := dictGet(user, k); ok {
			return nil, &UnsupportedError{Reason: ReasonKwargsOverride}
		}
	}
	documents, err := decodeField("documents", in.Documents)
	if err != nil {
		return nil, err
	}
	extra := newDict(
		"add_generation_prompt", in.AddGenerationPrompt,
		"continue_final_message", false,
		"documents", documents,
	)
	if in.ReasoningEffort != "" {
		dictSet(extra, "reasoning_effort", in.ReasoningEffort)
		if _, ok := dictGet(user, "enable_thinking"); !ok {
			dictSet(extra, "enable_thinking", in.ReasoningEffort != "none")
		}
	}
	kwargs := mergeKwargs(user, extra)
	if len(t.defaults.Pairs) > 0 {
		kwargs = mergeKwargs(t.defaults, kwargs)
	}

	messages, err := conversation(in.Messages, openaiContent, t.messages)
	if err != nil {
		return nil, err
	}
	tools, err := toolsDump(in.Tools)
	if err != nil {
		return nil, err
	}

	vars := make(map[string]any, len(t.special)+len(kwargs.Pairs)+4)
	for k, v := range t.special {
		vars[k] = v
	}
	for _, p := range kwargs.Pairs {
		if k := p.Key.String(); !consumedKwargs[k] {
			vars[k] = withNone(p.Value.Interface())
		}
	}
	vars["messages"] = withNone(messages)
	vars["tools"] = withNone(tools)
	documents, _ = dictGet(kwargs, "documents")
	vars["documents"] = withNone(documents)
	vars["add_generation_prompt"], _ = dictGet(kwargs, "add_generation_prompt")
	return vars, nil
}

// hasValue reports whether raw holds a JSON value other than null.
func hasValue(raw json.RawMessage) bool {
	trimmed := bytes.TrimSpace(raw)
	return len(trimmed) > 0 && !bytes.Equal(trimmed, []byte("null"))
}
