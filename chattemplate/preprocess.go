package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// This file reproduces what vLLM does to a /v1/chat/completions body before it calls
// transformers' apply_chat_template (vLLM main as of 2026: ChatCompletionRequest's
// "before" validator, renderers/chat_utils parse_chat_message_content and
// _postprocess_messages, build_chat_params and merge_kwargs, and the tools'
// model_dump), and what pydantic's validation does to key order on the way.

// Reasons reported in UnsupportedError.Reason; stable labels for metrics.
const (
	ReasonMediaContent         = "media_content"
	ReasonRequestChatTemplate  = "request_chat_template"
	ReasonContinueFinalMessage = "continue_final_message"
	ReasonKwargsOverride       = "chat_template_kwargs_override"
	// ReasonTemplateRefused: the model's chat template uses a construct the engine
	// does not implement (see Template.Refusal); every chat request is routed by load.
	ReasonTemplateRefused = "chat_template_refused"
	// ReasonTemplateConstruct: this render reached an operation the engine does not
	// implement for its operands (a %-format flag, a str.format spec).
	ReasonTemplateConstruct = "chat_template_construct"
)

const (
	billingHeaderPrefix = "x-anthropic-billing-header"
	defaultToolType     = "function"
)

// mediaKeys are content-part types and keys that carry multimodal data.
var mediaKeys = []string{
	"image_url", "input_image", "image_embeds", "audio_embeds", "video_embeds",
	"prompt_embeds", "image_pil", "audio_url", "input_audio", "video_url", "file",
}

// textPartKey maps text-like part types to the field holding their text.
var textPartKey = map[string]string{
	"text": "text", "input_text": "text", "output_text": "text",
	"refusal": "refusal", "thinking": "thinking",
}

// consumedKwargs are apply_chat_template parameters: a chat_template_kwargs entry with
// one of these names is taken by the function and never reaches the template as a
// variable (documents and add_generation_prompt reach it under their own name).
var consumedKwargs = map[string]bool{
	"conversation": true, "tools": true, "chat_template": true, "add_generation_prompt": true,
	"continue_final_message": true, "tokenize": true, "padding": true, "truncation": true,
	"max_length": true, "return_tensors": true, "return_dict": true,
	"return_assistant_tokens_mask": true, "tokenizer_kwargs": true, "documents": true,
}

// rejectedKwargs make vLLM or transformers fail or use another template.
var rejectedKwargs = []string{"chat_template", "tokenize", "messages", "conversation", "tools"}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

func decodeField(name string, raw json.RawMessage) (jinja.Value, error) {
	if len(raw) == 0 {
		return jinja.None(), nil
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return jinja.Value{}, fmt.Errorf("%w: %s: %w", ErrBadRequest, name, err)
	}
	return v, nil
}

// elemBufs pools the raw elements of a messages array (*[][]byte): a long
// conversation has hundreds of messages, and growing the slice to hold them cost a
// few allocations per request.
var elemBufs sync.Pool

// maxPooledElems bounds the element slices kept for reuse.
const maxPooledElems = 1 << 14

