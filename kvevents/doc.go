// Package kvevents receives vLLM's KV cache events over ZeroMQ and hands them, in order,
// to a Sink (the block index).
//
// It has three parts:
//   - Decode: a hand-written msgpack parser for vLLM's event batches in both encodings
//     (positional arrays up to vLLM 0.23, maps keyed by "type" since mid-2026), with
//     every block hash kind vLLM emits normalised to a uint64 handle. It reuses the
//     memory of the Batch it decodes into and allocates nothing per event in the steady
//     state besides growing output slices.
//   - Encode: the inverse, byte-compatible with vLLM's msgspec encoder, used by the fleet
//     simulator to publish events and by tests.
//   - Subscriber: one SUB socket per endpoint and data-parallel rank, with reconnection,
//     a watchdog, sequence-gap detection and recovery through vLLM's replay socket.
//
// Concurrency: Decode and Encode are pure functions of their arguments and safe to call
// concurrently on distinct Batches. A Subscriber's methods (Add, Remove, Status) are safe
// for concurrent use; Run starts one goroutine per endpoint and rank, and calls the Sink
// from those goroutines: Sink methods for one endpoint and rank are never called
// concurrently with each other and arrive in the publisher's order, while calls for
// different endpoints or ranks may run in parallel.
package kvevents
