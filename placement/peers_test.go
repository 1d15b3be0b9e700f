package placement_test

import (
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/scoring"
)

// fakePeers is other router replicas' state, set by the test.
type fakePeers struct {
	load   map[string]placement.Load
	active map[string]uint64 // endpoint -> the one prefix key a peer has in flight there
	// turnover is peers' cache turnover per endpoint (Sent and Histories only).
	turnover map[string]placement.EndpointLoad
	// unheard peers were last heard from at heard.
	unheard int
	heard   time.Time
	// rank is this replica's among replicas (0 means one: Rank reports at least 1).
	rank, replicas int
}

func (f *fakePeers) Rank() (int, int) { return f.rank, max(f.replicas, 1) }

func (f *fakePeers) Unheard(t time.Time) int {
	if f.heard.Before(t) {
		return f.unheard
	}
	return 0
}

func (f *fakePeers) PeerLoad(ep string, _ placement.ActiveSet) placement.Load { return f.load[ep] }

func (*fakePeers) Self() string { return "self" }

func (f *fakePeers) PeerTurnover(ep string, dst []placement.History) (int, []placement.History) {
	t := f.turnover[ep]
	return t.Sent, append(dst, t.Histories...)
}

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

// A pick this router made since it last heard from its peers counts once per unheard
// peer on its endpoint for the next pick of the same prefix: replicas on the same view
// place a prefix alike at the same instant, so the next simultaneous pick of it goes
// elsewhere. A pick of another prefix, or one after the peers are heard from, counts
// once.
func TestPlacementCountsPeersLikelyPicks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		unheard int
		prefix  int // of the second pick (the first's is 9)
		second  int // fleet index the second simultaneous pick goes to
		third   int // after the peers are heard from
	}{
		// cs[0]: this router's pick, plus 9 unheard peers' likely ones; cs[1]: 5 peer requests.
		{name: "nine peers unheard", unheard: 9, prefix: 9, second: 1, third: 0},
		{name: "nine peers unheard, another prefix", unheard: 9, prefix: 10, second: 0, third: 0},
		{name: "all heard", unheard: 0, prefix: 9, second: 0, third: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(100, 0)
			ix := testindex.New()
			cs := fleet(2, nil)
			for _, pr := range []int{9, 10} {
				ix.Hold(cs[0].Address, plKeysOf(prefixed(pr, 0)))
				ix.Hold(cs[1].Address, plKeysOf(prefixed(pr, 0)))
			}
			p := clockedPolicy(t, placement.DefaultConfig(), ix, &now)
			p.SetPeers(&fakePeers{load: map[string]placement.Load{cs[1].Address: {Requests: 5}},
				unheard: tc.unheard, heard: now.Add(-time.Millisecond)})
			pick := func(prefix, seq int) string {
				req := plRequest(prefixed(prefix, seq))
				d, err := p.Pick(req, cs)
				if err != nil {
					t.Fatal(err)
				}
				p.Routed(req, d.Endpoint)
				p.FirstToken(req.ID) // decoding: no prefill backlog to divert from
				for i := range cs {
					if cs[i].Address == d.Endpoint {
						cs[i].InFlight++ // the router's count of its own requests
					}
				}
				return d.Endpoint
			}
			if got := pick(9, 1); got != cs[0].Address {
				t.Fatalf("first pick %s, want the idle holder %s", got, cs[0].Address)
			}
			if got := pick(tc.prefix, 2); got != cs[tc.second].Address {
				t.Fatalf("second pick at the same instant %s, want %s", got, cs[tc.second].Address)
			}
			p.SetPeers(&fakePeers{load: map[string]placement.Load{cs[1].Address: {Requests: 5}},
				unheard: tc.unheard, heard: now.Add(time.Millisecond)})
			now = now.Add(2 * time.Millisecond)
			if got := pick(9, 3); got != cs[tc.third].Address {
				t.Fatalf("pick after the peers were heard %s, want %s", got, cs[tc.third].Address)
			}
		})
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
		loads[0].Prefill != len(req.TokenIDs) || loads[0].Sent == 0 {
		t.Fatalf("Local = %+v, want one request on %s with its prefix active, its prompt to prefill and its blocks sent", loads, d.Endpoint)
	}
	p.Finished(req.ID)
	if loads := p.Local(nil); len(loads) != 1 || loads[0].Load != (placement.Load{}) || loads[0].Active != nil || loads[0].Sent == 0 {
		t.Fatalf("Local after Finished = %+v, want no load left, the blocks it sent still shared", loads)
	}
}

// inFlight is loads without the endpoints that have only turnover to share.
func inFlight(loads []placement.EndpointLoad) []placement.EndpointLoad {
	return slices.DeleteFunc(loads, func(l placement.EndpointLoad) bool { return l.Load == placement.Load{} && l.Active == nil })
}

