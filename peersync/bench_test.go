package peersync

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/placement"
)

// benchLoads is one replica's load on n endpoints, each with k active prefixes.
func benchLoads(n, k int) []placement.EndpointLoad {
	out := make([]placement.EndpointLoad, n)
	for i := range out {
		out[i] = placement.EndpointLoad{Endpoint: fmt.Sprintf("10.0.0.%d:8000", i+1),
			Load: placement.Load{Requests: 3, KVBlocks: 60, Prefill: 2000, Misses: 1}}
		for j := range k {
			out[i].Active = append(out[i].Active, placement.ActivePrefix{Key: uint64(i*1000 + j), Blocks: 128})
		}
	}
	return out
}

// BenchmarkPeerLoad is what a pick adds per candidate: 3 peers, 6 endpoints, 8 active
// prefixes each.
func BenchmarkPeerLoad(b *testing.B) {
	self := NewReplica("self", 1, nil, time.Minute, 0, nil, nil)
	for p := range 3 {
		r := NewReplica(fmt.Sprint("peer", p), 1, &fakeSource{loads: benchLoads(6, 8)}, time.Minute, 0, nil, nil)
		if err := self.Receive(r.State()); err != nil {
			b.Fatal(err)
		}
	}
	local := activeSet(3, 4)
	b.ReportAllocs()
	for b.Loop() {
		_ = self.PeerLoad("10.0.0.3:8000", local)
	}
}

// BenchmarkPublishReceive is one state change: build the snapshot, apply it at a peer.
func BenchmarkPublishReceive(b *testing.B) {
	src := &fakeSource{loads: benchLoads(6, 8)}
	a := NewReplica("a", 1, src, time.Minute, 0, nil, nil)
	peer := NewReplica("b", 1, nil, time.Minute, 0, nil, nil)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		src.loads[0].Requests = i // a change, so Publish sends
		if err := peer.Receive(a.Publish()); err != nil {
			b.Fatal(err)
		}
	}
}
