package openai

import "encoding/json"

// Request is the part of an OpenAI /v1/completions or /v1/chat/completions body that
// routing needs. Fields the router does not interpret stay in the raw body, which is
// forwarded unchanged.
//
// Messages, Tools and ChatTemplateKwargs are kept as raw JSON so that a chat template
// sees objects with their keys in request order, as vLLM (Python) does.
type Request struct {
	// Model is the served model name (a base model or a LoRA adapter name).
	Model string
	// Kind tells which endpoint the body was parsed for.
	Kind Kind

	// Prompt is set for completions: a string, a list of strings, a list of token ids or a
	// list of lists of token ids, as raw JSON.
	Prompt json.RawMessage

	// Messages, Tools and ChatTemplateKwargs are set for chat completions.
	//
	// Messages is a list Parse delimited but did not validate (its strings' quotes and
	// its brackets found, ValueEnd): whoever decodes it validates it, as the chat
	// template does, decoding each element or proving it byte-equal to one it decoded
	// before. A long conversation's history is most of its body, and validating it
	// here cost more than computing the turn's ids (BenchmarkTurnVsCold in prompt).
	// A body that is valid JSON but for its messages thus parses, and fails where the
	// messages are decoded.
	Messages           json.RawMessage
	Tools              json.RawMessage
	ChatTemplateKwargs json.RawMessage
	// ChatTemplate is a request-supplied template; non-empty means the router cannot
	// reproduce vLLM's rendering from the model's own template.
	ChatTemplate string
	// AddGenerationPrompt defaults to true when absent.
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// AddSpecialTokens is vLLM's add_special_tokens: true by default for completions,
	// false by default for chat.
	AddSpecialTokens bool

	// Stream and IncludeUsage (stream_options.include_usage) describe the response shape.
	Stream       bool
	IncludeUsage bool

	// CacheSalt is vLLM's cache_salt, folded into the first block's hash.
	CacheSalt string

	// ReasoningEffort is the chat request's reasoning_effort ("" when absent): vLLM
	// passes it to the chat template and derives enable_thinking from it.
	ReasoningEffort string
	// Documents is the chat request's documents array as raw JSON (nil when absent or
	// null): vLLM passes it to the chat template.
	Documents json.RawMessage
	// MaxTokens is the most output tokens the request allows: a chat body's
	// max_completion_tokens, else its max_tokens (vLLM's order), a completions body's
	// max_tokens, DefaultCompletionMaxTokens when that is absent; 0 when unknown: absent
	// on chat (vLLM then allows up to max_model_len), null, or not a positive integer
	// (vLLM answers that itself; the router only reads it as a bound).
	MaxTokens int
	// TruncatePromptTokens is vLLM's truncate_prompt_tokens (nil when absent): vLLM
	// keeps only that many prompt tokens, which changes the ids the pod caches.
	TruncatePromptTokens *int

	// modelAt and modelEnd delimit, in the parsed body, the "model" value read into
	// Model (the last "model" member, as vLLM's JSON decoder reads it): WithModel
	// replaces it.
	modelAt, modelEnd int
}

// WithModel returns a copy of body, the body r was parsed from, whose "model" is model:
// the value Model was read from is replaced and every other byte kept, so that the
// upstream reads model where the router read Model.
func (r *Request) WithModel(body []byte, model string) []byte {
	q, _ := json.Marshal(model) // a string always marshals
	out := make([]byte, 0, r.withModelLen(len(body), q))
	out = append(out, body[:r.modelAt]...)
	out = append(out, q...)
	return append(out, body[r.modelEnd:]...)
}

// WithModelLen is the length of WithModel(body, model) for a body of bodyLen bytes, known
// before the copy is made (the router reserves it in its body budget first).
func (r *Request) WithModelLen(bodyLen int, model string) int {
	q, _ := json.Marshal(model) // a string always marshals
	return r.withModelLen(bodyLen, q)
}

func (r *Request) withModelLen(bodyLen int, quoted []byte) int {
	return bodyLen - (r.modelEnd - r.modelAt) + len(quoted)
}

// Kind is the API a request body belongs to.
type Kind int

const (
	// KindUnknown is a body for another path (or none).
	KindUnknown Kind = iota
	// KindCompletions is /v1/completions.
	KindCompletions
	// KindChat is /v1/chat/completions.
	KindChat
)

// DefaultCompletionMaxTokens is the max_tokens vLLM applies to a /v1/completions body
// without one: its CompletionRequest.max_tokens defaults to 16, as OpenAI's legacy
// completions API (vllm/entrypoints/openai/protocol.py, later
// vllm/entrypoints/openai/completion/protocol.py). ChatCompletionRequest's max_tokens and
// max_completion_tokens default to None: up to max_model_len less the prompt.
const DefaultCompletionMaxTokens = 16
