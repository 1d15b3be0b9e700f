// Package fakeenvoy is a fake of Envoy's ext_proc HTTP filter, for tests, benchmarks, load
// runs and the development gateway. An Exchange drives one HTTP request and its response
// through an ExternalProcessor server the way Envoy does in each body mode
// (FULL_DUPLEX_STREAMED, BUFFERED, BUFFERED_PARTIAL, STREAMED, NONE), applies the
// server's header and body mutations as Envoy would, and fails with an *OrderError when a
// reply arrives that Envoy would reject (out of order, of the wrong kind for the mode, an
// empty body reply in FULL_DUPLEX_STREAMED, a streamed chunk over 62,000 bytes, a mutation
// of a header Envoy protects).
//
// Concurrency: an Exchange may be used by two goroutines at once, one sending the response
// (ResponseHeaders, ResponseBody, ResponseTrailers) and one reading it (ReadResponseBody,
// ReadResponseTrailers); otherwise calls are sequential. Helpers (Bufconn, TCP, Load,
// Compare) are safe for concurrent use. Trivial is a minimal FULL_DUPLEX_STREAMED
// processor (a fixed endpoint, no parsing or scoring), the baseline that Compare puts a
// real router next to; it is safe for concurrent use.
package fakeenvoy
