// Package prompt computes, for an OpenAI request, exactly the prompt token ids vLLM
// will compute: completions prompts are encoded (add_special_tokens, default true) or
// taken as token ids; chat requests are rendered with the model's chat template
// (package chattemplate) and encoded (add_special_tokens, default false). Registry
// serves several base models, loading each model's tokenizer files once.
//
// Requests whose ids cannot be reproduced exactly return *UnsupportedError (route
// them by load); bodies vLLM rejects return errors wrapping ErrBadRequest. Both are
// counted in Metrics.
//
// TokenizeLines is the logic of `kvrouter tokenize`.
//
// Concurrency: Builder and Registry are safe for concurrent use; Registry loads a
// model at most once, on first use or in LoadAll. Nothing here logs or starts
// goroutines.
package prompt
