// Package openai parses the OpenAI-compatible request bodies vLLM serves
// (/v1/completions, /v1/chat/completions) into what routing needs, and reads usage from
// their responses (a Server-Sent-Events stream or a plain JSON body). Parsing never
// panics on bad input and never modifies the body; errors are *ParseError with a Reason
// for metrics.
//
// Concurrency: Parse is safe for concurrent use. A UsageReader belongs to one response and
// must not be shared between goroutines.
package openai
