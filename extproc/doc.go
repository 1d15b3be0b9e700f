// Package extproc is kvrouter's Envoy external-processing (ext_proc) gRPC server: for each
// HTTP request Envoy opens one stream, kvrouter reads the request (headers, and the body
// when the processing mode lets it), names one endpoint in the
// x-gateway-destination-endpoint header and in envoy.lb dynamic metadata (with the
// decision's kind, when the policy names one, in kvrouter's own namespace for the proxy's
// access log), and follows the response to release the endpoint's in-flight count and
// count cached prompt tokens.
//
// Each stream is driven by an explicit state machine that accepts Envoy's messages only in
// the order Envoy sends them and replies in the order Envoy expects, for the request body
// modes FULL_DUPLEX_STREAMED, BUFFERED, BUFFERED_PARTIAL, STREAMED and NONE.
//
// Concurrency: a Server is safe for concurrent use; gRPC runs each stream on its own
// goroutine and the Server keeps no per-stream state outside that goroutine. Its
// dependencies (Fleet, Tokenizer, policies) must be safe for concurrent use.
package extproc