// A request the proxy served on a listed fallback (Moved) counts at the served
// endpoint, in what the policy weighs and what it shares with peers, and Finished
// releases it there; its prefix is placed where its KV now is.
func TestPlacementMovedFollowsTheRequest(t *testing.T) {
	for _, tc := range []struct {
		name            string
		firstToken      bool // the first choice had answered before the move
		prefill, misses int  // at the served endpoint after the move
	}{
		{name: "before the first token", prefill: len(prefixed(7, 0)), misses: 1},
		{name: "after the first token", firstToken: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(100, 0)
			p := clockedPlacement(t, &now)
			p.SetPeers(&fakePeers{})
			cs := fleet(3, nil)
			req := plRequest(prefixed(7, 0))
			d, err := p.Pick(req, cs)
			if err != nil {
				t.Fatal(err)
			}
			p.Routed(req, d.Endpoint)
			if tc.firstToken {
				p.FirstToken(req.ID)
			}
			p.Placements(nil, false) // the home, already shared
			served := d.Fallbacks[0]
			p.Moved(req.ID, served)

			loads := inFlight(p.Local(nil))
			if len(loads) != 1 || loads[0].Endpoint != served || loads[0].Requests != 1 || len(loads[0].Active) != 1 ||
				loads[0].Prefill != tc.prefill || loads[0].Misses != tc.misses {
				t.Fatalf("Local after Moved to %s = %+v, want only the request there (prefill %d, misses %d), nothing left on %s",
					served, loads, tc.prefill, tc.misses, d.Endpoint)
			}
			changed := p.Placements(nil, false)
			if len(changed) != 1 || !slices.ContainsFunc(changed[0].Sites, func(s placement.Site) bool { return s.Endpoint == served }) {
				t.Fatalf("Placements after Moved = %+v, want the prefix placed on %s", changed, served)
			}
			p.Moved(req.ID, served) // again: nothing more to move
			if !tc.firstToken {
				p.FirstToken(req.ID)
				if l := inFlight(p.Local(nil)); len(l) != 1 || l[0].Prefill != 0 || l[0].Misses != 0 {
					t.Fatalf("Local after FirstToken = %+v, want the prefill and miss released at %s", l, served)
				}
			}
			p.Finished(req.ID)
			if loads := inFlight(p.Local(nil)); len(loads) != 0 {
				t.Fatalf("Local after Finished = %+v, want none in flight", loads)
			}
		})
	}
}

// clockedPlacement is a placement policy on a settable clock.
func clockedPlacement(t *testing.T, now *time.Time) *placement.Policy {
	t.Helper()
	return clockedPolicy(t, placement.DefaultConfig(), testindex.New(), now)
}

func TestPlacementSharesItsDecisions(t *testing.T) {
	now := time.Unix(100, 0)
	cs := fleet(6, nil)
	toks := prefixed(4, 0)
	alone := newPlacement(t, placement.DefaultConfig(), testindex.New())
	place(t, alone, toks, cs)
	if got := alone.Placements(nil, true); len(got) != 0 {
		t.Fatalf("without peers Placements = %+v, want none (nothing to share with)", got)
	}

	p := clockedPlacement(t, &now)
	p.SetPeers(&fakePeers{})
	home := place(t, p, toks, cs)
	changed := p.Placements(nil, false)
	key := plKeysOf(toks)[placement.DefaultConfig().PrefixDepth-1]
	if len(changed) != 1 || changed[0].Key != key || !changed[0].Decided.Equal(now) ||
		len(changed[0].Sites) != 1 || changed[0].Sites[0] != (placement.Site{Endpoint: home, Home: true}) {
		t.Fatalf("Placements after a new home on %s = %+v, want that home decided now", home, changed)
	}
	if again := p.Placements(nil, false); len(again) != 0 {
		t.Fatalf("Placements reported %+v twice", again)
	}
	if all := p.Placements(nil, true); len(all) != 1 || all[0].Key != key {
		t.Fatalf("Placements(all) = %+v, want the one placed prefix", all)
	}
}

func TestPlacementMergesPeersDecisions(t *testing.T) {
	now := time.Unix(100, 0)
	cs := fleet(6, nil)
	toks := prefixed(5, 0)
	key := plKeysOf(toks)[placement.DefaultConfig().PrefixDepth-1]
	own := place(t, newPlacement(t, placement.DefaultConfig(), testindex.New()), toks, cs)
	peerHome := cs[3].Address
	if own == peerHome {
		peerHome = cs[4].Address
	}
	at := func(ep string, d time.Time) placement.Placement {
		return placement.Placement{Key: key, Blocks: 64, Decided: d, Sites: []placement.Site{{Endpoint: ep, Home: true}}}
	}
	p := clockedPlacement(t, &now)
	p.SetPeers(&fakePeers{})
	p.MergePlacements([]placement.Placement{at(peerHome, now.Add(-time.Second))}, false, 0)
	if got := place(t, p, prefixed(5, 1), cs); got != peerHome {
		t.Fatalf("a peer homed the idle prefix on %s: picked %s (alone: %s)", peerHome, got, own)
	}
	if got := p.Placements(nil, false); len(got) != 0 {
		t.Fatalf("merged placements shared again as changes: %+v", got)
	}
	tests := []struct {
		name    string
		merge   placement.Placement
		winsTie bool
		want    string
	}{
		{"an older decision loses", at(own, now.Add(-2*time.Second)), true, peerHome},
		{"a tie the peer does not win is kept", at(own, now.Add(-time.Second)), false, peerHome},
		{"a tie the peer wins moves it", at(own, now.Add(-time.Second)), true, own},
		{"a newer decision moves it back", at(peerHome, now), false, peerHome},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.MergePlacements([]placement.Placement{tt.merge}, tt.winsTie, 0)
			if got := place(t, p, prefixed(5, 2), cs); got != tt.want {
				t.Fatalf("picked %s, want %s", got, tt.want)
			}
		})
	}
}

