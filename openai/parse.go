package openai

import (
	"errors"
	"fmt"
	"math"
	"strconv"
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

// Error returns "openai: <reason> (field <field>): <cause>".
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

// Unwrap returns the underlying decoder error.
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
// string is ignored). It never modifies body; the raw JSON fields of the returned Request
// are sub-slices of body, so body must not be modified while the Request is in use.
// Keys are matched exactly (case-sensitive), as vLLM's pydantic models do; a repeated key
// counts once, its last value winning, as in Python's json module. The body is validated
// (RFC 8259, UTF-8) except the chat messages list it returns, which is only delimited
// (see Request.Messages). Errors are always *ParseError.
func Parse(path string, body []byte) (*Request, error) {
	kind := KindOf(path)
	if kind == KindUnknown {
		return nil, &ParseError{Reason: ReasonUnsupportedPath}
	}
	// A chat body's messages list is delimited, not validated (see Request.Messages):
	// it is most of a long conversation's body, and the chat template validates it as
	// it reads it, mostly by comparing it with messages it decoded before.
	delimitKey := ""
	if kind == KindChat {
		delimitKey = "messages"
	}
	var top [16]member
	members, err := objectMembers(top[:0], body, delimitKey)
	if err != nil {
		if !utf8.Valid(body) {
			return nil, &ParseError{Reason: ReasonNonUTF8}
		}
		return nil, &ParseError{Reason: ReasonMalformedJSON, Err: err}
	}
	var f fields
	used := -1                // the member Request.Messages is: the last "messages", which wins
	modelAt, modelEnd := 0, 0 // the last "model" member's value: the one f.model holds
	for i, m := range members {
		f.set(m.key, m.raw)
		if delimitKey != "" && string(m.key) == delimitKey {
			used = i
		}
		if string(m.key) == "model" {
			modelAt, modelEnd = m.start, m.start+len(m.raw)
		}
	}
	// Everything but the messages Request carries is validated here: the UTF-8 of the
	// rest of the body, and any other delimited list (an earlier "messages").
	var valid bool
	if used >= 0 && members[used].delimited {
		m := members[used]
		valid = utf8.Valid(body[:m.start]) && utf8.Valid(body[m.start+len(m.raw):])
	} else {
		valid = utf8.Valid(body)
	}
	if !valid {
		return nil, &ParseError{Reason: ReasonNonUTF8}
	}
	for i, m := range members {
		if m.delimited && i != used {
			e, err := skipValue(m.raw, 0, 1)
			if err == nil && e != len(m.raw) {
				err = syntaxErr(m.start+e, "want ',' or ']'")
			}
			if err != nil {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "messages", Err: err}
			}
		}
	}
	req := &Request{Kind: kind, AddGenerationPrompt: true, AddSpecialTokens: kind == KindCompletions,
		modelAt: modelAt, modelEnd: modelEnd}

	if f.model == nil {
		return nil, &ParseError{Reason: ReasonMissingModel, Field: "model"}
	}
	if req.Model, err = asString(f.model); err != nil {
		return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "model", Err: err}
	}
	if req.Model == "" {
		return nil, &ParseError{Reason: ReasonMissingModel, Field: "model"}
	}

	switch kind {
	case KindCompletions:
		if f.prompt == nil {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "prompt", Err: errors.New("missing")}
		}
		if err := checkPrompt(f.prompt); err != nil {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "prompt", Err: err}
		}
		req.Prompt = f.prompt
	case KindChat:
		if f.messages == nil || f.messages[0] != '[' {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "messages", Err: errors.New("missing or not a list")}
		}
		req.Messages = f.messages
		if f.tools != nil {
			if f.tools[0] != '[' {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "tools", Err: errors.New("not a list")}
			}
			req.Tools = f.tools
		}
		if f.kwargs != nil {
			if f.kwargs[0] != '{' {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "chat_template_kwargs", Err: errors.New("not an object")}
			}
			req.ChatTemplateKwargs = f.kwargs
		}
		if f.template != nil {
			if req.ChatTemplate, err = asString(f.template); err != nil {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "chat_template", Err: err}
			}
		}
		if err := optBool(f.addGen, "add_generation_prompt", &req.AddGenerationPrompt); err != nil {
			return nil, err
		}
		if err := optBool(f.contFinal, "continue_final_message", &req.ContinueFinalMessage); err != nil {
			return nil, err
		}
		if f.effort != nil {
			if req.ReasoningEffort, err = asString(f.effort); err != nil {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "reasoning_effort", Err: err}
			}
		}
		if f.documents != nil {
			if f.documents[0] != '[' {
				return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "documents", Err: errors.New("not a list")}
			}
			req.Documents = f.documents
		}
	}
	req.MaxTokens = positiveInt(f.maxTokens)
	if n := positiveInt(f.maxCompletion); n > 0 && req.Kind == KindChat {
		req.MaxTokens = n
	}
	if req.Kind == KindCompletions && !f.hasMaxTokens {
		req.MaxTokens = DefaultCompletionMaxTokens
	}
	if f.truncate != nil {
		n, err := strconv.Atoi(string(f.truncate))
		if err != nil || n < -1 {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "truncate_prompt_tokens", Err: errors.New("want an integer >= -1")}
		}
		req.TruncatePromptTokens = &n
	}
	if err := optBool(f.addSpecial, "add_special_tokens", &req.AddSpecialTokens); err != nil {
		return nil, err
	}
	if err := optBool(f.stream, "stream", &req.Stream); err != nil {
		return nil, err
	}
	if f.streamOpts != nil {
		var opts [4]member
		so, err := objectMembers(opts[:0], f.streamOpts, "")
		if err != nil {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "stream_options", Err: err}
		}
		var inc []byte
		for _, m := range so {
			if string(m.key) == "include_usage" {
				inc = nonNull(m.raw)
			}
		}
		if err := optBool(inc, "stream_options.include_usage", &req.IncludeUsage); err != nil {
			return nil, err
		}
	}
	if f.salt != nil {
		if req.CacheSalt, err = asString(f.salt); err != nil {
			return nil, &ParseError{Reason: ReasonMalformedJSON, Field: "cache_salt", Err: err}
		}
	}
	return req, nil
}

