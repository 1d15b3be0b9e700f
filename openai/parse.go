package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Reasons a body is not parsed; they label kvrouter_request_parse_errors_total.
const (
	ReasonMalformedJSON   = "malformed_json"
	ReasonMissingModel    = "missing_model"
	ReasonNonUTF8         = "non_utf8"
	ReasonTooLarge        = "too_large"
	ReasonUnsupportedPath = "unsupported_path"
)

// Paths of the APIs Parse understands.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
)

// ParseError says why a body could not be parsed. Reason is one of the Reason constants;
// callers route such requests by load and count Reason.
type ParseError struct {
	Reason string
	// Field names the offending field when one is to blame ("model", "messages", ...).
	Field string
	// Err is the underlying decoder error, if any.
	Err error
}

func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString("openai: ")
	b.WriteString(e.Reason)
	if e.Field != "" {
		b.WriteString(" (field ")
		b.WriteString(e.Field)
		b.WriteString(")")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *ParseError) Unwrap() error { return e.Err }

// KindOf tells which API path names, ignoring any query string. It returns KindUnknown
// for every other path.
func KindOf(path string) Kind {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case PathCompletions:
		return KindCompletions
	case PathChatCompletions:
		return KindChat
	}
	return KindUnknown
}

// Parse reads an OpenAI /v1/completions or /v1/chat/completions body sent to path (a query
// string is ignored). It never modifies body; the returned Request holds copies.
// Keys are matched exactly (case-sensitive), as vLLM's pydantic models do. Errors are
// always *ParseError.
func Parse(path string, body []byte) (*Request, error) {
	kind := KindOf(path)
	if kind == KindUnknown {
		return nil, &ParseError{Reason: ReasonUnsupportedPath}
	}
	if !utf8.Valid(body) {
		return nil, &ParseError{Reason: ReasonNonUTF8}
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, &ParseError{Reason: ReasonMalformedJSON, Err: err}
	}
	if top == nil { // the body was the JSON literal null
		return nil, &ParseError{Reason: ReasonMalformedJSON, Err: fmt.Errorf("body is not an object")}
	}
	req := &Request{Kind: kind, AddGenerationPrompt: true, AddSpecialTokens: kind == KindCompletions}

	rawModel, ok := present(top, "model")
	if !ok {
		return nil, &ParseError{Reason: ReasonMissingModel, Field: "model"}
	}
	if err := json.Unmarshal(rawModel, &req.Model); err != nil {
		return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "model", Err: err}
	}
	if req.Model == "" {
		return nil, &ParseError{Reason: ReasonMissingModel, Field: "model"}
	}

	switch kind {
	case KindCompletions:
		raw, ok := present(top, "prompt")
		if !ok {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "prompt", Err: fmt.Errorf("missing")}
		}
		if err := checkPrompt(raw); err != nil {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "prompt", Err: err}
		}
		req.Prompt = raw
	case KindChat:
		raw, ok := present(top, "messages")
		if !ok || firstByte(raw) != '[' {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "messages", Err: fmt.Errorf("missing or not a list")}
		}
		req.Messages = raw
		if raw, ok := present(top, "tools"); ok {
			if firstByte(raw) != '[' {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "tools", Err: fmt.Errorf("not a list")}
			}
			req.Tools = raw
		}
		if raw, ok := present(top, "chat_template_kwargs"); ok {
			if firstByte(raw) != '{' {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "chat_template_kwargs", Err: fmt.Errorf("not an object")}
			}
			req.ChatTemplateKwargs = raw
		}
		if err := optional(top, "chat_template", &req.ChatTemplate); err != nil {
			return nil, err
		}
		if err := optional(top, "add_generation_prompt", &req.AddGenerationPrompt); err != nil {
			return nil, err
		}
		if err := optional(top, "continue_final_message", &req.ContinueFinalMessage); err != nil {
			return nil, err
		}
	}
	if err := optional(top, "add_special_tokens", &req.AddSpecialTokens); err != nil {
		return nil, err
	}
	if err := optional(top, "stream", &req.Stream); err != nil {
		return nil, err
	}
	if raw, ok := present(top, "stream_options"); ok {
		var so map[string]json.RawMessage
		if err := json.Unmarshal(raw, &so); err != nil {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "stream_options", Err: err}
		}
		if err := optional(so, "include_usage", &req.IncludeUsage); err != nil {
			err.Field = "stream_options." + err.Field
			return nil, err
		}
	}
	if err := optional(top, "cache_salt", &req.CacheSalt); err != nil {
		return nil, err
	}
	return req, nil
}

// present returns the raw value of key unless it is absent or JSON null (pydantic treats
// an explicit null as "use the default" for the optional fields we read).
func present(m map[string]json.RawMessage, key string) (json.RawMessage, bool) {
	raw, ok := m[key]
	if !ok || bytes.Equal(raw, []byte("null")) {
		return nil, false
	}
	return raw, true
}

// optional decodes key into dst when it is present and not null.
func optional[T any](m map[string]json.RawMessage, key string, dst *T) *ParseError {
	raw, ok := present(m, key)
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return &ParseError{Reason: ReasonMalformedJSON, Field: key, Err: err}
	}
	return nil
}

func firstByte(raw json.RawMessage) byte {
	if len(raw) == 0 {
		return 0
	}
	return raw[0] // json.RawMessage from Unmarshal carries no leading whitespace
}

// checkPrompt accepts the four prompt forms: a string, a list of strings, a list of token
// ids, a list of lists of token ids.
func checkPrompt(raw json.RawMessage) error {
	switch firstByte(raw) {
	case '"':
		return nil
	case '[':
	default:
		return fmt.Errorf("want a string or a list")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return err
	}
	if len(items) == 0 {
		return fmt.Errorf("empty list")
	}
	switch firstByte(items[0]) {
	case '"':
		for _, it := range items {
			if firstByte(it) != '"' {
				return fmt.Errorf("mixed list")
			}
		}
		return nil
	case '[':
		var ids [][]uint32
		if err := json.Unmarshal(raw, &ids); err != nil {
			return fmt.Errorf("want lists of token ids: %w", err)
		}
		return nil
	default:
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err != nil {
			return fmt.Errorf("want token ids: %w", err)
		}
		return nil
	}
}