// TestPlacementConcurrentDecisionsConverge: two replicas that home one prefix on
// different endpoints within a sync interval of each other keep the same home after
// exchanging their decisions, whichever decided first; decisions further apart than
// the window go to the later one, as before.
func TestPlacementConcurrentDecisionsConverge(t *testing.T) {
	cs := fleet(6, nil)
	key := plKeysOf(prefixed(5, 0))[placement.DefaultConfig().PrefixDepth-1]
	home := func(p *placement.Policy) string {
		for _, pl := range p.Placements(nil, true) {
			for _, s := range pl.Sites {
				if pl.Key == key && s.Home {
					return s.Endpoint
				}
			}
		}
		return ""
	}
	// Replica x sees the whole fleet, y all of it but x's choice: they home the
	// prefix on different endpoints.
	hx := place(t, newPlacement(t, placement.DefaultConfig(), testindex.New()), prefixed(5, 0), cs)
	rest := slices.DeleteFunc(slices.Clone(cs), func(c scoring.Endpoint) bool { return c.Address == hx })
	hy := place(t, newPlacement(t, placement.DefaultConfig(), testindex.New()), prefixed(5, 0), rest)
	const window = 11 * time.Millisecond
	// exchange has x decide, then y gap later (x gap later when gap < 0), then each
	// merge the other's decision; it returns each one's home after.
	exchange := func(t *testing.T, gap time.Duration) (x, y string) {
		t.Helper()
		now := time.Unix(100, 0)
		px, py := clockedPlacement(t, &now), clockedPlacement(t, &now)
		px.SetPeers(&fakePeers{})
		py.SetPeers(&fakePeers{})
		decide := func(p *placement.Policy, fleet []scoring.Endpoint, want string) {
			if got := place(t, p, prefixed(5, 0), fleet); got != want {
				t.Fatalf("homed on %s, want %s", got, want)
			}
		}
		if gap >= 0 {
			decide(px, cs, hx)
			now = now.Add(gap)
			decide(py, rest, hy)
		} else {
			decide(py, rest, hy)
			now = now.Add(-gap)
			decide(px, cs, hx)
		}
		dx, dy := px.Placements(nil, false), py.Placements(nil, false)
		px.MergePlacements(dy, false, window)
		py.MergePlacements(dx, true, window)
		return home(px), home(py)
	}
	var won string
	for _, gap := range []time.Duration{time.Millisecond, 0, -time.Millisecond, window - time.Nanosecond, -window + time.Nanosecond} {
		x, y := exchange(t, gap)
		if x != y || (x != hx && x != hy) {
			t.Fatalf("homes %s and %s decided %v apart: replicas kept %s and %s, want one of them on both", hx, hy, gap, x, y)
		}
		if won == "" {
			won = x
		}
		if x != won {
			t.Fatalf("homes decided %v apart: kept %s, but %s in another order: the winner depends on who decided first", gap, x, won)
		}
	}
	for _, tc := range []struct {
		gap  time.Duration
		want string
	}{{window, hy}, {-window, hx}} {
		if x, y := exchange(t, tc.gap); x != tc.want || y != tc.want {
			t.Fatalf("homes decided %v apart: replicas kept %s and %s, want the later %s", tc.gap, x, y, tc.want)
		}
	}
}

func TestPlacementReplicasBreakTiesTheirOwnWay(t *testing.T) {
	ix := testindex.New()
	cs := fleet(2, nil)
	toks := prefixed(6, 0)
	for _, c := range cs {
		ix.Hold(c.Address, plKeysOf(toks))
	}
	for i := range cs {
		cs[i].InFlight = 1 // both busy alike: equal waits
	}
	picks := func(p *placement.Policy) map[string]int {
		n := map[string]int{}
		for i := range 32 {
			d, err := p.Pick(plRequest(prefixed(6, i)), cs)
			if err != nil {
				t.Fatal(err)
			}
			n[d.Endpoint]++
		}
		return n
	}
	if n := picks(newPlacement(t, placement.DefaultConfig(), ix)); len(n) != 1 {
		t.Fatalf("one router broke an exact tie both ways: %v", n)
	}
	p := newPlacement(t, placement.DefaultConfig(), ix)
	p.SetPeers(&fakePeers{})
	if n := picks(p); len(n) != 2 {
		t.Fatalf("a replica with peers sent every tied pick to one holder: %v (simultaneous picks of its peers would join them)", n)
	}
}

