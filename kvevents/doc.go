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
//   - Subscriber: one dialled connection per endpoint and data-parallel rank, with
//     redials and backoff, a PING watchdog, sequence-gap detection and recovery through
//     vLLM's replay socket. In central mode (Config.Bind) it instead listens, and vLLM
//     publishers connect to it naming themselves in the topic kv@<ip:port>@<model>
//     (CentralTopic), one goroutine per connection.
//
// Every ZeroMQ conversation (the per-pod SUB, central mode's accepted connections, the
// replay DEALER) goes through the package's own small ZMTP 3.0 client, fuzzed, instead
// of go-zeromq/zmq4, whose reader allocates whatever frame size a peer announces (one
// 10-byte header claiming 2^40 bytes is a fatal out-of-memory for the whole process),
// whose goroutines' panics cannot be recovered, and whose auto-reconnect reports a
// socket connected after its peer is gone. Bounded here: dial and handshake
// (Config.HandshakeTimeout), message size (Config.MaxMessageBytes: longer messages are
// read past, never buffered; absurd announced sizes end the connection), memory (it
// grows with the bytes received, not with sizes announced), silence (Config.Watchdog,
// with ZMTP PINGs to 3.1 peers and TCP keepalive), a replay (Config.ReplayTimeout, ReplayIdle). A
// stream is Connected exactly from a completed handshake until its connection fails.
//
// Concurrency: Decode and Encode are safe to call concurrently on distinct Batches; a
// Batch must not be decoded into while its previous events are still in use. A
// Subscriber's methods (Add, Remove, Status) are safe for concurrent use; Run starts one
// goroutine per endpoint and rank (plus, per connection, a watchdog goroutine that never
// touches the Sink), reads and handles each message on it before reading the next, and
// calls the Sink from those goroutines: Sink methods for one endpoint and rank are never called
// concurrently with each other and arrive in the publisher's order, while calls for
// different endpoints or ranks may run in parallel (in central mode a stream's messages
// may arrive on any connection's goroutine, and a per-stream lock keeps them sequential).
// Remove returns after the endpoint's streams stopped and its ranks were cleared; no
// message is applied for it afterwards.
package kvevents
