// Package gateway is a small development HTTP gateway that stands in for Envoy: it strips
// client x-gateway-destination-* headers, sends each request through kvrouter over
// ext_proc exactly as Envoy's filter does in FULL_DUPLEX_STREAMED mode (request and
// response, using testbench/fakeenvoy's filter), applies the header mutations, and proxies
// to the ip:port kvrouter named in x-gateway-destination-endpoint only when it is in the
// configured upstream allowlist (Envoy's ORIGINAL_DST cluster keyed on that header).
// Responses, SSE included, stream back chunk by chunk; immediate responses are returned
// as Envoy returns them.
//
// It is for local runs and end-to-end tests, not production: it buffers each request
// body (up to a limit) before calling kvrouter, which kvrouter does anyway in FDS mode.
//
// Concurrency: a Gateway is an http.Handler safe for concurrent use.
package gateway