// BenchmarkMergePlacements is one full table from a peer (what every expiry/4 brings):
// 1024 prefixes of 3 sites each, all newer than the table's, merged under the policy's
// lock.
func BenchmarkMergePlacements(b *testing.B) {
	cs := fleet(6, nil)
	ps := make([]placement.Placement, 1024)
	p := newPlacement(b, placement.DefaultConfig(), testindex.New())
	p.SetPeers(&fakePeers{})
	at := time.Unix(1, 0)
	b.ReportAllocs()
	for b.Loop() {
		at = at.Add(time.Second)
		for i := range ps {
			ps[i] = placement.Placement{Key: uint64(i), Blocks: 100, Decided: at, Sites: []placement.Site{
				{Endpoint: cs[i%6].Address, Home: true}, {Endpoint: cs[(i+1)%6].Address}, {Endpoint: cs[(i+2+int(at.Unix())%2)%6].Address}}}
		}
		p.MergePlacements(ps, false, 0)
	}
}

func TestPlacementRehomesPastPeersOtherRequests(t *testing.T) {
	for _, tc := range []struct {
		name      string
		computing bool // the peers' requests at the home use the prefix
		wantMove  bool
	}{
		{"peers busy with other prefixes", false, true},
		{"a peer computing it", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.Fill = 0.01 // no replicas: only a re-home moves the prefix
			cfg.DivertDeadline = false
			p := newPlacement(t, cfg, testindex.New())
			cs := fleet(2, nil)
			toks := prefixed(0, 0)
			home := place(t, p, toks, cs) // the index never shows it held: the home lost it
			peers := &fakePeers{load: map[string]placement.Load{home: {Requests: 2}}}
			if tc.computing {
				peers.active = map[string]uint64{home: plKeysOf(toks)[cfg.PrefixDepth-1]}
			}
			p.SetPeers(peers)
			got := place(t, p, prefixed(0, 1), cs)
			if (got != home) != tc.wantMove {
				t.Fatalf("went to %s, home %s, want moved: %v", got, home, tc.wantMove)
			}
		})
	}
}

func TestPlacementDeadlineLeavesPeersPrefillOut(t *testing.T) {
	cfg := placement.DefaultConfig()
	cfg.Fill = 0.01 // no replicas: the request goes to the home or is diverted
	ix := testindex.New()
	p := newPlacement(t, cfg, ix)
	cs := fleet(2, nil)
	home := place(t, p, prefixed(0, 0), cs)
	ix.Hold(home, plKeysOf(prefixed(0, 0))[:64])
	// Peers last reported four misses in prefill there: the backlog that diverts this
	// router's own requests (TestPlacementDivertsPastTheDeadline).
	p.SetPeers(&fakePeers{load: map[string]placement.Load{home: {Requests: 4, Prefill: 4 * 72 * 16}}})
	if got := place(t, p, prefixed(0, 9), cs); got != home {
		t.Fatalf("went to %s, want the home %s that holds the prefix", got, home)
	}
}

// Router replicas that decide at the same instant on the same cold view (no decode
// time measured: a fleet starting) spread as one router's consecutive decisions do:
// new homes by their rank, and a prefix's idle holders by rank too, instead of all
// taking the first (kvbench --sim --replicas 4, N = 2: every request on one endpoint).
func TestPlacementReplicasSpreadInLockStep(t *testing.T) {
	cs := fleet(6, nil)
	replica := func(ix *testindex.Index, rank int) *placement.Policy {
		p := newPlacement(t, placement.DefaultConfig(), ix)
		p.SetPeers(&fakePeers{rank: rank, replicas: 2})
		return p
	}
	one := place(t, newPlacement(t, placement.DefaultConfig(), testindex.New()), prefixed(7, 0), cs)
	h0 := place(t, replica(testindex.New(), 0), prefixed(7, 0), cs)
	h1 := place(t, replica(testindex.New(), 1), prefixed(7, 0), cs)
	if h0 != one {
		t.Fatalf("replica 0 homed a new prefix on %s, one router on %s: the first replica must decide as one router", h0, one)
	}
	if h0 == h1 {
		t.Fatalf("replicas 0 and 1 homed a new prefix on %s alike on one cold view: their simultaneous requests would share it", h0)
	}

	// Two idle holders of a prefix: the replicas take one each.
	ix := testindex.New()
	toks := prefixed(8, 0)
	ix.Hold(cs[2].Address, plKeysOf(toks))
	ix.Hold(cs[4].Address, plKeysOf(toks))
	r0 := place(t, replica(ix, 0), prefixed(8, 1), cs)
	r1 := place(t, replica(ix, 1), prefixed(8, 1), cs)
	for _, got := range []string{r0, r1} {
		if got != cs[2].Address && got != cs[4].Address {
			t.Fatalf("picked %s, not an idle holder", got)
		}
	}
	if r0 == r1 {
		t.Fatalf("replicas 0 and 1 both took idle holder %s of two", r0)
	}
}

