// Package kvevents receives vLLM's KV cache events over ZeroMQ and hands them, in order,
// to a Sink (the block index).
//
// It has three parts:
//   - Decode: a hand-written msgpack parser for vLLM's event batches in both encodings
//     (positional arrays up to vLLM 0.23, maps keyed by "type" since mid-2026), with
//     every block hash kind vLLM emits normalised to a uint64 handle. It reuses the
//     event structs and slices of earlier decodes into the same Batch: in the steady
//     state it allocates nothing (strings other than "GPU"/"CPU" and the cache-spec
//     kinds, such as LoRA names, are the exception).
//   - Encode: the inverse, byte-compatible with vLLM's msgspec encoder, used by the fleet
//     simulator to publish events and by tests.
//   - Subscriber: one SUB socket per endpoint and data-parallel rank, with reconnection,
//     a watchdog, sequence-gap detection and recovery through vLLM's replay socket.
//     In central mode (Config.Bind) it instead listens, and vLLM publishers connect to
//     it naming themselves in the topic kv@<ip:port>@<model> (CentralTopic); a small
//     ZMTP 3.0 reader, bounded and fuzzed, receives them, one goroutine per connection.
//
// Concurrency: Decode and Encode are safe to call concurrently on distinct Batches; a
// Batch must not be decoded into while its previous events are still in use. A Subscriber's methods (Add, Remove, Status) are safe
// for concurrent use; Run starts one goroutine per endpoint and rank, and calls the Sink
// from those goroutines: Sink methods for one endpoint and rank are never called
// concurrently with each other and arrive in the publisher's order, while calls for
// different endpoints or ranks may run in parallel (in central mode a stream's messages
// may arrive on any connection's goroutine, and a per-stream lock keeps them sequential).
// Remove returns after the endpoint's streams stopped and its ranks were cleared; no
// message is applied for it afterwards.
package kvevents
