// Package placement is kvrouter's placement policy: a table of where each prompt prefix
// lives, kept partitioned over the fleet by KV capacity, with replicas only where they
// evict nothing live, and requests held or diverted one at a time when the chosen
// endpoint is busy. It implements scoring.Policy and scoring.Observer and reads the block
// index through scoring.PrefixIndex; it knows nothing of Envoy, gRPC or configuration
// files (policy.Builtin builds it from policy.Config).
//
// Concurrency: a Policy is safe for concurrent use; Pick never blocks on I/O (a hold is
// an answer, Decision.Hold, that the router carries out).
package placement
