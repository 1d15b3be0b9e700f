// Package app composes kvrouter's parts into the running service: the fleet registry and
// its scrapers, the prompt registry (chat templates and tokenizers), the block index fed
// by the KV-event subscriber through index/kvsink and following the fleet, the policy,
// the ext_proc gRPC server with the gRPC health service Envoy checks, a second gRPC health
// server for Kubernetes probes, and the HTTP server for /metrics, /healthz, /readyz and the
// debug views on their own loopback port (/debug/endpoints, /debug/kv, POST /debug/route). Main is the command line
// behind cmd/kvrouter (serve, check-config, tokenize).
//
// Nothing here is global: every App owns its registry, logger and servers, so tests run
// several side by side. Concurrency: New and Listen are called once, from one goroutine;
// Run blocks until its context ends and the drain completes. Fleet changes reach the KV
// path through a queue drained by one goroutine, so the fleet's lock is never held while
// the subscriber opens or closes sockets; the routing path reads the events-health view
// from an atomic pointer. DebugKV and ExplainRoute are safe to call concurrently with
// routing and change no routing state.
package app
