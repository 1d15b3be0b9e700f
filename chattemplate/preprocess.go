package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
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

func decodeField(name string, raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadRequest, name, err)
	}
	return v, nil
}

// conversation turns the request's messages into vLLM's ConversationMessage list;
// openai selects vLLM's "openai" content format (content kept as a list of parts).
// Long messages come from cache when it is not nil.
func conversation(raw json.RawMessage, openai bool, cache *messageCache) ([]any, error) {
	elems, ok := splitArray(raw)
	if !ok {
		// Not a well-formed array: decode it whole for the error.
		v, err := decodeField("messages", raw)
		if err != nil {
			return nil, err
		}
		if _, isList := v.([]any); !isList {
			return nil, badRequest("messages must be a list")
		}
		return nil, badRequest("messages: malformed list")
	}
	conv := make([]any, 0, len(elems))
	for i, elem := range elems {
		out, err := cache.message(elem, openai)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		conv = append(conv, out)
	}
	return conv, nil
}

func conversationMessage(msg *exec.Dict, openai bool) (*exec.Dict, error) {
	roleV, _ := dictGet(msg, "role")
	role, ok := roleV.(string)
	if !ok {
		return nil, badRequest("role must be a string")
	}
	// The request validator renames the deprecated reasoning_content to reasoning.
	reasoning, _ := dictGet(msg, "reasoning")
	if reasoning == nil {
		reasoning, _ = dictGet(msg, "reasoning_content")
	}

	var parts []any
	switch c, _ := dictGet(msg, "content"); c := c.(type) {
	case nil:
	case string:
		parts = []any{newDict("type", "text", "text", c)}
	case []any:
		parts = c
	default:
		return nil, badRequest("content must be a string, a list of parts or null")
	}
	if role == "system" {
		parts = stripBillingHeader(parts)
	}
	content, err := parseParts(parts, openai)
	if err != nil {
		return nil, err
	}
	out := newDict("role", role, "content", content)

	switch role {
	case "assistant":
		if tc, ok := dictGet(msg, "tool_calls"); ok && tc != nil {
			calls, err := toolCalls(tc)
			if err != nil {
				return nil, err
			}
			if len(calls) > 0 { // an empty list is dropped
				dictSet(out, "tool_calls", calls)
			}
		}
		if reasoning != nil {
			if _, ok := reasoning.(string); !ok {
				return nil, badRequest("reasoning must be a string")
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
	if name, ok := dictGet(msg, "name"); ok {
		if s, ok := name.(string); ok {
			dictSet(out, "name", s)
		}
	}
	if task, ok := dictGet(msg, "task"); ok {
		if s, ok := task.(string); ok {
			dictSet(out, "task", s)
		}
	}
	if role == "developer" {
		tools, _ := dictGet(msg, "tools")
		dictSet(out, "tools", tools)
	}
	return out, nil
}

// stripBillingHeader drops Claude Code's per-request attribution line from system text.
func stripBillingHeader(parts []any) []any {
	out := make([]any, 0, len(parts))
	for _, p := range parts {
		var text string
		var isText bool
		switch p := p.(type) {
		case string:
			text, isText = p, true
		case *exec.Dict:
			if t, _ := dictGet(p, "type"); t == "text" {
				text, isText = stringOf(p, "text")
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
		if _, ok := p.(string); ok {
			out = append(out, rest)
			continue
		}
		d := p.(*exec.Dict)
		cp := &exec.Dict{Pairs: append([]*exec.Pair(nil), d.Pairs...)}
		for i, pair := range cp.Pairs {
			if pair.Key.String() == "text" {
				cp.Pairs[i] = &exec.Pair{Key: pair.Key, Value: exec.AsValue(rest)}
			}
		}
		out = append(out, cp)
	}
	return out
}

func stringOf(d *exec.Dict, key string) (string, bool) {
	v, _ := dictGet(d, key)
	s, ok := v.(string)
	return s, ok
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
func parseParts(parts []any, openai bool) (any, error) {
	var texts []string
	var items []any
	for i, p := range parts {
		switch p := p.(type) {
		case string:
			if openai {
				items = append(items, newDict("type", "text", "text", p))
			} else if p != "" {
				texts = append(texts, p)
			}
			continue
		case *exec.Dict:
			typ, _ := dictGet(p, "type")
			uuid, _ := dictGet(p, "uuid")
			if t, ok := typ.(string); ok && uuid == nil {
				if key, ok := textPartKey[t]; ok {
					v, _ := dictGet(p, key)
					if v == nil && (t == "text" || t == "refusal") {
						continue
					}
					if openai {
						d := newDict("type", "text", "text", v)
						for _, pair := range p.Pairs {
							if k := pair.Key.String(); !knownPartFields[k] {
								dictSet(d, k, pair.Value.Interface())
							}
						}
						items = append(items, d)
						continue
					}
					switch s := v.(type) {
					case nil:
					case string:
						if s != "" {
							texts = append(texts, s)
						}
					default:
						return nil, badRequest("content[%d].%s must be a string", i, key)
					}
					continue
				}
				if t == "tool_reference" {
					name, _ := dictGet(p, "name")
					if openai {
						items = append(items, newDict("type", "tool_reference", "name", name))
					} else if s, _ := name.(string); s != "" {
						texts = append(texts, s)
					}
					continue
				}
			}
			for _, k := range mediaKeys {
				if typ == k {
					return nil, &UnsupportedError{Reason: ReasonMediaContent}
				}
				if _, ok := dictGet(p, k); ok {
					return nil, &UnsupportedError{Reason: ReasonMediaContent}
				}
			}
			return nil, badRequest("content[%d]: unsupported part type %v", i, typ)
		default:
			return nil, badRequest("content[%d] must be a string or an object", i)
		}
	}
	if openai {
		if items == nil {
			items = []any{}
		}
		return items, nil
	}
	return strings.Join(texts, "\n"), nil
}

// toolContent is vLLM's normalisation of a tool message's list content: all-text parts
// are joined with "\n" into a string; anything else keeps the list.
func toolContent(content any) any {
	items, ok := content.([]any)
	if !ok {
		return content
	}
	var texts []string
	for _, it := range items {
		d, ok := it.(*exec.Dict)
		if !ok {
			continue
		}
		if typ, _ := dictGet(d, "type"); typ != "text" {
			return content
		}
		s, _ := dictGet(d, "text")
		str, _ := s.(string)
		texts = append(texts, str)
	}
	return strings.Join(texts, "\n")
}

// toolCalls rebuilds an assistant message's tool calls as pydantic and
// _postprocess_messages leave them: keys in schema order (id, function{arguments,
// name}, type), arguments parsed from JSON into a dict, {} when empty, invalid or not
// an object.
func toolCalls(v any) ([]any, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, badRequest("tool_calls must be a list")
	}
	out := make([]any, 0, len(list))
	for i, item := range list {
		call, ok := item.(*exec.Dict)
		if !ok {
			return nil, badRequest("tool_calls[%d] must be an object", i)
		}
		n := newDict()
		var fn *exec.Dict
		for _, k := range []string{"id", "function", "type"} {
			val, ok := dictGet(call, k)
			if !ok {
				continue
			}
			if k == "function" {
				f, isDict := val.(*exec.Dict)
				if !isDict {
					return nil, badRequest("tool_calls[%d].function must be an object", i)
				}
				fn = newDict()
				for _, fk := range []string{"arguments", "name"} {
					if fv, ok := dictGet(f, fk); ok {
						dictSet(fn, fk, fv)
					}
				}
				val = fn
			}
			dictSet(n, k, val)
		}
		typ, ok := dictGet(n, "type")
		if fn == nil || (ok && typ != defaultToolType) {
			return nil, badRequest("tool_calls[%d]: only function tool calls are supported", i)
		}
		args, _ := dictGet(fn, "arguments")
		dictSet(fn, "arguments", parseArguments(args))
		out = append(out, n)
	}
	return out, nil
}

// parseArguments follows _postprocess_messages: falsy -> {}, a dict stays, a string is
// parsed as JSON and kept only if it is an object, anything else -> {}.
func parseArguments(v any) any {
	switch a := v.(type) {
	case *exec.Dict:
		if len(a.Pairs) == 0 {
			return newDict()
		}
		return a
	case string:
		if a == "" {
			return newDict()
		}
		parsed, err := decodeJSON([]byte(a))
		if d, ok := parsed.(*exec.Dict); err == nil && ok {
			return d
		}
	}
	return newDict()
}

// toolsDump is [tool.model_dump() for tool in request.tools] for vLLM's
// ChatCompletionToolsParam: {"type", "function": {"name", "description",
// "parameters"[, "strict"][, "defer_loading"]}[, "defer_loading"]}.
func toolsDump(raw json.RawMessage) (any, error) {
	v, err := decodeField("tools", raw)
	if err != nil || v == nil {
		return nil, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, badRequest("tools must be a list")
	}
	out := make([]any, 0, len(list))
	for i, item := range list {
		tool, ok := item.(*exec.Dict)
		if !ok {
			return nil, badRequest("tools[%d] must be an object", i)
		}
		typ := any(defaultToolType)
		if t, ok := dictGet(tool, "type"); ok {
			typ = t
		}
		if typ != defaultToolType {
			return nil, badRequest("tools[%d]: type must be \"function\"", i)
		}
		fv, _ := dictGet(tool, "function")
		f, ok := fv.(*exec.Dict)
		if !ok {
			return nil, badRequest("tools[%d].function must be an object", i)
		}
		name, ok := stringOf(f, "name")
		if !ok {
			return nil, badRequest("tools[%d].function.name must be a string", i)
		}
		desc, _ := dictGet(f, "description")
		if _, isStr := desc.(string); desc != nil && !isStr {
			return nil, badRequest("tools[%d].function.description must be a string", i)
		}
		params, _ := dictGet(f, "parameters")
		if _, isDict := params.(*exec.Dict); params != nil && !isDict {
			return nil, badRequest("tools[%d].function.parameters must be an object", i)
		}
		fd := newDict("name", name, "description", desc, "parameters", params)
		if strict, _ := dictGet(f, "strict"); strict != nil {
			dictSet(fd, "strict", strict)
		}
		toolDefer, _ := dictGet(tool, "defer_loading")
		fnDefer, _ := dictGet(f, "defer_loading")
		if fnDefer == nil {
			fnDefer = toolDefer
		}
		if fnDefer != nil {
			dictSet(fd, "defer_loading", fnDefer)
		}
		d := newDict("type", typ, "function", fd)
		if toolDefer != nil {
			dictSet(d, "defer_loading", toolDefer)
		}
		out = append(out, d)
	}
	return out, nil
}

// isUnset is merge_kwargs' test for values that do not override: None and "auto".
func isUnset(v any) bool { return v == nil || v == "auto" }

// mergeKwargs is vLLM's merge_kwargs: defaults, then every override that is set.
func mergeKwargs(defaults, overrides *exec.Dict) *exec.Dict {
	out := &exec.Dict{Pairs: make([]*exec.Pair, 0, len(defaults.Pairs)+len(overrides.Pairs))}
	for _, p := range defaults.Pairs {
		dictSet(out, p.Key.String(), p.Value.Interface())
	}
	for _, p := range overrides.Pairs {
		if v := p.Value.Interface(); !isUnset(v) {
			dictSet(out, p.Key.String(), v)
		}
	}
	return out
}

func kwargsDict(name string, raw json.RawMessage) (*exec.Dict, error) {
	v, err := decodeField(name, raw)
	if err != nil {
		return nil, err
	}
	switch d := v.(type) {
	case nil:
		return newDict(), nil
	case *exec.Dict:
		return d, nil
	}
	return nil, badRequest("%s must be an object", name)
}
