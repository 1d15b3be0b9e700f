// Package openai parses the OpenAI-compatible request bodies vLLM serves
// (/v1/completions, /v1/chat/completions) into what routing needs, and reads usage from
// their responses. Parsing never panics on bad input; errors carry a reason for metrics.
package openai
