// Package server serves simulated vLLM engines (package sim) the way `vllm serve` does:
// the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
// /tokenize, /health), vLLM's Prometheus metrics on /metrics, and KV cache events on a
// ZeroMQ PUB socket per data-parallel rank with an optional replay ROUTER socket.
//
// New builds a Server without starting anything; Run steps the engines in (scaled) real
// time and runs the publishers until its context ends; Handler is safe for concurrent use.
// Each engine is guarded by its own mutex; request progress reaches handlers through
// buffered channels that never block the engine loop.
package server
