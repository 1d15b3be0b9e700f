package peersync

import (
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/placement"
)

// fakeSource is a router's own load and placement decisions, set by the test; merged
// records the placements peers' snapshots merged, with their winsTie.
type fakeSource struct {
	loads   []placement.EndpointLoad
	placed  []placement.Placement // all of them
	changed []placement.Placement // since the last Placements(false)
	merged  []merge
}

type merge struct {
	ps         []placement.Placement
	winsTie    bool
	concurrent time.Duration
}

func (f *fakeSource) Local(dst []placement.EndpointLoad) []placement.EndpointLoad {
	return append(dst, f.loads...)
}

func (f *fakeSource) Placements(dst []placement.Placement, all bool) []placement.Placement {
	if all {
		return append(dst, f.placed...)
	}
	dst = append(dst, f.changed...)
	f.changed = nil
	return dst
}

func (f *fakeSource) MergePlacements(ps []placement.Placement, winsTie bool, concurrent time.Duration) {
	f.merged = append(f.merged, merge{ps: ps, winsTie: winsTie, concurrent: concurrent})
}

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time         { return c.t }
func (c *fakeClock) add(d time.Duration)    { c.t = c.t.Add(d) }
func newClock() *fakeClock                  { return &fakeClock{t: time.Unix(1000, 0)} }
func activeSet(keys ...uint64) activeKeys   { return activeKeys(keys) }
func (a activeKeys) Active(key uint64) bool { return contains(a, key) }
func contains(a []uint64, k uint64) bool {
	for _, x := range a {
		if x == k {
			return true
		}
	}
	return false
}

type activeKeys []uint64

// pairInterval is the publish interval of pair's replicas.
const pairInterval = 10 * time.Millisecond

// pair returns two replicas a and b on one clock, sources set by the test.
func pair(expiry time.Duration) (*fakeClock, *fakeSource, *Replica, *Replica) {
	c := newClock()
	src := &fakeSource{}
	return c, src, NewReplica("a", 1, src, expiry, pairInterval, c.now, nil),
		NewReplica("b", 1, &fakeSource{}, expiry, pairInterval, c.now, nil)
}

func TestReplicaSharesLoad(t *testing.T) {
	c, src, a, b := pair(time.Second)
	src.loads = []placement.EndpointLoad{
		{Endpoint: "e1", Load: placement.Load{Requests: 3, KVBlocks: 12, Prefill: 700, Misses: 1},
			Active: []placement.ActivePrefix{{Key: 7, Blocks: 100}, {Key: 8, Blocks: 50}}},
	}
	if err := b.Receive(a.Publish()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		local placement.ActiveSet
		want  placement.Load
	}{
		{"nothing local", nil, placement.Load{Requests: 3, KVBlocks: 162, Prefill: 700, Misses: 1}},
		{"prefix 7 active locally: its blocks count once", activeSet(7), placement.Load{Requests: 3, KVBlocks: 62, Prefill: 700, Misses: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := b.PeerLoad("e1", tt.local); got != tt.want {
				t.Fatalf("PeerLoad = %+v, want %+v", got, tt.want)
			}
		})
	}
	if !b.PeerActive("e1", 8) || b.PeerActive("e1", 9) || b.PeerActive("e2", 8) {
		t.Fatal("PeerActive disagrees with the snapshot")
	}
	if got := a.PeerLoad("e1", nil); got != (placement.Load{}) {
		t.Fatalf("a's own load counted as a peer's: %+v", got)
	}
	if err := a.Receive(a.State()); err != nil || len(a.Peers()) != 0 {
		t.Fatalf("a applied its own snapshot: %v, %+v", err, a.Peers())
	}
	c.add(1100 * time.Millisecond)
	if got := b.PeerLoad("e1", nil); got != (placement.Load{}) {
		t.Fatalf("a silent beyond the expiry still counts: %+v", got)
	}
	if ps := b.Peers(); len(ps) != 1 || ps[0].Live {
		t.Fatalf("Peers = %+v, want a, not live", ps)
	}
}

