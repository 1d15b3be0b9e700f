// Package sim simulates vLLM v1 engines faithfully enough for a router to be tested
// against them: the KV cache manager (16-token blocks, prefix caching by chained block
// hash, an LRU free queue filled tail first, reference counts, KV cache events), the
// scheduler (continuous batching under max_num_seqs and a per-step token budget with
// chunked prefill, running requests before waiting ones, preemption by recompute) and a
// step-time model with per-server speed.
//
// Engine has no clock, no sockets and no goroutines; it is not safe for concurrent use.
// Fleet drives several engines on a virtual clock (a discrete-event loop) for sweeps;
// package sim/server serves one engine over HTTP and ZeroMQ in real time.
package sim