// With router replicas, an idle holder that is slower beyond noise (MissSpeedup) than
// an idle endpoint without the prefix gives the request to that endpoint, which takes a
// copy (room beside its placements for a request of each): a request's time is mostly
// its decode (kvbench --sim --replicas 4, N = 12, C = 4: throughput 5.90 -> 6.04
// requests/s, kv 5.94). Not with speeds alike, not with the rule off, not without peers
// (one router's homes already favour the fast endpoints), and not for a prefix the slow
// holder does not hold (a miss anywhere: rehoming decides).
func TestPlacementReplicasCopyToAnIdleFasterEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fast     time.Duration // the other endpoint's decode time; the holder's is 1 s
		noPeers  bool
		off      bool
		lost     bool
		wantCopy bool
	}{
		{"faster beyond noise: a copy", 500 * time.Millisecond, false, false, false, true},
		{"speeds alike: the holder", 900 * time.Millisecond, false, false, false, false},
		{"rule off: the holder", 500 * time.Millisecond, false, true, false, false},
		{"one router: the holder", 500 * time.Millisecond, true, false, false, false},
		{"holder lost it: no copy", 500 * time.Millisecond, false, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.FasterCopies = !tc.off
			clock := time.Unix(100, 0)
			ix := testindex.New()
			p := clockedPolicy(t, cfg, ix, &clock)
			if !tc.noPeers {
				p.SetPeers(&fakePeers{})
			}
			cs := fleet(2, nil)
			// Two requests of prefix 0 diverging past it (a shared prefix), on its home.
			holder := place(t, p, prefixed(0, 0), cs)
			ix.Hold(holder, plKeysOf(prefixed(0, 0))[:64])
			if got := place(t, p, prefixed(0, 1), cs); got != holder {
				t.Fatalf("second request went to %s, want the idle holder %s", got, holder)
			}
			other := cs[0].Address
			if other == holder {
				other = cs[1].Address
			}
			// Measured decode times: 1 s on the holder, tc.fast on the other.
			for _, m := range []struct {
				toks   []uint32
				addr   string
				decode time.Duration
			}{{prefixed(0, 2), holder, time.Second}, {prefixed(1, 0), other, tc.fast}} {
				req := plRequest(m.toks)
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, m.addr)
				p.FirstToken(req.ID)
				clock = clock.Add(m.decode)
				p.Finished(req.ID)
			}
			if tc.lost {
				ix.Clear(holder)
			}
			if got := place(t, p, prefixed(0, 3), cs); (got == other) != tc.wantCopy {
				t.Fatalf("went to %s (holder %s, faster %s), want the faster one: %v", got, holder, other, tc.wantCopy)
			}
		})
	}
}

// Router replicas copying a prefix at the same instant on the same cold view (its one
// holder busy, the other endpoints idle and empty alike) break the exact tie by rank,
// as one router's consecutive copies take the first endpoints in turn: without it the
// first burst of kvbench --sim --replicas 4, N = 2, C = 16 copied both prefixes onto
// the first four endpoints and left two unused (TTFT p99 121 ms, kv 101). Rank 0
// copies where one router does, and once a decode time is measured (the fleet warm)
// every replica keeps the candidates' order. So does a replica whose own burst on the
// holder, times the replicas, does not exceed the endpoints (crowded): two replicas with
// two requests each fit six endpoints, and rotating such a copy cost kvbench --sim
// --replicas 2, N = 24, C = 4 0.3 points of ratio.
func TestPlacementReplicasRotateColdCopyTies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		warm  bool
		burst int    // the holder's requests in flight, this replica's
		want  [2]int // the candidates ranks 0 and 1 copy to
	}{
		{"cold, crowded: copies in turn", false, 4, [2]int{0, 1}},
		{"cold, a burst the fleet fits: the candidates' order", false, 3, [2]int{0, 0}},
		{"warm: the candidates' order", true, 4, [2]int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fleet(6, nil)
			ix := testindex.New()
			ix.Hold(cs[3].Address, plKeysOf(prefixed(3, 0)))
			cs[3].InFlight = tc.burst // the holder is busy (ReplicaLoad): the request takes a copy
			// copyOn is where a router (a replica of rank rank, or one router for -1)
			// sends the prefix's request.
			copyOn := func(rank int) string {
				clock := time.Unix(100, 0)
				cfg := placement.DefaultConfig()
				cfg.CopyCost = false // the copy's tie, not its worth (TestPlacementCopyWithinFillPaysForItsMiss)
				p := clockedPolicy(t, cfg, ix, &clock)
				if rank >= 0 {
					p.SetPeers(&fakePeers{rank: rank, replicas: 2})
				}
				if tc.warm {
					// A request of another prefix on the last endpoint (its only candidate:
					// homed there by every router alike), its decode measured.
					req := plRequest(prefixed(9, 0))
					if _, err := p.Pick(req, cs[5:]); err != nil {
						t.Fatal(err)
					}
					p.Routed(req, cs[5].Address)
					p.FirstToken(req.ID)
					clock = clock.Add(time.Second)
					p.Finished(req.ID)
				}
				return place(t, p, prefixed(3, 1), cs)
			}
			one := copyOn(-1)
			got := [2]string{copyOn(0), copyOn(1)}
			if got[0] != one {
				t.Fatalf("replica 0 copied to %s, one router to %s: the first replica must decide as one router", got[0], one)
			}
			for rank, want := range tc.want {
				if got[rank] != cs[want].Address {
					t.Fatalf("replica %d copied to %s, want %s (copies: %v)", rank, got[rank], cs[want].Address, got)
				}
			}
		})
	}
}