// A peer's cache turnover on an endpoint (the blocks its requests allocated there and
// its recent long prompts) reaches its replicas with its load, summed over live peers,
// and counts for nothing once the peer is silent beyond the expiry.
func TestReplicaSharesTurnover(t *testing.T) {
	c, src, a, b := pair(time.Second)
	hs := []placement.History{{Before: 100, Cached: 64, Blocks: 1000}, {Before: 1200, Blocks: 2000}}
	src.loads = []placement.EndpointLoad{{Endpoint: "e1", Sent: 3300, Histories: hs}, {Endpoint: "e2", Sent: 40}}
	d := NewReplica("d", 1, &fakeSource{loads: []placement.EndpointLoad{{Endpoint: "e1", Sent: 700}}}, time.Second, pairInterval, c.now, nil)
	for _, r := range []*Replica{a, d} {
		if err := b.Receive(r.Publish()); err != nil {
			t.Fatal(err)
		}
	}
	sent, got := b.PeerTurnover("e1", nil)
	if sent != 4000 || !slices.Equal(got, hs) {
		t.Fatalf("PeerTurnover(e1) = %d, %+v; want 4000 (3300 + 700), %+v", sent, got, hs)
	}
	if sent, got := b.PeerTurnover("e3", nil); sent != 0 || got != nil {
		t.Fatalf("PeerTurnover(e3) = %d, %+v; want none", sent, got)
	}
	if sent, _ := a.PeerTurnover("e2", nil); sent != 0 {
		t.Fatalf("a's own turnover counted as a peer's: %d", sent)
	}
	c.add(1100 * time.Millisecond)
	if sent, got := b.PeerTurnover("e1", nil); sent != 0 || got != nil {
		t.Fatalf("peers silent beyond the expiry still count: %d, %+v", sent, got)
	}
}

// Unheard counts the live peers last heard from before a time: a pick made after a
// peer's last snapshot is unknown to that peer, until the next one.
func TestReplicaUnheard(t *testing.T) {
	c, _, a, b := pair(time.Second)
	heard := c.now()
	if got := b.Unheard(heard.Add(time.Millisecond)); got != 0 {
		t.Fatalf("Unheard with no peer = %d, want 0", got)
	}
	if err := b.Receive(a.State()); err != nil {
		t.Fatal(err)
	}
	c.add(5 * time.Millisecond)
	for _, tc := range []struct {
		name string
		at   time.Time
		want int
	}{
		{"a pick before a was heard", heard.Add(-time.Millisecond), 0},
		{"a pick when a was heard", heard, 0},
		{"a pick after a was heard", c.now(), 1},
	} {
		if got := b.Unheard(tc.at); got != tc.want {
			t.Errorf("%s: Unheard = %d, want %d", tc.name, got, tc.want)
		}
	}
	c.add(2 * time.Second) // a silent past the expiry counts for nothing
	if got := b.Unheard(c.now()); got != 0 {
		t.Fatalf("Unheard after a's expiry = %d, want 0", got)
	}
}

func TestReplicaOrdersSnapshots(t *testing.T) {
	_, src, a, b := pair(time.Second)
	src.loads = []placement.EndpointLoad{{Endpoint: "e", Load: placement.Load{Requests: 1}}}
	first := a.Publish()
	src.loads[0].Requests = 2
	second := a.Publish()
	for _, m := range [][]byte{second, first} { // reordered: the older one is ignored
		if err := b.Receive(m); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.PeerLoad("e", nil).Requests; got != 2 {
		t.Fatalf("requests = %d after a reordered older snapshot, want 2", got)
	}
	// a restarts: a new incarnation's first snapshot replaces the old one's later ones.
	restarted := NewReplica("a", 2, &fakeSource{loads: []placement.EndpointLoad{{Endpoint: "e", Load: placement.Load{Requests: 5}}}}, time.Second, 0, nil, nil)
	if err := b.Receive(restarted.State()); err != nil {
		t.Fatal(err)
	}
	if got := b.PeerLoad("e", nil).Requests; got != 5 {
		t.Fatalf("requests = %d after a's restart, want 5", got)
	}
	b.Forget("a")
	if got := b.PeerLoad("e", nil).Requests; got != 0 {
		t.Fatalf("requests = %d after Forget, want 0", got)
	}
}

func TestPublishOnlyWhenChangedOrDue(t *testing.T) {
	c, src, a, _ := pair(time.Second)
	src.loads = []placement.EndpointLoad{{Endpoint: "e", Load: placement.Load{Requests: 1}}}
	if a.Publish() == nil {
		t.Fatal("first Publish sent nothing")
	}
	if a.Publish() != nil {
		t.Fatal("unchanged state sent again before the heartbeat")
	}
	c.add(250 * time.Millisecond) // expiry / 4
	if a.Publish() == nil {
		t.Fatal("no heartbeat after expiry/4")
	}
	src.loads[0].Requests = 2
	if a.Publish() == nil {
		t.Fatal("changed state not sent")
	}
}

func TestReplicaSharesPlacements(t *testing.T) {
	c, src, a, b := pair(time.Second)
	home := placement.Placement{Key: 7, Blocks: 100, Decided: c.now(), Sites: []placement.Site{{Endpoint: "e1", Home: true}}}
	src.placed, src.changed = []placement.Placement{home}, []placement.Placement{home}
	first, err := Decode(a.Publish())
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Placements) != 1 || first.Placements[0].Key != 7 {
		t.Fatalf("first snapshot (a full one) carries %+v, want key 7", first.Placements)
	}
	// A decision alone is a change worth a message, sent once.
	replica := placement.Placement{Key: 8, Blocks: 20, Decided: c.now(), Sites: []placement.Site{{Endpoint: "e2"}}}
	src.changed = []placement.Placement{replica}
	msg := a.Publish()
	if msg == nil {
		t.Fatal("a new placement decision was not sent")
	}
	if a.Publish() != nil {
		t.Fatal("nothing changed, yet a snapshot was sent before the heartbeat")
	}
	c.add(time.Millisecond) // the message's lag
	if err := b.Receive(msg); err != nil {
		t.Fatal(err)
	}
	bsrc := b.src.(*fakeSource)
	if len(bsrc.merged) != 1 || len(bsrc.merged[0].ps) != 1 || bsrc.merged[0].ps[0].Key != 8 || !bsrc.merged[0].winsTie {
		t.Fatalf("b merged %+v, want a's decision on key 8, a winning ties (a < b)", bsrc.merged)
	}
	// Decisions closer than the interval plus the lag were made unheard of each other.
	if got, want := bsrc.merged[0].concurrent, pairInterval+time.Millisecond; got != want {
		t.Fatalf("b merged with concurrent = %v, want the interval plus the lag, %v", got, want)
	}
	// Every expiry/4 the heartbeat carries every placement (repairs lost decisions).
	c.add(250 * time.Millisecond)
	full, err := Decode(a.Publish())
	if err != nil {
		t.Fatal(err)
	}
	if len(full.Placements) != 1 || full.Placements[0].Key != 7 {
		t.Fatalf("heartbeat carries %+v, want every placement (key 7)", full.Placements)
	}
	// A stale snapshot merges nothing; b's own snapshots win no ties at a.
	if err := b.Receive(msg); err != nil {
		t.Fatal(err)
	}
	if len(bsrc.merged) != 1 {
		t.Fatalf("a stale snapshot was merged: %+v", bsrc.merged)
	}
	bsrc.placed = []placement.Placement{replica} // b's first snapshot is a full one
	if err := a.Receive(b.Publish()); err != nil {
		t.Fatal(err)
	}
	if len(src.merged) != 1 || src.merged[0].winsTie {
		t.Fatalf("a merged %+v, want b's decisions once, b losing ties", src.merged)
	}
}