// fields holds the raw values of the members Parse reads; nil means absent or null
// (pydantic treats an explicit null as "use the default" for these optional fields).
type fields struct {
	model, prompt, messages, tools, kwargs, template        []byte
	addGen, contFinal, addSpecial, stream, streamOpts, salt []byte
	effort, documents, truncate                             []byte
	maxTokens, maxCompletion                                []byte
	// hasMaxTokens: the body has a max_tokens member, null included (vLLM reads null as
	// None, not as CompletionRequest's default).
	hasMaxTokens bool
}

func nonNull(raw []byte) []byte {
	if string(raw) == "null" {
		return nil
	}
	return raw
}

func (f *fields) set(key []byte, raw []byte) {
	if string(key) == "max_tokens" {
		f.hasMaxTokens = true
	}
	raw = nonNull(raw)
	switch string(key) {
	case "model":
		f.model = raw
	case "prompt":
		f.prompt = raw
	case "messages":
		f.messages = raw
	case "tools":
		f.tools = raw
	case "chat_template_kwargs":
		f.kwargs = raw
	case "chat_template":
		f.template = raw
	case "add_generation_prompt":
		f.addGen = raw
	case "continue_final_message":
		f.contFinal = raw
	case "add_special_tokens":
		f.addSpecial = raw
	case "stream":
		f.stream = raw
	case "stream_options":
		f.streamOpts = raw
	case "cache_salt":
		f.salt = raw
	case "reasoning_effort":
		f.effort = raw
	case "documents":
		f.documents = raw
	case "truncate_prompt_tokens":
		f.truncate = raw
	case "max_tokens":
		f.maxTokens = raw
	case "max_completion_tokens":
		f.maxCompletion = raw
	}
}

// positiveInt returns raw, a validated JSON value, as an int when it is a positive
// integer (5 or 5.0, as pydantic's lax int accepts) up to 2^31-1, else 0.
func positiveInt(raw []byte) int {
	if len(raw) == 0 || !isDigit(raw[0]) {
		return 0
	}
	x, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || x < 1 || x > math.MaxInt32 || x != math.Trunc(x) {
		return 0
	}
	return int(x)
}

func optBool(raw []byte, field string, dst *bool) *ParseError {
	if raw == nil {
		return nil
	}
	v, err := asBool(raw)
	if err != nil {
		return &ParseError{Reason: ReasonMalformedJSON, Field: field, Err: err}
	}
	*dst = v
	return nil
}

// arrayItems returns the elements of a validated JSON array.
func arrayItems(raw []byte) ([][]byte, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, errors.New("want a list")
	}
	var items [][]byte
	i := skipWS(raw, 1)
	if raw[i] == ']' {
		return nil, nil
	}
	for {
		e, err := skipValue(raw, i, 1)
		if err != nil {
			return nil, err
		}
		items = append(items, raw[i:e])
		i = skipWS(raw, e)
		if raw[i] == ']' {
			return items, nil
		}
		i = skipWS(raw, i+1) // ','
	}
}

// isTokenID reports whether raw is a JSON integer in uint32 range.
func isTokenID(raw []byte) bool {
	if len(raw) == 0 || len(raw) > 10 {
		return false
	}
	for _, c := range raw {
		if !isDigit(c) {
			return false
		}
	}
	if len(raw) > 1 && raw[0] == '0' {
		return false
	}
	n, err := strconv.ParseUint(string(raw), 10, 32)
	return err == nil && n <= 1<<32-1
}

// checkPrompt accepts the four prompt forms: a string, a list of strings, a list of token
// ids, a list of lists of token ids (none of the lists empty).
func checkPrompt(raw []byte) error {
	if raw[0] == '"' {
		return nil
	}
	items, err := arrayItems(raw)
	if err != nil {
		return fmt.Errorf("want a string or a list: %w", err)
	}
	if len(items) == 0 {
		return errors.New("empty list")
	}
	switch items[0][0] {
	case '"':
		for _, it := range items {
			if it[0] != '"' {
				return errors.New("mixed list")
			}
		}
	case '[':
		for _, it := range items {
			ids, err := arrayItems(it)
			if err != nil {
				return fmt.Errorf("want lists of token ids: %w", err)
			}
			for _, id := range ids {
				if !isTokenID(id) {
					return errors.New("want lists of token ids")
				}
			}
		}
	default:
		for _, it := range items {
			if !isTokenID(it) {
				return errors.New("want token ids")
			}
		}
	}
	return nil
}