// conversation turns the request's messages into vLLM's ConversationMessage list;
// openai selects vLLM's "openai" content format (content kept as a list of parts).
// Long messages come from cache when it is not nil, following the conversation's
// chain of cached messages where it can (messageCache.walk).
func conversation(raw json.RawMessage, openai bool, cache *messageCache) (jinja.Value, []*cachedMessage, error) {
	if cache != nil {
		if conv, entries, ok := cache.walk(raw, openai); ok {
			return jinja.ListOf(conv), entries, nil
		}
	}
	buf, _ := elemBufs.Get().(*[][]byte)
	if buf == nil {
		buf = new([][]byte)
	}
	elems, ok := splitArray(raw, (*buf)[:0])
	defer func() {
		if cap(elems) <= maxPooledElems {
			clear(elems) // no reference to the request kept
			*buf = elems[:0]
			elemBufs.Put(buf)
		}
	}()
	if !ok {
		// Not a well-formed array: decode it whole for the error.
		v, err := decodeField("messages", raw)
		if err != nil {
			return jinja.Value{}, nil, err
		}
		if v.Kind() != jinja.KindList {
			return jinja.Value{}, nil, badRequest("messages must be a list")
		}
		return jinja.Value{}, nil, badRequest("messages: malformed list")
	}
	conv := make([]jinja.Value, 0, len(elems))
	var entries []*cachedMessage
	if cache != nil {
		entries = make([]*cachedMessage, 0, len(elems))
	}
	for i, elem := range elems {
		out, e, err := cache.message(elem, openai)
		if err != nil {
			return jinja.Value{}, nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		conv = append(conv, out)
		if cache != nil {
			entries = append(entries, e)
		}
	}
	return jinja.ListOf(conv), entries, nil
}

func isNull(v jinja.Value) bool { return v.IsNone() || v.IsUndefined() }

func conversationMessage(msg *jinja.Dict, openai bool) (jinja.Value, error) {
	roleV, _ := dictGet(msg, "role")
	if roleV.Kind() != jinja.KindString {
		return jinja.Value{}, badRequest("role must be a string")
	}
	role := roleV.Str()
	// The request validator renames the deprecated reasoning_content to reasoning.
	reasoning, _ := dictGet(msg, "reasoning")
	if isNull(reasoning) {
		reasoning, _ = dictGet(msg, "reasoning_content")
	}

	var parts []jinja.Value
	var direct jinja.Value // string content that needs no parsing
	switch c, _ := dictGet(msg, "content"); c.Kind() {
	case jinja.KindUndefined, jinja.KindNone:
	case jinja.KindString:
		if !openai && !(role == "system" && strings.HasPrefix(c.Str(), billingHeaderPrefix)) {
			direct = c
			break
		}
		parts = []jinja.Value{jinja.DictValue(newDict("type", jinja.String("text"), "text", c))}
	case jinja.KindList:
		parts = c.List().Items
	default:
		return jinja.Value{}, badRequest("content must be a string, a list of parts or null")
	}
	if role == "system" {
		parts = stripBillingHeader(parts)
	}
	content := direct
	if content.IsUndefined() {
		var err error
		if content, err = parseParts(parts, openai); err != nil {
			return jinja.Value{}, err
		}
	}
	out := newDict("role", roleV, "content", content)

	switch role {
	case "assistant":
		if tc, ok := dictGet(msg, "tool_calls"); ok && !tc.IsNone() {
			calls, err := toolCalls(tc)
			if err != nil {
				return jinja.Value{}, err
			}
			if len(calls) > 0 { // an empty list is dropped
				dictSet(out, "tool_calls", jinja.ListOf(calls))
			}
		}
		if !isNull(reasoning) {
			if reasoning.Kind() != jinja.KindString {
				return jinja.Value{}, badRequest("reasoning must be a string")
			}
			dictSet(out, "reasoning", reasoning)
			dictSet(out, "reasoning_content", reasoning)
		}
	case "tool":
		if id, ok := dictGet(msg, "tool_call_id"); ok {
			dictSet(out, "tool_call_id", id)
		}
		dictSet(out, "content", toolContent(content))
	}
	if name, ok := dictGet(msg, "name"); ok && name.Kind() == jinja.KindString {
		dictSet(out, "name", name)
	}
	if task, ok := dictGet(msg, "task"); ok && task.Kind() == jinja.KindString {
		dictSet(out, "task", task)
	}
	if role == "developer" {
		tools, ok := dictGet(msg, "tools")
		if !ok {
			tools = jinja.None()
		}
		dictSet(out, "tools", tools)
	}
	return jinja.DictValue(out), nil
}

// stripBillingHeader drops Claude Code's per-request attribution line from system text.
func stripBillingHeader(parts []jinja.Value) []jinja.Value {
	out := make([]jinja.Value, 0, len(parts))
	for _, p := range parts {
		var text string
		var isText bool
		switch p.Kind() {
		case jinja.KindString:
			text, isText = p.Str(), true
		case jinja.KindDict:
			if t, _ := dictGet(p.Dict(), "type"); t.Kind() == jinja.KindString && t.Str() == "text" {
				text, isText = stringOf(p.Dict(), "text")
			}
		}
		if !isText || !strings.HasPrefix(text, billingHeaderPrefix) {
			out = append(out, p)
			continue
		}
		_, rest, _ := strings.Cut(text, "\n")
		if rest == "" {
			continue
		}
		if p.Kind() == jinja.KindString {
			out = append(out, jinja.String(rest))
			continue
		}
		cp := p.Dict().Clone()
		cp.Set("text", jinja.String(rest))
		out = append(out, jinja.DictValue(cp))
	}
	return out
}

func stringOf(d *jinja.Dict, key string) (string, bool) {
	v, _ := dictGet(d, key)
	return v.Str(), v.Kind() == jinja.KindString
}

// knownPartFields are the keys of vLLM's content-part types; others are copied into
// "openai"-format text parts as extra fields.
var knownPartFields = map[string]bool{
	"type": true, "text": true, "image_url": true, "input_audio": true, "file": true,
	"audio_url": true, "video_url": true, "refusal": true, "image_pil": true, "uuid": true,
	"image_embeds": true, "audio_embeds": true, "video_embeds": true, "data": true,
	"thinking": true, "closed": true, "name": true,
}

// parseParts applies vLLM's content parsing. In the "string" format (openai false) the
// text of every text-like part is kept, empty ones dropped, and the texts joined with
// "\n". In the "openai" format (templates that loop over content) content stays a list:
// {"type": "text", "text": ...} per text-like part (plus unknown fields), and
// {"type": "tool_reference", "name": ...}. Multimodal parts cannot be reproduced.
func parseParts(parts []jinja.Value, openai bool) (jinja.Value, error) {
	if !openai && len(parts) == 1 {
		// The common case: one text part (or a plain string content).
		if d := parts[0].Dict(); d != nil && d.Len() == 2 {
			if t, _ := d.Get("type"); t.Str() == "text" {
				if v, _ := d.Get("text"); v.Kind() == jinja.KindString {
					return v, nil
				}
			}
		}
	}
	var texts []string
	var items []jinja.Value
	for i, p := range parts {
		switch p.Kind() {
		case jinja.KindString:
			if openai {
				items = append(items, jinja.DictValue(newDict("type", jinja.String("text"), "text", p)))
			} else if p.Str() != "" {
				texts = append(texts, p.Str())
			}
			continue
		case jinja.KindDict:
			d := p.Dict()
			typ, _ := dictGet(d, "type")
			uuid, _ := dictGet(d, "uuid")
			if typ.Kind() == jinja.KindString && isNull(uuid) {
				t := typ.Str()
				if key, ok := textPartKey[t]; ok {
					v, _ := dictGet(d, key)
					if isNull(v) && (t == "text" || t == "refusal") {
						continue
					}
					if openai {
						if v.IsUndefined() {
							v = jinja.None()
						}
						nd := newDict("type", jinja.String("text"), "text", v)
						for _, pair := range d.Pairs() {
							if k := pair.Key.Str(); !knownPartFields[k] {
								dictSet(nd, k, pair.Value)
							}
						}
						items = append(items, jinja.DictValue(nd))
						continue
					}
					switch v.Kind() {
					case jinja.KindNone, jinja.KindUndefined:
					case jinja.KindString:
						if v.Str() != "" {
							texts = append(texts, v.Str())
						}
					default:
						return jinja.Value{}, badRequest("content[%d].%s must be a string", i, key)
					}
					continue
				}
				if t == "tool_reference" {
					name, _ := dictGet(d, "name")
					if name.IsUndefined() {
						name = jinja.None()
					}
					if openai {
						items = append(items, jinja.DictValue(newDict("type", jinja.String("tool_reference"), "name", name)))
					} else if name.Str() != "" {
						texts = append(texts, name.Str())
					}
					continue
				}
			}
			for _, k := range mediaKeys {
				if typ.Kind() == jinja.KindString && typ.Str() == k {
					return jinja.Value{}, &UnsupportedError{Reason: ReasonMediaContent}
				}
				if _, ok := dictGet(d, k); ok {
					return jinja.Value{}, &UnsupportedError{Reason: ReasonMediaContent}
				}
			}
			return jinja.Value{}, badRequest("content[%d]: unsupported part type %s", i, describe(typ))
		default:
			return jinja.Value{}, badRequest("content[%d] must be a string or an object", i)
		}
	}
	if openai {
		if items == nil {
			items = []jinja.Value{}
		}
		return jinja.ListOf(items), nil
	}
	return jinja.String(strings.Join(texts, "\n")), nil
}

func describe(v jinja.Value) string {
	if v.Kind() == jinja.KindString {
		return v.Str()
	}
	if v.IsUndefined() {
		return "<nil>"
	}
	s, _ := jinja.Dumps(v, jinja.DefaultDumpOptions())
	return s
}

// toolContent is vLLM's normalisation of a tool message's list content: all-text parts
// are joined with "\n" into a string; anything else keeps the list.
func toolContent(content jinja.Value) jinja.Value {
	l := content.List()
	if l == nil {
		return content
	}
	var texts []string
	for _, it := range l.Items {
		d := it.Dict()
		if d == nil {
			continue
		}
		if typ, _ := dictGet(d, "type"); typ.Str() != "text" || typ.Kind() != jinja.KindString {
			return content
		}
		s, _ := dictGet(d, "text")
		texts = append(texts, s.Str())
	}
	return jinja.String(strings.Join(texts, "\n"))
}

// toolCalls rebuilds an assistant message's tool calls as pydantic and
// _postprocess_messages leave them: keys in schema order (id, function{arguments,
// name}, type), arguments parsed from JSON into a dict, {} when empty, invalid or not
// an object.
func toolCalls(v jinja.Value) ([]jinja.Value, error) {
	list := v.List()
	if list == nil {
		return nil, badRequest("tool_calls must be a list")
	}
	out := make([]jinja.Value, 0, len(list.Items))
	for i, item := range list.Items {
		call := item.Dict()
		if call == nil {
			return nil, badRequest("tool_calls[%d] must be an object", i)
		}
		n := newDict()
		var fn *jinja.Dict
		for _, k := range []string{"id", "function", "type"} {
			val, ok := dictGet(call, k)
			if !ok {
				continue
			}
			if k == "function" {
				f := val.Dict()
				if f == nil {
					return nil, badRequest("tool_calls[%d].function must be an object", i)
				}
				fn = newDict()
				for _, fk := range []string{"arguments", "name"} {
					if fv, ok := dictGet(f, fk); ok {
						dictSet(fn, fk, fv)
					}
				}
				val = jinja.DictValue(fn)
			}
			dictSet(n, k, val)
		}
		typ, ok := dictGet(n, "type")
		if fn == nil || (ok && (typ.Kind() != jinja.KindString || typ.Str() != defaultToolType)) {
			return nil, badRequest("tool_calls[%d]: only function tool calls are supported", i)
		}
		args, _ := dictGet(fn, "arguments")
		dictSet(fn, "arguments", parseArguments(args))
		out = append(out, jinja.DictValue(n))
	}
	return out, nil
}

// parseArguments follows _postprocess_messages: falsy -> {}, a dict stays, a string is
// parsed as JSON and kept only if it is an object, anything else -> {}.
func parseArguments(v jinja.Value) jinja.Value {
	switch v.Kind() {
	case jinja.KindDict:
		if v.Dict().Len() == 0 {
			return jinja.DictValue(newDict())
		}
		return v
	case jinja.KindString:
		if v.Str() == "" {
			return jinja.DictValue(newDict())
		}
		parsed, err := decodeJSON([]byte(v.Str()))
		if err == nil && parsed.Kind() == jinja.KindDict {
			return parsed
		}
	}
	return jinja.DictValue(newDict())
}

// toolsDump is [tool.model_dump() for tool in request.tools] for vLLM's
// ChatCompletionToolsParam: {"type", "function": {"name", "description",
// "parameters"[, "strict"][, "defer_loading"]}[, "defer_loading"]}.
func toolsDump(raw json.RawMessage) (jinja.Value, error) {
	v, err := decodeField("tools", raw)
	if err != nil || v.IsNone() {
		return v, err
	}
	list := v.List()
	if list == nil {
		return jinja.Value{}, badRequest("tools must be a list")
	}
	out := make([]jinja.Value, 0, len(list.Items))
	for i, item := range list.Items {
		tool := item.Dict()
		if tool == nil {
			return jinja.Value{}, badRequest("tools[%d] must be an object", i)
		}
		typ := jinja.String(defaultToolType)
		if t, ok := dictGet(tool, "type"); ok {
			typ = t
		}
		if typ.Kind() != jinja.KindString || typ.Str() != defaultToolType {
			return jinja.Value{}, badRequest("tools[%d]: type must be \"function\"", i)
		}
		fv, _ := dictGet(tool, "function")
		f := fv.Dict()
		if f == nil {
			return jinja.Value{}, badRequest("tools[%d].function must be an object", i)
		}
		name, ok := dictGet(f, "name")
		if name.Kind() != jinja.KindString || !ok {
			return jinja.Value{}, badRequest("tools[%d].function.name must be a string", i)
		}
		desc, _ := dictGet(f, "description")
		if isNull(desc) {
			desc = jinja.None()
		} else if desc.Kind() != jinja.KindString {
			return jinja.Value{}, badRequest("tools[%d].function.description must be a string", i)
		}
		params, _ := dictGet(f, "parameters")
		if isNull(params) {
			params = jinja.None()
		} else if params.Kind() != jinja.KindDict {
			return jinja.Value{}, badRequest("tools[%d].function.parameters must be an object", i)
		}
		fd := newDict("name", name, "description", desc, "parameters", params)
		if strict, _ := dictGet(f, "strict"); !isNull(strict) {
			dictSet(fd, "strict", strict)
		}
		toolDefer, _ := dictGet(tool, "defer_loading")
		fnDefer, _ := dictGet(f, "defer_loading")
		if isNull(fnDefer) {
			fnDefer = toolDefer
		}
		if !isNull(fnDefer) {
			dictSet(fd, "defer_loading", fnDefer)
		}
		d := newDict("type", typ, "function", jinja.DictValue(fd))
		if !isNull(toolDefer) {
			dictSet(d, "defer_loading", toolDefer)
		}
		out = append(out, jinja.DictValue(d))
	}
	return jinja.ListOf(out), nil
}

// isUnset is merge_kwargs' test for values that do not override: None and "auto".
func isUnset(v jinja.Value) bool {
	return isNull(v) || (v.Kind() == jinja.KindString && v.Str() == "auto")
}

// mergeKwargs is vLLM's merge_kwargs: defaults, then every override that is set.
func mergeKwargs(defaults, overrides *jinja.Dict) *jinja.Dict {
	out := jinja.NewDict(defaults.Len() + overrides.Len())
	for _, p := range defaults.Pairs() {
		out.SetValue(p.Key, p.Value)
	}
	for _, p := range overrides.Pairs() {
		if !isUnset(p.Value) {
			out.SetValue(p.Key, p.Value)
		}
	}
	return out
}

func kwargsDict(name string, raw json.RawMessage) (*jinja.Dict, error) {
	v, err := decodeField(name, raw)
	if err != nil {
		return nil, err
	}
	switch v.Kind() {
	case jinja.KindNone:
		return newDict(), nil
	case jinja.KindDict:
		return v.Dict(), nil
	}
	return nil, badRequest("%s must be an object", name)
}