// lockedSource is a policy's side: a pick holding the policy's lock reads the peers
// (PeerLoad), as placement does, while Publish reads the policy (Local).
type lockedSource struct {
	rep *Replica
}

// Local runs a pick on another goroutine while it holds the source's own state (as a
// pick would hold the policy's lock while Publish reads the source) and waits for it.
func (s *lockedSource) Local(dst []placement.EndpointLoad) []placement.EndpointLoad {
	s.pick()
	return dst
}

// Placements is read by Publish and State too: the same pick.
func (s *lockedSource) Placements(dst []placement.Placement, _ bool) []placement.Placement {
	s.pick()
	return dst
}

func (*lockedSource) MergePlacements([]placement.Placement, bool, time.Duration) {}

func (s *lockedSource) pick() {
	done := make(chan struct{})
	go func() {
		s.rep.PeerLoad("e", nil)
		s.rep.PeerActive("e", 1)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		panic("peersync: PeerLoad waited on Publish: the policy and the replica lock each other")
	}
}

// TestPublishDoesNotBlockPeerReads: Publish and State read the source without holding
// the lock PeerLoad and PeerActive take, so a pick that reads the peers under the
// policy's lock cannot deadlock with a publish that reads the policy.
func TestPublishDoesNotBlockPeerReads(t *testing.T) {
	src := &lockedSource{}
	rep := NewReplica("a", 1, src, time.Second, 0, nil, nil)
	src.rep = rep
	if rep.Publish() == nil {
		t.Fatal("first Publish: nil, want the initial state")
	}
	if len(rep.State()) == 0 {
		t.Fatal("State: empty")
	}
}

func TestReplicaRank(t *testing.T) {
	c, _, a, b := pair(time.Second) // names "a" and "b"
	if r, n := b.Rank(); r != 0 || n != 1 {
		t.Fatalf("Rank alone = %d of %d, want 0 of 1", r, n)
	}
	if err := b.Receive(a.State()); err != nil {
		t.Fatal(err)
	}
	if r, n := b.Rank(); r != 1 || n != 2 {
		t.Fatalf("b's Rank beside a = %d of %d, want 1 of 2", r, n)
	}
	c.add(2 * time.Second) // a silent past the expiry is no longer counted
	if r, n := b.Rank(); r != 0 || n != 1 {
		t.Fatalf("b's Rank after a's expiry = %d of %d, want 0 of 1", r, n)
	}
}
