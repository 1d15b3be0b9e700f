package placement_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/placement"
)

// fakePeers is other router replicas' state, set by the test.
type fakePeers struct {
	load   map[string]placement.Load
	active map[string]uint64 // endpoint -> the one prefix key a peer has in flight there
}

func (f *fakePeers) PeerLoad(ep string, _ placement.ActiveSet) placement.Load { return f.load[ep] }

func (*fakePeers) Self() string { return "self" }

func (f *fakePeers) PeerActive(ep string, key uint64) bool {
	k, ok := f.active[ep]
	return ok && k == key
}

func TestPlacementPeersLoadMovesRequests(t *testing.T) {
	ix := testindex.New()
	cs := fleet(6, nil)
	toks := prefixed(1, 0)
	ix.Hold(cs[0].Address, plKeysOf(toks))
	ix.Hold(cs[1].Address, plKeysOf(toks))
	p := newPlacement(t, placement.DefaultConfig(), ix)
	first := place(t, p, prefixed(1, 1), cs) // both hold it, both idle: one of them
	if first != cs[0].Address && first != cs[1].Address {
		t.Fatalf("picked %s, not a holder", first)
	}
	other := cs[0].Address
	if first == other {
		other = cs[1].Address
	}
	p.SetPeers(&fakePeers{load: map[string]placement.Load{first: {Requests: 3}}})
	if got := place(t, p, prefixed(1, 2), cs); got != other {
		t.Fatalf("with 3 peer requests on %s, picked %s, want the idle holder %s", first, got, other)
	}
	p.SetPeers(nil)
	if got := place(t, p, prefixed(1, 3), cs); got != first {
		t.Fatalf("without peers, picked %s, want %s again", got, first)
	}
}

func TestPlacementAdoptsPeersInFlightPrefix(t *testing.T) {
	cs := fleet(6, nil)
	toks := prefixed(2, 0)
	key := plKeysOf(toks)[placement.DefaultConfig().PrefixDepth-1]
	alone := place(t, newPlacement(t, placement.DefaultConfig(), testindex.New()), toks, cs)
	peerSite := cs[4].Address
	if alone == peerSite {
		peerSite = cs[5].Address
	}
	p := newPlacement(t, placement.DefaultConfig(), testindex.New())
	p.SetPeers(&fakePeers{active: map[string]uint64{peerSite: key}})
	if got := place(t, p, prefixed(2, 1), cs); got != peerSite {
		t.Fatalf("a peer computing the prefix on %s: picked %s (alone: %s)", peerSite, got, alone)
	}
}

func TestPlacementLocalSharesOwnLoad(t *testing.T) {
	p := newPlacement(t, placement.DefaultConfig(), testindex.New())
	cs := fleet(2, nil)
	req := plRequest(prefixed(3, 0))
	d, err := p.Pick(req, cs)
	if err != nil {
		t.Fatal(err)
	}
	p.Routed(req, d.Endpoint)
	loads := p.Local(nil)
	if len(loads) != 1 || loads[0].Endpoint != d.Endpoint || loads[0].Requests != 1 || len(loads[0].Active) != 1 ||
		loads[0].Prefill != len(req.TokenIDs) {
		t.Fatalf("Local = %+v, want one request on %s with its prefix active and its prompt to prefill", loads, d.Endpoint)
	}
	p.Finished(req.ID)
	if loads := p.Local(nil); len(loads) != 0 {
		t.Fatalf("Local after Finished = %+v, want none", loads)
	}
}
