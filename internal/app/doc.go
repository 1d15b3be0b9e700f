// Package app composes kvrouter's parts into the running service: the fleet registry and
// its scrapers, the ext_proc gRPC server with the gRPC health service Envoy checks, a
// second gRPC health server for Kubernetes probes, and the HTTP server for /metrics,
// /healthz and /readyz. Main is the command line behind cmd/kvrouter.
//
// Nothing here is global: every App owns its registry, logger and servers, so tests run
// several side by side. Concurrency: New and Listen are called once, from one goroutine;
// Run blocks until its context ends and the drain completes.
package app
