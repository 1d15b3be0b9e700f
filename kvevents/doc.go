// Package kvevents speaks vLLM's KV-cache event protocol: it decodes (and, for the
// simulator and tests, encodes) the msgpack batches vLLM publishes over ZeroMQ, and
// subscribes to publishers, keeping per-endpoint order, detecting sequence gaps and
// recovering them through the replay socket. It feeds the block index through a narrow
// interface; the index knows nothing of ZeroMQ.
package kvevents
