// Package peersync shares what each kvrouter replica alone knows, its requests in
// flight per endpoint (with their prefill backlog, misses in prefill, KV blocks and
// the prefixes they use), with the other replicas, so that replicas behind one Service
// route as one router.
//
// Replica is the state: this replica's snapshots out (Publish, State) and the latest
// snapshot of every peer in (Receive), read by the placement policy through PeerLoad,
// PeerActive and Unheard (placement.PeerView). Node carries it over hashicorp/memberlist:
// membership, failure detection, push/pull state when a replica joins, and direct UDP
// messages for the snapshots. kvbench's sim carries the same bytes on its virtual clock.
//
// Decode reads every wire version from 1 on (a newer one's known part, skipping its
// sections), so replicas of different releases keep sharing state during a rolling
// update; AppendEncode writes version 2.
//
// Concurrency: Replica is safe for concurrent use and its readers never wait on the
// network; Node's Run owns its goroutines.
package peersync