// Router replicas that find a prefix's best holder idle at the same instant, on the
// same view, take their turns by rank: replica r takes the holder one router's (r+1)-th
// pick in a row would (each earlier pick counted as load on its holder), instead of all
// joining the best one (kvbench --sim --replicas 4, N = 2, C = 16: 2 to 5 requests of
// one instant on one endpoint, TTFT p99 121 ms against kv's 101). Rank 0 takes the
// pick one router makes.
func TestPlacementReplicasTakeHoldersInTurn(t *testing.T) {
	cs := fleet(6, nil)
	ix := testindex.New()
	for _, i := range []int{1, 3, 5} {
		ix.Hold(cs[i].Address, plKeysOf(prefixed(4, 0)))
	}
	// One router's three picks in a row, each in flight on its endpoint when the next
	// is made.
	one := newPlacement(t, placement.DefaultConfig(), ix)
	inRow := slices.Clone(cs)
	var row []string
	for n := range 3 {
		req := plRequest(prefixed(4, n+1))
		d, err := one.Pick(req, inRow)
		if err != nil {
			t.Fatal(err)
		}
		one.Routed(req, d.Endpoint)
		row = append(row, d.Endpoint)
		for i := range inRow {
			if inRow[i].Address == d.Endpoint {
				inRow[i].InFlight++
			}
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(row)))) != 3 {
		t.Fatalf("one router's three picks in a row %v do not use the three idle holders", row)
	}
	for rank := range 3 {
		p := newPlacement(t, placement.DefaultConfig(), ix)
		p.SetPeers(&fakePeers{rank: rank, replicas: 3})
		if got := place(t, p, prefixed(4, 1), cs); got != row[rank] {
			t.Fatalf("replica %d took %s, want %s, one router's pick %d in a row (%v)", rank, got, row[rank], rank+1, row)
		}
	}
}

// TestPlacementFollowsAConversationAPeerRouted: with router replicas a conversation's
// turns reach any of them, so a turn may be the first of its conversation this router
// sees while the index shows the turn before it, which a peer routed, on some endpoint.
// The turn goes there, as its peer would send it, and not where the system prompt it
// shares with other conversations is placed (where it would recompute its history).
func TestPlacementFollowsAConversationAPeerRouted(t *testing.T) {
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	p.SetPeers(&fakePeers{replicas: 2})
	cs := fleet(6, nil)
	system, turn1, turn2 := chatTurns()
	// This router's two first turns show the system prompt branching.
	ix.Hold(cs[0].Address, plKeysOf(system))
	place(t, p, turn1(100), cs)
	place(t, p, turn1(101), cs)
	// A peer routed conversation c's first turn to endpoint c.
	for c := range cs {
		ix.Hold(cs[c].Address, plKeysOf(turn1(c)))
	}
	wantTurnsOnHistory(t, p, cs, turn2)
}

// TestPlacementLooksUpAPeersLongerHistory: with router replicas, a conversation's turns
// alternate between them, so what this router knows of a conversation it has routed
// turns of is the turn it last routed, older than the history. Its lookup in the index
// goes past that size: a peer routed the turn before to an endpoint that now holds it,
// and this router's table holds the conversation no longer anywhere (the index shows
// none of it where this router's own turns went). Cut at this router's old size, that
// endpoint looked to hold less than half of the grown history, no holder at all, and
// the turn went back to the system prompt's holder to recompute it (kvbench --sim
// --replicas 2 --workload chat: a turn sent to a site holding none of its 91-block
// history while another endpoint held 85 of them).
func TestPlacementLooksUpAPeersLongerHistory(t *testing.T) {
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	p.SetPeers(&fakePeers{replicas: 2})
	cs := fleet(6, nil)
	system := chatTurn(0, 0)
	ix.Hold(cs[0].Address, plKeysOf(system))
	place(t, p, chatTurn(100, 1), cs)
	place(t, p, chatTurn(101, 1), cs)
	for c := range 5 {
		// This router routes turns 1 and 3, a peer turns 2 and 4; the index shows
		// turn 4 on endpoint c+1 and, of the rest, the system prompt alone.
		place(t, p, chatTurn(c, 1), cs)
		place(t, p, chatTurn(c, 3), cs)
		for _, e := range cs {
			ix.Clear(e.Address)
		}
		ix.Hold(cs[0].Address, plKeysOf(system))
		ix.Hold(cs[c+1].Address, plKeysOf(chatTurn(c, 4)))
		if got := place(t, p, chatTurn(c, 5), cs); got != cs[c+1].Address {
			t.Errorf("conversation %d's turn 5 went to %s, turn 4 (its history) is on %s", c, got, cs[c+1].Address)
		}
	}
}

