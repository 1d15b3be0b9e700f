// Package scoring holds kvrouter's placement policies: given a request and the endpoints
// eligible for it, pick one. It knows nothing of Envoy, gRPC or protobufs; the KV-aware
// policies reach the block index through narrow interfaces declared here.
//
// Concurrency: every Policy is safe for concurrent use by many request goroutines.
package scoring