// TestPlacementTurnGoesToTheLongerHistory: holders whose waits are within replicaSpread
// are tied for router replicas, each breaking the tie its own way to spread
// simultaneous picks of a prefix; a conversation has one turn in flight at a time, and
// of two tied holders the one that holds more of its history (the index shows it to
// every replica) starts it sooner. Broken by the replica's salt, turns went to an
// endpoint holding 103 of their blocks while another held 118 (kvbench --sim --replicas
// 2 --workload chat).
func TestPlacementTurnGoesToTheLongerHistory(t *testing.T) {
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	cs := fleet(6, nil)
	busy := map[string]placement.Load{}
	for _, e := range cs {
		busy[e.Address] = placement.Load{Requests: 1}
	}
	p.SetPeers(&fakePeers{replicas: 2, load: busy})
	system := chatTurn(0, 0)
	ix.Hold(cs[0].Address, plKeysOf(system))
	place(t, p, chatTurn(100, 1), cs)
	place(t, p, chatTurn(101, 1), cs)
	for c := range cs {
		// A peer routed the conversation's turns 2 and 3: endpoint c holds the third,
		// the next one the second, and every endpoint runs one request.
		ix.Hold(cs[(c+1)%len(cs)].Address, plKeysOf(chatTurn(c, 2)))
		ix.Hold(cs[c].Address, plKeysOf(chatTurn(c, 3)))
	}
	for c := range cs {
		if got := place(t, p, chatTurn(c, 4), cs); got != cs[c].Address {
			t.Errorf("conversation %d's turn went to %s, all its history is on %s", c, got, cs[c].Address)
		}
	}
}

// TestPlacementCopyCostCountsPeersPrefill: copy_cost weighs a busy holder's hit by the
// requests running there, peers' included, and by the prefill backlog they wait behind:
// peers' too, the same requests (a peer's miss in prefill at the holder delays the hit
// as this router's own would). Counting peers' requests but only this router's backlog,
// a replica refused the copy one router makes (kvbench --sim --replicas 4, N = 24, C =
// 16, seed 8: the copy at a replica's 5th pick, a holder running a peer's 2,371-token
// miss; 0.654 -> 0.665, docs/results-policy.md). Without the peer's backlog, or with
// copy_cost off, the cases show the rule still judges the copy.
func TestPlacementCopyCostCountsPeersPrefill(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefill  int // the peer's request's uncached tokens without a first token at the holder
		copyCost bool
		copies   bool
	}{
		{"a peer's miss in prefill at the holder: a copy", 72 * 16, true, true},
		{"a peer's request decoding at the holder: the hit", 0, true, false},
		{"copy_cost off: a copy", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.CopyCost = tc.copyCost
			cfg.Saturated = 10
			cfg.HoldMax = 0 // the hit is not held behind the peer's miss
			clock := time.Unix(100, 0)
			// Every endpoint measured at one decode time: none is faster.
			p, cs, holder, rest := heldPrefix(t, cfg, &clock, time.Second, time.Second)
			other, busy := rest[0], rest[1]
			// This router runs two requests of other prefixes on busy: the prefix is
			// one in three of its requests, on one endpoint in three (no share
			// allowance).
			for k := range 2 {
				req := plRequest(plTokens(800_000_000+10_000_000*k, 8*16))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, busy)
				p.FirstToken(req.ID)
			}
			setInFlight(cs, busy, 2)
			p.SetPeers(&fakePeers{rank: 0, replicas: 2, load: map[string]placement.Load{
				holder: {Requests: 1, Prefill: tc.prefill},
			}})
			got := place(t, p, prefixed(0, 2), cs)
			if (got == other) != tc.copies || (!tc.copies && got != holder) {
				t.Fatalf("went to %s (holder %s, idle %s, busy %s), want a copy on the idle one: %v", got, holder, other, busy, tc.copies)
			}
		})
	}
}

// TestPlacementCountsAPeersContextOnce: agents on one 100k-token context (6,400 blocks)
// on endpoints of 7,000 blocks, a peer's agent turn in flight on the context's holder.
// An agent's next turn, whose history the holder shows, goes there: the peer's request
// holds the context (PeerActive names it, its blocks are in the peer's load), so the
// turn adds only its own tail, as beside this router's own request (need). Counted
// again in the turn's blocks, the context looked twice its size, short of room, and
// the turn recomputed its whole history on a cold endpoint; so did a conversation this
// router knew only from a peer's placements (MergePlacements names no parent: the
// request names it). kvbench --sim --replicas 2 --workload agent: three 103k-token
// turns recomputed, 30 to 44 s each, 1.91 requests/s against one router's 2.24.
func TestPlacementCountsAPeersContextOnce(t *testing.T) {
	depth := placement.DefaultConfig().PrefixDepth
	context, agent := contextAgents()
	for _, tc := range []struct {
		name   string
		merged bool // the conversation came from a peer's placements
	}{
		{"a conversation new to this router", false},
		{"a conversation a peer placed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			p := newPlacement(t, placement.DefaultConfig(), ix)
			cs := fleet(2, []int{7000, 7000})
			p.SetPeers(&fakePeers{replicas: 2})
			holder := agentsOnHolder(t, p, ix, cs, agent)
			// A peer routed agent 2's first two turns to the holder and has another
			// agent's turn in flight there, holding the context.
			ix.Hold(holder, plKeysOf(agent(2, 1)))
			if tc.merged {
				conv := plKeysOf(agent(2, 0))[6400+depth-1]
				p.MergePlacements([]placement.Placement{{Key: conv, Blocks: 6400 + 16, Base: 6400,
					Decided: time.Unix(0, 0), Sites: []placement.Site{{Endpoint: holder, Home: true}}}}, true, 0)
			}
			p.SetPeers(&fakePeers{replicas: 2,
				load:   map[string]placement.Load{holder: {Requests: 1, KVBlocks: 6400 + 8}},
				active: map[string]uint64{holder: plKeysOf(context)[depth-1]}})
			setInFlight(cs, holder, 1)
			if got := place(t, p, agent(2, 2), cs); got != holder {
				t.Errorf("agent 2's turn went to %s, its history and room for it are on %s", got, holder)
			}
		})
	}
}

// TestPlacementLooksUpAnUnlearnedPeersHistory: a conversation without a shared system
// prompt is a prefix of its own, and its turns alternate between router replicas. A
// peer placed its first turn (MergePlacements: its size, 8 blocks), this router routed
// the second (seen once here: its size is not learned from one request), the peer the
// third, to another endpoint. At the fourth, the lookup cut at the size this router
// knew (8 blocks plus one) showed the endpoint holding the third turn holding under
// half of the history the fourth reveals (40 blocks shared with the second): no holder,
// and the turn went to its placement, which had lost it (kvbench --sim --replicas 2
// --workload chat --system-prompts 0: 22 third turns sent off the endpoint holding the
// most of their prompt, one router 8).
func TestPlacementLooksUpAnUnlearnedPeersHistory(t *testing.T) {
	depth := placement.DefaultConfig().PrefixDepth
	turn := func(c, k int) []uint32 { // conversation c's k-th turn: 8 blocks, then 32 per turn
		out := plTokens(500_000_000+10_000*c, 8*16)
		for j := 1; j < k; j++ {
			out = append(out, plTokens(600_000_000+100_000_000*j+10_000*c, 32*16)...)
		}
		return out
	}
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	p.SetPeers(&fakePeers{replicas: 2})
	cs := fleet(6, nil)
	for c := range 5 {
		home, third := cs[c].Address, cs[c+1].Address
		p.MergePlacements([]placement.Placement{{Key: plKeysOf(turn(c, 1))[depth-1], Blocks: 8,
			Decided: time.Unix(0, 0), Sites: []placement.Site{{Endpoint: home, Home: true}}}}, true, 0)
		ix.Hold(home, plKeysOf(turn(c, 1)))
		if got := place(t, p, turn(c, 2), cs); got != home {
			t.Fatalf("conversation %d's second turn went to %s, its first is on %s", c, got, home)
		}
		// The peer sent the third turn elsewhere; the home lost the conversation.
		ix.Clear(home)
		ix.Hold(third, plKeysOf(turn(c, 3)))
		if got := place(t, p, turn(c, 4), cs); got != third {
			t.Errorf("conversation %d's fourth turn went to %s, its third is on %s", c, got, third)
		}
		ix.Clear(third)
	}
}

// TestPlacementLongMissCountsPeersHistories: with router replicas an endpoint's cache
// turns over with every replica's requests. A 16k-token document's first turn goes
// where its system prompt is unless it would evict a long prompt there
// (TestPlacementKeepsALongHistory); a peer's document there, shared as the peer's
// turnover, counts as this replica's own would, and once the blocks every replica sent
// there since pass the capacity, it is gone and counts for nothing.
func TestPlacementLongMissCountsPeersHistories(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sent  int // the peer's blocks sent to the holder, its document's 1,004 included
		doc   bool
		moves bool
	}{
		{"a peer's document on the holder: goes where it evicts nothing", 1004, true, true},
		{"a peer's document since turned over: stays", 3004, true, false},
		{"no peer document: stays", 1004, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.OutputBlocks = 4 // as TestPlacementKeepsALongHistory: the documents fill the 2,000 blocks
			p, _, cs, holder, _, doc := branchedSystemPrompt(t, cfg, 2000, nil)
			// This replica sent the two short conversations' 76 + 12 blocks there; the
			// peer's document came after them, its system prompt cached.
			peer := placement.EndpointLoad{Sent: tc.sent}
			if tc.doc {
				peer.Histories = []placement.History{{Before: 88, Cached: 64, Blocks: 1000}}
			}
			p.SetPeers(&fakePeers{turnover: map[string]placement.EndpointLoad{holder: peer}})
			got := place(t, p, doc(2, 1000), cs)
			if moved := got != holder; moved != tc.moves {
				t.Errorf("document went to %s (system prompt's holder %s), want moved=%v", got, holder, tc.moves)
			}
		})
	}
}
