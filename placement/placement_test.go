package placement_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/scoring"
)

func plTokens(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

var plReqN atomic.Int64

func plRequest(toks []uint32) *scoring.Request {
	return &scoring.Request{ID: fmt.Sprint("p", plReqN.Add(1)), Model: "m", BaseModel: "m", TokenIDs: toks}
}

func plKeysOf(toks []uint32) []uint64 { return index.Keys(index.Root("m", "", ""), toks, 16, nil) }

// prefixed is a prompt of 64 blocks of prefix p followed by 8 blocks of tail t.
func prefixed(p, t int) []uint32 {
	out := plTokens(1_000_000*(p+1), 64*16)
	return append(out, plTokens(500_000_000+10_000*t, 8*16)...)
}

// fleet is n endpoints with valid metrics and the given KV capacities (all 1000 blocks
// when caps is nil).
func fleet(n int, caps []int) []scoring.Endpoint {
	out := make([]scoring.Endpoint, n)
	for i := range out {
		c := 1000
		if caps != nil {
			c = caps[i]
		}
		out[i] = scoring.Endpoint{Address: fmt.Sprintf("10.0.0.%d:8000", i+1),
			Metrics: scoring.Metrics{Valid: true, NumGPUBlocks: c, BlockSize: 16}}
	}
	return out
}

func newPlacement(t testing.TB, cfg placement.Config, ix scoring.PrefixIndex) *placement.Policy {
	t.Helper()
	start := time.Unix(0, 0)
	return clockedPolicy(t, cfg, ix, &start)
}

// clockedPolicy is a placement policy of cfg over ix on the settable clock now.
func clockedPolicy(t testing.TB, cfg placement.Config, ix scoring.PrefixIndex, now *time.Time) *placement.Policy {
	t.Helper()
	p, err := placement.New(cfg, ix, func() time.Time { return *now }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// setInFlight sets the requests in flight at the candidate at addr.
func setInFlight(cs []scoring.Endpoint, addr string, n int) {
	for i := range cs {
		if cs[i].Address == addr {
			cs[i].InFlight = n
		}
	}
}

// place picks, tells the policy it was routed and finished, and returns the endpoint.
func place(t testing.TB, p *placement.Policy, toks []uint32, cs []scoring.Endpoint) string {
	t.Helper()
	req := plRequest(toks)
	d, err := p.Pick(req, cs)
	if err != nil {
		t.Fatal(err)
	}
	p.Routed(req, d.Endpoint)
	p.Finished(req.ID)
	return d.Endpoint
}

func TestPlacementHomeIsStable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefixes int
	}{{"one prefix", 1}, {"six prefixes over six", 6}, {"twenty over six", 20}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlacement(t, placement.DefaultConfig(), testindex.New())
			cs := fleet(6, nil)
			home := map[int]string{}
			for rep := 0; rep < 5; rep++ {
				for k := 0; k < tc.prefixes; k++ {
					got := place(t, p, prefixed(k, rep*100+k), cs)
					if h, ok := home[k]; ok && h != got {
						t.Fatalf("prefix %d moved from %s to %s on idle endpoints", k, h, got)
					}
					home[k] = got
				}
			}
		})
	}
}

func TestPlacementCapacityWeighting(t *testing.T) {
	for _, tc := range []struct {
		name string
		caps []int
		want []int // homes per endpoint
	}{
		{"equal", []int{1000, 1000, 1000}, []int{3, 3, 3}},
		{"one double", []int{1000, 1000, 2000}, []int{2, 2, 4}},
		{"one half", []int{1000, 500, 1000}, []int{4, 2, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlacement(t, placement.DefaultConfig(), testindex.New())
			cs := fleet(len(tc.caps), tc.caps)
			total := 0
			for _, w := range tc.want {
				total += w
			}
			got := make([]int, len(cs))
			for k := 0; k < total; k++ {
				ep := place(t, p, prefixed(k, k), cs)
				for i := range cs {
					if cs[i].Address == ep {
						got[i]++
					}
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("homes per endpoint = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPlacementSpillsOnlyOnSaturation(t *testing.T) {
	cfg := placement.DefaultConfig()
	cfg.Fill = 0.01 // no endpoint has room for a replica: only spills can move a prefix
	cfg.DivertDeadline = false
	for _, tc := range []struct {
		name      string
		homeLoad  int
		otherLoad int
		wantHome  bool
	}{
		{"idle home", 0, 0, true},
		{"one-request imbalance", 1, 0, true},
		// The others run a request each: an idle one would take a copy past Fill, its
		// 1,024-token prefill less than the 128-token tail's at nine running requests
		// (TestPlacementCopiesWhereAHitSavesLittle).
		{"below spill load", cfg.SpillLoad - 1, 1, true},
		{"at spill load", cfg.SpillLoad, 1, false},
		{"others saturated too", cfg.SpillLoad + 2, cfg.Saturated, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(3, nil)
			home := place(t, p, prefixed(0, 0), cs)
			ix.Hold(home, plKeysOf(prefixed(0, 0))[:64]) // the home computed it
			for i := range cs {
				cs[i].InFlight = tc.otherLoad
				if cs[i].Address == home {
					cs[i].InFlight = tc.homeLoad
				}
			}
			got := place(t, p, prefixed(0, 1), cs)
			if (got == home) != tc.wantHome {
				t.Fatalf("went to %s, home %s, want home: %v", got, home, tc.wantHome)
			}
		})
	}
}

func TestPlacementReplicatesOnlyWithinFreeCapacity(t *testing.T) {
	for _, tc := range []struct {
		name        string
		fill        float64
		wantReplica bool
	}{
		{"room for a replica", 0.5, true},
		{"no room: queue at home", 0.05, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.Fill = tc.fill
			cfg.CopyCost = false // Fill's room, not the copy's worth (TestPlacementCopyWithinFillPaysForItsMiss)
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(2, nil)
			home := place(t, p, prefixed(0, 0), cs)
			ix.Hold(home, plKeysOf(prefixed(0, 0))[:64]) // the home computed it
			for i := range cs {
				if cs[i].Address == home {
					cs[i].InFlight = cfg.ReplicaLoad
				}
			}
			got := place(t, p, prefixed(0, 1), cs)
			if (got != home) != tc.wantReplica {
				t.Fatalf("went to %s, home %s, want replica: %v", got, home, tc.wantReplica)
			}
		})
	}
}

func TestPlacementAdoptsWhatTheIndexHolds(t *testing.T) {
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	cs := fleet(4, nil)
	// Another router replica placed prefix 0 on the third endpoint: the index says so.
	ix.Hold(cs[2].Address, plKeysOf(prefixed(0, 99))[:64])
	for tail := 0; tail < 3; tail++ {
		if got := place(t, p, prefixed(0, tail), cs); got != cs[2].Address {
			t.Fatalf("request %d went to %s, want the holder %s", tail, got, cs[2].Address)
		}
	}
}

func TestPlacementChurnRemapsOnlyTheDepartedPrefixes(t *testing.T) {
	p := newPlacement(t, placement.DefaultConfig(), testindex.New())
	cs := fleet(4, nil)
	home := map[int]string{}
	for k := 0; k < 12; k++ {
		home[k] = place(t, p, prefixed(k, k), cs)
	}
	gone := cs[1].Address
	p.Forget(gone)
	left := append([]scoring.Endpoint{cs[0]}, cs[2:]...)
	moved := 0
	for k := 0; k < 12; k++ {
		got := place(t, p, prefixed(k, 100+k), left)
		switch {
		case home[k] == gone:
			moved++
		case got != home[k]:
			t.Fatalf("prefix %d moved from %s to %s though its home stayed", k, home[k], got)
		}
		home[k] = got
	}
	if moved != 3 {
		t.Fatalf("%d prefixes were homed on the departed endpoint, want 3", moved)
	}
	// A joining endpoint takes new prefixes; old ones stay where they are.
	joined := append(left, fleet(5, nil)[4])
	for k := 0; k < 12; k++ {
		if got := place(t, p, prefixed(k, 200+k), joined); got != home[k] {
			t.Fatalf("prefix %d moved from %s to %s when an endpoint joined", k, home[k], got)
		}
	}
	if got := place(t, p, prefixed(12, 300), joined); got != joined[3].Address {
		t.Fatalf("a new prefix went to %s, want the empty endpoint %s", got, joined[3].Address)
	}
}

func TestPlacementDivertsPastTheDeadline(t *testing.T) {
	cfg := placement.DefaultConfig()
	cfg.Fill = 0.01
	p := newPlacement(t, cfg, testindex.New())
	cs := fleet(2, nil)
	home := place(t, p, prefixed(0, 0), cs)
	// Four misses routed to home have not produced a first token: a large prefill backlog.
	for i := 1; i <= 4; i++ {
		req := plRequest(prefixed(0, i))
		d, err := p.Pick(req, cs)
		if err != nil {
			t.Fatal(err)
		}
		p.Routed(req, d.Endpoint)
	}
	if got := place(t, p, prefixed(0, 9), cs); got == home {
		t.Fatalf("went to the home %s behind %d backlog tokens", home, 4*72*16)
	}
}

func TestPlacementWithoutTokensPicksLeastLoaded(t *testing.T) {
	p := newPlacement(t, placement.DefaultConfig(), testindex.New())
	cs := fleet(3, nil)
	cs[0].InFlight, cs[1].InFlight, cs[2].InFlight = 3, 1, 2
	for _, toks := range [][]uint32{nil, plTokens(0, 15)} {
		d, err := p.Pick(plRequest(toks), cs)
		if err != nil {
			t.Fatal(err)
		}
		if d.Endpoint != cs[1].Address || len(d.Fallbacks) != 2 {
			t.Fatalf("got %+v, want %s first and two fallbacks", d, cs[1].Address)
		}
	}
	if _, err := p.Pick(plRequest(nil), nil); !errors.Is(err, scoring.ErrNoCandidates) {
		t.Fatalf("no candidates: err = %v", err)
	}
}

func TestPlacementFallbacks(t *testing.T) {
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	cs := fleet(8, nil)
	for i := range cs {
		cs[i].InFlight = 10 - i // the last candidates are the least loaded of the rest
	}
	// Endpoints 1 and 2 hold the prefix; 2 is idle, so it is chosen.
	cs[1].InFlight, cs[2].InFlight = 1, 0
	ix.Hold(cs[1].Address, plKeysOf(prefixed(0, 0))[:64])
	ix.Hold(cs[2].Address, plKeysOf(prefixed(0, 0))[:64])
	d, err := p.Pick(plRequest(prefixed(0, 1)), cs)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{cs[1].Address, cs[7].Address, cs[6].Address, cs[5].Address}
	if d.Endpoint != cs[2].Address || fmt.Sprint(d.Fallbacks) != fmt.Sprint(want) {
		t.Fatalf("got %s then %v, want %s then %v (holders first, then by load, at most 4)",
			d.Endpoint, d.Fallbacks, cs[2].Address, want)
	}
}

func TestPlacementMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	p, err := placement.New(placement.DefaultConfig(), testindex.New(), nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	cs := fleet(2, nil)
	place(t, p, prefixed(0, 0), cs)
	place(t, p, prefixed(0, 1), cs)
	place(t, p, nil, cs)
	want := `
# HELP kvrouter_scoring_placement_decisions_total Placement policy decisions by kind: holder, home, replica, spill, divert, queue, untokenized, hold (the router is asked to wait and pick again).
# TYPE kvrouter_scoring_placement_decisions_total counter
kvrouter_scoring_placement_decisions_total{kind="divert"} 0
kvrouter_scoring_placement_decisions_total{kind="hold"} 0
kvrouter_scoring_placement_decisions_total{kind="holder"} 1
kvrouter_scoring_placement_decisions_total{kind="home"} 1
kvrouter_scoring_placement_decisions_total{kind="queue"} 0
kvrouter_scoring_placement_decisions_total{kind="replica"} 0
kvrouter_scoring_placement_decisions_total{kind="spill"} 0
kvrouter_scoring_placement_decisions_total{kind="untokenized"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestPlacementConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*placement.Config)
		want   string
	}{
		{"defaults", func(*placement.Config) {}, ""},
		{"zero depth", func(c *placement.Config) { c.PrefixDepth = 0 }, "prefix_depth"},
		{"fill above one", func(c *placement.Config) { c.Fill = 1.5 }, "fill"},
		{"spill below saturated", func(c *placement.Config) { c.SpillLoad = 1; c.Saturated = 2 }, "spill_load"},
		{"zero headroom", func(c *placement.Config) { c.Headroom = 0 }, "headroom"},
		{"negative hold", func(c *placement.Config) { c.HoldMax = -1 }, "hold_max"},
		{"zero hold step", func(c *placement.Config) { c.HoldStep = 0 }, "hold_step"},
		{"zero holder share", func(c *placement.Config) { c.HolderShare = 0 }, "holder_share"},
		{"zero hold tokens", func(c *placement.Config) { c.HoldPrefillTokens = 0 }, "hold_prefill_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := placement.DefaultConfig()
			tc.modify(&c)
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.want)
			}
			if _, nerr := placement.New(c, testindex.New(), nil, nil); (nerr == nil) != (err == nil) {
				t.Fatalf("New error %v disagrees with Validate %v", nerr, err)
			}
		})
	}
	if _, err := placement.New(placement.DefaultConfig(), nil, nil, nil); err == nil {
		t.Fatal("New with no index: want an error")
	}
}

// benchPlacement measures Pick (with Routed and Finished) over n endpoints against the
// real index for reference-workload requests (one of 24 shared 2,032-token prefixes +
// a unique 339-token tail), each prefix stored on one endpoint. cpu-ns/op is the
// process's CPU time per pick: on a shared machine wall time overstates it.
func benchPlacement(b *testing.B, n int) {
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	cs := fleet(n, nil)
	root := index.Root("m", "", "")
	prefix := func(k int) []uint32 { return plTokens(1_000_000*(k+1), 2032) }
	for k := 0; k < 24; k++ {
		toks := prefix(k)[:127*16]
		handles := make([]uint64, 127)
		for i := range handles {
			handles[i] = uint64(k*1000 + i + 1)
		}
		if err := ix.Store(cs[k%n].Address, 0, index.Blocks{Root: root, Handles: handles, Tokens: toks, BlockSize: 16}); err != nil {
			b.Fatal(err)
		}
	}
	p := newPlacement(b, placement.DefaultConfig(), ix)
	reqs := make([]*scoring.Request, 256)
	for i := range reqs {
		reqs[i] = plRequest(append(prefix(i%24), plTokens(500_000_000+1000*i, 339)...))
	}
	b.ReportAllocs()
	cpu := cpuTime()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		req := reqs[i%len(reqs)]
		d, err := p.Pick(req, cs)
		if err != nil {
			b.Fatal(err)
		}
		p.Routed(req, d.Endpoint)
		p.Finished(req.ID)
	}
	b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

func BenchmarkPlacementPick6(b *testing.B)  { benchPlacement(b, 6) }
func BenchmarkPlacementPick64(b *testing.B) { benchPlacement(b, 64) }

func TestPlacementRehomesALostPrefix(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rehome   bool
		homeHeld bool // the index shows the home holding the prefix
		inFlight bool // a request for the prefix is in flight at the home
		wantMove bool
	}{
		{"home holds it", true, true, false, false},
		{"home lost it", true, false, false, true},
		{"home is computing it", true, false, true, false},
		{"rehome off", false, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.RehomeLost = tc.rehome
			cfg.Fill = 0.01 // no replicas: only a re-home moves the prefix
			cfg.DivertDeadline = false
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(2, nil)
			home := place(t, p, prefixed(0, 0), cs)
			if tc.homeHeld {
				ix.Hold(home, plKeysOf(prefixed(0, 0))[:64])
			}
			if tc.inFlight {
				req := plRequest(prefixed(0, 1))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, home)
			}
			// The home is busy with another prefix's requests; the other endpoint is idle.
			setInFlight(cs, home, 2)
			got := place(t, p, prefixed(0, 2), cs)
			if (got != home) != tc.wantMove {
				t.Fatalf("went to %s, home %s, want moved: %v", got, home, tc.wantMove)
			}
			if !tc.wantMove {
				return
			}
			// The new home computed it and is now where the prefix lives, even when the
			// old home is idle again.
			ix.Hold(got, plKeysOf(prefixed(0, 2))[:64])
			for i := range cs {
				cs[i].InFlight = 0
			}
			for tail := 3; tail < 6; tail++ {
				if again := place(t, p, prefixed(0, tail), cs); again != got {
					t.Fatalf("request %d went to %s, want the new home %s", tail, again, got)
				}
			}
		})
	}
}

func TestPlacementPrefersAHeldPlacement(t *testing.T) {
	for other := 0; other < 4; other++ {
		t.Run(fmt.Sprint("holder ", other), func(t *testing.T) {
			ix := testindex.New()
			p := newPlacement(t, placement.DefaultConfig(), ix)
			cs := fleet(4, nil)
			home := place(t, p, prefixed(0, 0), cs)
			if cs[other].Address == home {
				t.Skip("the holder is the home")
			}
			// Another router replica moved the prefix: the index shows it on cs[other]
			// and nowhere else; this router still has its home elsewhere.
			ix.Hold(cs[other].Address, plKeysOf(prefixed(0, 0))[:64])
			for tail := 1; tail < 4; tail++ {
				if got := place(t, p, prefixed(0, tail), cs); got != cs[other].Address {
					t.Fatalf("request %d went to %s, want the endpoint holding it %s", tail, got, cs[other].Address)
				}
			}
		})
	}
}

// A request that hits at an endpoint prefilling a miss is held (re-picked after
// HoldStep) until the miss's first token, within HoldMax, unless the endpoint has no KV
// room for it (it cannot join the miss's prefill: it waits for blocks in the engine's
// queue, where held, later requests would go ahead of it) or the miss was routed less
// than a hold step before it arrived (held, it would become slower than the miss);
// misses are never held.
func TestPlacementHoldsBehindAMiss(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name     string
		holdMax  time.Duration
		req      []uint32      // the request picked while the miss prefills
		since    time.Duration // from the miss's routing to the request's arrival
		held     time.Duration
		capacity int  // the endpoint's KV blocks (0: 1000)
		firstTok bool // the miss has its first token by then
		wantHold time.Duration
		wantKind string
	}{
		{"hit behind a miss is held", 120 * ms, prefixed(0, 2), 10 * ms, 0, 0, false, 5 * ms, "hold"},
		{"held again within the bound", 120 * ms, prefixed(0, 2), 10 * ms, 115 * ms, 0, false, 5 * ms, "hold"},
		{"never past the bound", 120 * ms, prefixed(0, 2), 10 * ms, 116 * ms, 0, false, 0, "holder"},
		{"released at the miss's first token", 120 * ms, prefixed(0, 2), 10 * ms, 10 * ms, 0, true, 0, "holder"},
		{"a miss routed as it arrived: joined", 120 * ms, prefixed(0, 2), 4 * ms, 0, 0, false, 0, "holder"},
		{"still joined after holds of its own", 120 * ms, prefixed(0, 2), 4 * ms, 20 * ms, 0, false, 0, "holder"},
		{"no KV room: not held", 120 * ms, prefixed(0, 2), 10 * ms, 0, 140, false, 0, "queue"},
		{"no KV room, the miss routed as it arrived: not held", 120 * ms, prefixed(0, 2), 0, 0, 140, false, 0, "queue"},
		{"no KV room after holds: routed", 120 * ms, prefixed(0, 2), 10 * ms, 20 * ms, 140, false, 0, "queue"},
		{"a miss itself is not held", 120 * ms, prefixed(2, 2), 10 * ms, 0, 0, false, 0, "home"},
		{"holds off", 0, prefixed(0, 2), 10 * ms, 0, 0, false, 0, "holder"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			cfg := placement.DefaultConfig()
			cfg.HoldMax = tc.holdMax
			reg := prometheus.NewRegistry()
			now := time.Unix(0, 0)
			p, err := placement.New(cfg, ix, func() time.Time { return now }, reg)
			if err != nil {
				t.Fatal(err)
			}
			var caps []int
			if tc.capacity > 0 {
				caps = []int{tc.capacity}
			}
			cs := fleet(1, caps)
			ep := cs[0].Address
			place(t, p, prefixed(0, 0), cs)
			ix.Hold(ep, plKeysOf(prefixed(0, 0))[:64]) // the endpoint holds prefix 0
			miss := plRequest(prefixed(1, 1))          // prefix 1: 1,152 uncached tokens
			if d, err := p.Pick(miss, cs); err != nil || d.Hold != 0 {
				t.Fatalf("the miss: %+v, %v", d, err)
			}
			p.Routed(miss, ep)
			if tc.firstTok {
				p.FirstToken(miss.ID)
			}
			cs[0].InFlight = 1
			now = now.Add(tc.since + tc.held)
			req := plRequest(tc.req)
			req.Held = tc.held
			before := decisionCount(t, reg, tc.wantKind)
			d, err := p.Pick(req, cs)
			if err != nil {
				t.Fatal(err)
			}
			if d.Hold != tc.wantHold || d.Endpoint != ep {
				t.Fatalf("decision %+v, want hold %v at %s", d, tc.wantHold, ep)
			}
			if tc.held+d.Hold > tc.holdMax && d.Hold > 0 {
				t.Fatalf("hold %v after %v passes hold_max %v", d.Hold, tc.held, tc.holdMax)
			}
			if got := decisionCount(t, reg, tc.wantKind) - before; got != 1 {
				t.Fatalf("decisions of kind %q: %v, want 1", tc.wantKind, got)
			}
		})
	}
}

// decisionCount reads kvrouter_scoring_placement_decisions_total{kind} from reg.
func decisionCount(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvrouter_scoring_placement_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestPlacementSharedLoad: with SharedLoad, an endpoint's scraped requests beyond the
// router's own in flight at the scrape count as another router's load (the prefix takes
// a replica elsewhere), while the router's own requests in a scrape do not.
func TestPlacementSharedLoad(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shared bool
		// scraped is the home's scraped running requests at the scrape, ownFirst whether
		// the router's own request was in flight then.
		scraped  int
		ownFirst bool
		wantHome bool
	}{
		{name: "off: scraped requests ignored", shared: false, scraped: 3, wantHome: true},
		{name: "another router's requests make the home busy", shared: true, scraped: 9, wantHome: false}, // a copy pays for its miss (9 > 72/8 - 1)
		{name: "own request in the scrape is not another router's", shared: true, scraped: 1, ownFirst: true, wantHome: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := index.New(index.DefaultConfig(), nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg := placement.DefaultConfig()
			cfg.SharedLoad = tc.shared
			cfg.RehomeLost = false
			clock := time.Unix(100, 0)
			p := clockedPolicy(t, cfg, ix, &clock)
			cs := fleet(2, nil)
			home := place(t, p, prefixed(0, 0), cs)
			var homeIdx int
			for i := range cs {
				if cs[i].Address == home {
					homeIdx = i
				}
			}
			// The index shows the prefix at its home, so the home holds it.
			handles := make([]uint64, 64)
			for i := range handles {
				handles[i] = uint64(i + 1)
			}
			if err := ix.Store(home, 0, index.Blocks{Root: index.Root("m", "", ""), Handles: handles,
				Tokens: prefixed(0, 0)[:64*16], BlockSize: 16}); err != nil {
				t.Fatal(err)
			}
			if tc.ownFirst {
				// The router's own request is in flight at the scrape, then finishes.
				req := plRequest(prefixed(0, 1))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, home)
				clock = clock.Add(10 * time.Millisecond)
				cs[homeIdx].Metrics.At = clock
				clock = clock.Add(10 * time.Millisecond)
				p.Finished(req.ID)
			} else {
				clock = clock.Add(10 * time.Millisecond)
				cs[homeIdx].Metrics.At = clock
			}
			cs[homeIdx].Metrics.Running = tc.scraped
			clock = clock.Add(10 * time.Millisecond)
			got := place(t, p, prefixed(0, 2), cs)
			if (got == home) != tc.wantHome {
				t.Errorf("picked %s, home %s: want home %v", got, home, tc.wantHome)
			}
		})
	}
}

// TestPlacementUnplacesADivertedReplica: a replica whose request is diverted past the
// deadline leaves no placement behind with UnplaceDiverted (the endpoint is not ranked as
// a holder afterwards); without it the unfilled replica stays a holder.
func TestPlacementUnplacesADivertedReplica(t *testing.T) {
	for _, tc := range []struct {
		name    string
		unplace bool
		want    int // the first fallback of the next pick, as a candidate index
	}{
		{"unplaced", true, 2},
		{"kept", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.MaxNumBatchedTokens = 1024 // the replica's 1,152-token miss is past one step (1,024 + a block); the move adds 1,024
			cfg.HoldMax = 0
			cfg.UnplaceDiverted = tc.unplace
			cfg.CopyCost = false // a replica at the first busy holder, whatever it is worth
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(3, nil)
			ix.Hold(cs[0].Address, plKeysOf(prefixed(0, 0))[:64])
			cs[0].InFlight = cfg.ReplicaLoad // busy: the prefix takes a replica on cs[1]
			if got := place(t, p, prefixed(0, 1), cs); got != cs[0].Address {
				t.Fatalf("replica's request went to %s, want it diverted to the holder %s", got, cs[0].Address)
			}
			cs[0].InFlight, cs[1].InFlight, cs[2].InFlight = 0, 3, 0
			d, err := p.Pick(plRequest(prefixed(0, 2)), cs)
			if err != nil {
				t.Fatal(err)
			}
			if d.Endpoint != cs[0].Address {
				t.Fatalf("went to %s, want the idle holder %s", d.Endpoint, cs[0].Address)
			}
			if len(d.Fallbacks) == 0 || d.Fallbacks[0] != cs[tc.want].Address {
				t.Fatalf("fallbacks %v, want %s first", d.Fallbacks, cs[tc.want].Address)
			}
		})
	}
}

// cpuTime is the process's user plus system CPU time, for benchmarks on a shared box.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestConversationFollowsItsHistory: conversations sharing a system prompt longer than
// prefix_depth blocks are one prefix to the first turn, but a later turn goes where the
// index shows its own history, not where the system prompt's placement would send it.
func TestConversationFollowsItsHistory(t *testing.T) {
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	cs := fleet(6, nil)
	_, turn1, turn2 := chatTurns()
	// Two conversations' first turns show the prefix branching at the system prompt;
	// from then on each first turn names its conversation.
	place(t, p, turn1(100), cs)
	place(t, p, turn1(101), cs)
	for c := range cs {
		// Each first turn ends up on its own endpoint (a fallback, another router):
		// the router reports where it went, and the index shows it there.
		req := plRequest(turn1(c))
		if _, err := p.Pick(req, cs); err != nil {
			t.Fatal(err)
		}
		p.Routed(req, cs[c].Address)
		p.Finished(req.ID)
		ix.Hold(cs[c].Address, plKeysOf(turn1(c)))
	}
	wantTurnsOnHistory(t, p, cs, turn2)
}

// TestLongPrefixStaysAtBusyHolder: a prefix one engine step recomputes spills off a
// holder whose queue reached spill_load (its requests decoding, no prefill backlog), but
// a 32k-token context stays at its holder: moving it would add far more prefill than
// the (empty) backlog it skips.
func TestLongPrefixStaysAtBusyHolder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		blocks int
		moves  bool
	}{{"one-step prefix spills", 64, true}, {"32k context stays", 2048, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			p := newPlacement(t, placement.DefaultConfig(), ix)
			cs := fleet(2, []int{20000, 20000})
			prompt := func(tail int) []uint32 {
				return append(plTokens(1_000_000, tc.blocks*16), plTokens(500_000_000+10_000*tail, 8*16)...)
			}
			first := plRequest(prompt(0))
			d, err := p.Pick(first, cs)
			if err != nil {
				t.Fatal(err)
			}
			holder := d.Endpoint
			p.Routed(first, holder)
			p.FirstToken(first.ID) // decoding: no prefill backlog
			ix.Hold(holder, plKeysOf(prompt(0)))
			for i := range cs {
				if cs[i].Address == holder {
					cs[i].InFlight = placement.DefaultConfig().SpillLoad
				}
			}
			got := place(t, p, prompt(1), cs)
			if moved := got != holder; moved != tc.moves {
				t.Errorf("second request went to %s (holder %s), want moved=%v", got, holder, tc.moves)
			}
		})
	}
}

// routeOn picks for a request of toks, routes it to addr whatever the pick, and when
// decoding gives it its first token.
func routeOn(t *testing.T, p *placement.Policy, cs []scoring.Endpoint, toks []uint32, addr string, decoding bool) {
	t.Helper()
	req := plRequest(toks)
	if _, err := p.Pick(req, cs); err != nil {
		t.Fatal(err)
	}
	p.Routed(req, addr)
	if decoding {
		p.FirstToken(req.ID)
	}
}

// wantHolderPick fails the test unless a request of toks goes to holder exactly when
// want says so.
func wantHolderPick(t *testing.T, p *placement.Policy, cs []scoring.Endpoint, toks []uint32, holder string, want bool) {
	t.Helper()
	d, err := p.Pick(plRequest(toks), cs)
	if err != nil {
		t.Fatal(err)
	}
	if (d.Endpoint == holder) != want {
		t.Fatalf("went to %s (holder %s), want holder %v", d.Endpoint, holder, want)
	}
}

// holderAndOther returns a policy on a settable clock over two endpoints with KV room
// for one 72-block request each (no output measured: it counts no output blocks), a
// prefix placed on one of them (holder), and the other endpoint.
func holderAndOther(t *testing.T) (p *placement.Policy, clock *time.Time, cs []scoring.Endpoint, holder, other string) {
	t.Helper()
	clock = new(time.Time)
	*clock = time.Unix(100, 0)
	p = clockedPolicy(t, placement.DefaultConfig(), testindex.New(), clock)
	cs = fleet(2, []int{100, 100})
	holder = place(t, p, prefixed(0, 0), cs)
	other = cs[0].Address
	if other == holder {
		other = cs[1].Address
	}
	return p, clock, cs, holder, other
}

// TestPlacementWaitsForKVRoomWhereItComesSoonest: with no KV room on any endpoint, a
// request goes where a decoding request started first and so frees its blocks soonest,
// its prefix's holder included.
func TestPlacementWaitsForKVRoomWhereItComesSoonest(t *testing.T) {
	for _, tc := range []struct {
		name        string
		holderFirst bool // the holder's decoding request started before the other's
		wantHolder  bool
	}{
		{"other frees first", false, false},
		{"holder frees first", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, clock, cs, holder, other := holderAndOther(t)
			// One decoding request of another prefix on each, started 100 ms apart.
			order := []string{other, holder}
			if tc.holderFirst {
				order = []string{holder, other}
			}
			for k, addr := range order {
				routeOn(t, p, cs, prefixed(k+1, 0), addr, true)
				*clock = clock.Add(100 * time.Millisecond)
			}
			wantHolderPick(t, p, cs, prefixed(0, 1), holder, tc.wantHolder)
		})
	}
}

// TestPlacementWaitsForKVRoomBehindFewerQueued: with no KV room on any endpoint and
// more requests on each than its decoding ones' blocks make room for, requests not
// started yet are queued for blocks ahead of the new one: it leaves its prefix's holder
// only for an endpoint where at least one whole request fewer is queued.
func TestPlacementWaitsForKVRoomBehindFewerQueued(t *testing.T) {
	for _, tc := range []struct {
		name         string
		holderQueued int // requests not started on the holder; one on the other endpoint
		wantHolder   bool
	}{
		{"holder queues one more", 2, false},
		{"as many queued", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, clock, cs, holder, other := holderAndOther(t)
			k := 1
			route := func(addr string, decoding bool) {
				routeOn(t, p, cs, prefixed(k, 0), addr, decoding)
				k++
			}
			// The holder's decoding request started first: by time alone, room comes
			// there first.
			route(holder, true)
			*clock = clock.Add(100 * time.Millisecond)
			route(other, true)
			for range tc.holderQueued {
				route(holder, false)
			}
			route(other, false)
			wantHolderPick(t, p, cs, prefixed(0, 1), holder, tc.wantHolder)
		})
	}
}

// TestPlacementOwnPrefixFreesNoRoom: the holder's decoding request of the new
// request's own prefix frees only its own blocks when it finishes, not the prefix's (the
// new request needs them): with a request of another prefix queued for blocks there, the
// holder has no room after that decode either, and the request goes where a decoding
// request of another prefix frees room. With nothing queued, the holder has room now.
func TestPlacementOwnPrefixFreesNoRoom(t *testing.T) {
	for _, tc := range []struct {
		name       string
		queued     bool // a request of another prefix, not started, on the holder
		wantHolder bool
	}{
		{"a miss queued for blocks at the holder", true, false},
		{"nothing queued at the holder", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, clock, cs, holder, other := holderAndOther(t)
			route := func(toks []uint32, addr string, decoding bool) { routeOn(t, p, cs, toks, addr, decoding) }
			// The holder's decoding request, of the same prefix, started first: by time
			// alone its blocks free first.
			route(prefixed(0, 1), holder, true)
			*clock = clock.Add(100 * time.Millisecond)
			route(prefixed(1, 0), other, true)
			if tc.queued {
				route(prefixed(2, 0), holder, false)
			}
			wantHolderPick(t, p, cs, prefixed(0, 2), holder, tc.wantHolder)
		})
	}
}

// TestPlacementSharedPrefixFreesWithItsLastRequest: two requests of one prefix on the
// holder free the prefix's blocks when the later of them finishes, if both are decoding:
// started before the other endpoint's request, room comes at the holder first. With one
// of them not started, the prefix stays held there and room comes at the other first.
func TestPlacementSharedPrefixFreesWithItsLastRequest(t *testing.T) {
	for _, tc := range []struct {
		name       string
		bothDecode bool
		wantHolder bool
	}{
		{"both decoding", true, true},
		{"one not started", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, clock, cs, holder, other := holderAndOther(t)
			route := func(toks []uint32, addr string, decoding bool) { routeOn(t, p, cs, toks, addr, decoding) }
			// Two requests of prefix 1 on the holder (64 prefix blocks once, 12 each),
			// then one of prefix 2 on the other endpoint, 100 ms later.
			route(prefixed(1, 0), holder, true)
			route(prefixed(1, 1), holder, tc.bothDecode)
			*clock = clock.Add(100 * time.Millisecond)
			route(prefixed(2, 0), other, true)
			wantHolderPick(t, p, cs, prefixed(0, 1), holder, tc.wantHolder)
		})
	}
}

// TestPlacementDeadlineIsOneStep: a request is diverted when its prefill backlog at the
// home (two 1,152-token misses ahead of its own 1,152) exceeds one engine step
// (max_num_batched_tokens plus a block), and stays at the home when a step covers it.
// An endpoint past Saturated takes it only when the fleet is behind its arrivals: the
// home is past Saturated too, or every other endpoint is while the home's backlog is a
// long prefill (more than 1/(1-miss_speedup) steps, which keeps the home's load low):
// queueing there then costs no more than at the home.
func TestPlacementDeadlineIsOneStep(t *testing.T) {
	sat := placement.DefaultConfig().Saturated
	for _, tc := range []struct {
		name                string
		budget              int
		homeLoad, otherLoad int  // requests in flight on each beyond this router's
		long                bool // a 14,400-token miss in prefill at the home too
		wantHome            bool
	}{
		{"past one step", 2048, 0, 0, false, false},
		{"within one step", 4096, 0, 0, false, true},
		{"both past saturated", 2048, sat + 1, sat, false, false},
		{"only the other past saturated", 2048, 1, sat, false, true},
		{"only the other past saturated, a long prefill at the home", 2048, 1, sat, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.Fill = 0.01 // no replicas: only a divert moves the request
			cfg.DivertMisses = false
			cfg.HoldMax = 0
			cfg.MaxNumBatchedTokens = tc.budget
			p := newPlacement(t, cfg, testindex.New())
			cs := fleet(2, []int{4000, 4000})
			home := place(t, p, prefixed(0, 0), cs)
			for i := 1; i <= 2; i++ {
				req := plRequest(prefixed(0, i))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, home)
			}
			if tc.long {
				req := plRequest(plTokens(900_000_000, 900*16))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, home)
			}
			for i := range cs {
				cs[i].InFlight = tc.otherLoad
				if cs[i].Address == home {
					cs[i].InFlight = tc.homeLoad
				}
			}
			if got := place(t, p, prefixed(0, 9), cs); (got == home) != tc.wantHome {
				t.Fatalf("went to %s (home %s), want home %v", got, home, tc.wantHome)
			}
		})
	}
}

// BenchmarkPlacementPickNoRoom: a pick when no endpoint has KV room (6 endpoints of 200
// blocks, each with 2 decoding requests of its own prefix, 256 in flight in all), the
// path that walks the in-flight requests for when blocks free (soonestRoom).
func BenchmarkPlacementPickNoRoom(b *testing.B) {
	clock := time.Unix(100, 0)
	p := clockedPolicy(b, placement.DefaultConfig(), testindex.New(), &clock)
	cs := fleet(6, []int{200, 200, 200, 200, 200, 200})
	for i := range 256 {
		req := plRequest(prefixed(i, 0))
		if _, err := p.Pick(req, cs); err != nil {
			b.Fatal(err)
		}
		p.Routed(req, cs[i%6].Address)
		p.FirstToken(req.ID)
		clock = clock.Add(time.Millisecond)
	}
	reqs := make([]*scoring.Request, 64)
	for i := range reqs {
		reqs[i] = plRequest(prefixed(1000+i, 1))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := p.Pick(reqs[i%len(reqs)], cs); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPlacementDivertBackTakesTheLeastLoadedHolder: a replica past one step is diverted
// back to the prefix's holders, which all start the request in the next step; it goes
// to the least-loaded of them (measured decode times alike), not the first listed.
func TestPlacementDivertBackTakesTheLeastLoadedHolder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loads [3]int
		want  int
	}{
		{"second", [3]int{3, 1, 2}, 1},
		{"first", [3]int{1, 3, 2}, 0},
		{"third", [3]int{2, 3, 1}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.MaxNumBatchedTokens = 1024 // the replica's 1,152-token miss is past one step; the move adds 1,024
			cfg.HoldMax = 0
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(4, nil)
			for i := range 3 {
				ix.Hold(cs[i].Address, plKeysOf(prefixed(0, 0))[:64])
				cs[i].InFlight = tc.loads[i] // every holder busy: a replica on the idle cs[3]
			}
			if got := place(t, p, prefixed(0, 1), cs); got != cs[tc.want].Address {
				t.Fatalf("went to %s, want the least-loaded holder %s", got, cs[tc.want].Address)
			}
		})
	}
}

// TestPlacementCopiesWhereAHitSavesLittle: past Fill, a busy holder's prefix gets a
// replica on an idle endpoint when the copy's prefill (the prefix) is less than what the
// request's own (its tail) adds to the steps of the requests running at the holder; a
// hit that saves most of the prompt, or a holder running one request, keeps the hit, and
// so does a prefix whose requests extend one another (a conversation's history). A
// prefix the index shows held nowhere, whose home keeps it (rehoming it would leave the
// homes unbalanced), gets a copy on the same terms as a held one.
func TestPlacementCopiesWhereAHitSavesLittle(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tailBlocks int
		load       int
		extends    bool // the first two requests extend one another instead of diverging
		lost       bool // the holder lost the prefix and no endpoint holds it
		copies     bool
	}{
		{"long tail, two running: a copy", 64, 2, false, false, true},
		{"long tail, one running: the hit", 64, 1, false, false, false},
		{"short tail, two running: the hit", 8, 2, false, false, false},
		{"short tail, nine running: a copy", 8, 9, false, false, true},
		{"a growing history, two running: the hit", 64, 2, true, false, false},
		{"held nowhere, long tail, two running: a copy", 64, 2, false, true, true},
		{"held nowhere, long tail, one running: the home", 64, 1, false, true, false},
		{"held nowhere, short tail, two running: the home", 8, 2, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.Fill = 0.05 // no replica within Fill: 50 of 1,000 blocks, the prefix is 64
			cfg.Saturated = 10
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(2, nil)
			prefix := plTokens(1_000_000, 64*16)
			prompt := func(tail int) []uint32 {
				return append(slices.Clip(prefix), plTokens(500_000_000+100_000*tail, tc.tailBlocks*16)...)
			}
			first := prompt(0)
			if tc.extends {
				first = prefix
			}
			holder := place(t, p, first, cs)
			ix.Hold(holder, plKeysOf(prefix))
			next := prompt(2)
			if tc.extends {
				// Each turn re-sends the last and adds to it: the holder has the history.
				turn := append(slices.Clip(prefix), plTokens(600_000_000, 16)...)
				place(t, p, turn, cs)
				ix.Hold(holder, plKeysOf(turn))
				next = append(slices.Clip(turn), plTokens(700_000_000, tc.tailBlocks*16)...)
			} else {
				place(t, p, prompt(1), cs)
			}
			if tc.lost {
				// Another prefix homed on the other endpoint: moving the lost home there
				// would give it twice the mean home share, past RehomeSlack.
				other := plTokens(2_000_000, 64*16)
				if got := place(t, p, append(other, plTokens(800_000_000, 16)...), cs); got == holder {
					t.Fatalf("second prefix homed on %s too", got)
				}
				ix.Clear(holder)
			}
			for i := range cs {
				if cs[i].Address == holder {
					cs[i].InFlight = tc.load
				}
			}
			if got := place(t, p, next, cs); (got != holder) != tc.copies {
				t.Fatalf("went to %s (holder %s), want a copy elsewhere: %v", got, holder, tc.copies)
			}
		})
	}
}

// TestPlacementHomesPrefixesSeenOnceByTheLearnedSize: a prefix seen once is counted in
// the home shares at the mean size learned from other prefixes when its prompt fits one
// engine step (its whole prompt only bounds its size), so a second prefix seen once ties
// with a learned one and the tie goes to the idle endpoint; a longer prompt counts whole.
func TestPlacementHomesPrefixesSeenOnceByTheLearnedSize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tailBlocks int
		want       int // endpoint index the third prefix is homed on
	}{
		{"one-step prompt: guessed as learned, the idle endpoint", 62, 1},
		{"prompt longer than a step: counted whole, the fewer home blocks", 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			p := newPlacement(t, placement.DefaultConfig(), ix)
			cs := fleet(2, nil)
			prompt := func(prefix, tail int) []uint32 {
				return append(plTokens(1_000_000*(prefix+1), 64*16), plTokens(500_000_000+100_000*tail, tc.tailBlocks*16)...)
			}
			// Prefix 0 is seen twice (its size, 64 blocks, learned) on the first endpoint.
			home := place(t, p, prompt(0, 0), cs)
			ix.Hold(home, plKeysOf(prompt(0, 0)))
			if got := place(t, p, prompt(0, 1), cs); got != home {
				t.Fatalf("second request of prefix 0 went to %s, home %s", got, home)
			}
			if home != cs[0].Address {
				t.Fatalf("prefix 0 homed on %s, want the first endpoint", home)
			}
			// Prefix 1, seen once, is homed on the other endpoint.
			if got := place(t, p, prompt(1, 0), cs); got != cs[1].Address {
				t.Fatalf("prefix 1 homed on %s, want %s", got, cs[1].Address)
			}
			// The first endpoint is busy: prefix 2 goes there only if prefix 1 counts
			// more home blocks than prefix 0.
			cs[0].InFlight = 1
			if got := place(t, p, prompt(2, 0), cs); got != cs[tc.want].Address {
				t.Fatalf("prefix 2 homed on %s, want %s", got, cs[tc.want].Address)
			}
		})
	}
}

// TestPlacementLeavesAPrefillInProgress: a hit whose prefill would join a miss in
// prefill at its holder (so finish a step later) goes to an endpoint with no prefill in
// progress where it starts in the next step and its copy fits beside the live
// placements, though that endpoint would not start it twice as soon; so does a miss of a
// prefix held nowhere (its home lost it), though the endpoint is busy; not when the
// endpoint prefills too, when the prompt is longer than a step, or when the copy would
// evict a live placement.
func TestPlacementLeavesAPrefillInProgress(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tailBlocks  int
		otherCap    int
		otherFilled bool // a miss in prefill on the other endpoint too
		nowhere     bool // the holder lost the prefix: held nowhere, the request a miss
		leaves      bool
	}{
		{"one-step prompt, other endpoint only decoding: leaves", 62, 1000, false, false, true},
		{"other endpoint prefilling too: stays", 62, 1000, true, false, false},
		{"prompt longer than a step: stays", 100, 1000, false, false, false},
		{"no room for the copy beside the live placements: stays", 62, 200, false, false, false},
		{"held nowhere, other endpoint only decoding: leaves", 62, 1000, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.Fill = 0.01 // no replica within Fill
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(2, []int{1000, tc.otherCap})
			prompt := func(prefix, tail int) []uint32 {
				return append(plTokens(1_000_000*(prefix+1), 64*16), plTokens(500_000_000+100_000*tail, tc.tailBlocks*16)...)
			}
			holder := place(t, p, prompt(0, 0), cs)
			ix.Hold(holder, plKeysOf(prompt(0, 0)))
			other := cs[1].Address
			if holder != cs[0].Address {
				t.Fatalf("prefix 0 homed on %s, want the first endpoint", holder)
			}
			// A miss of another prefix in prefill (routed, no first token) at the holder,
			// and, in one case, one at the other endpoint.
			miss := func(prefix int, at string) {
				req := plRequest(prompt(prefix, 0))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, at)
			}
			miss(1, holder)
			if tc.otherFilled {
				miss(2, other)
			}
			if tc.otherCap < 1000 {
				// A prefix homed on the other endpoint alone: live there.
				place(t, p, prompt(3, 0), cs[1:])
			}
			// The holder runs the miss and a decoding request, the other endpoint one
			// request (decoding, or the second miss): it takes no replica, and a copy
			// is not worth its miss (copyWorth wants it idle).
			if tc.nowhere {
				// The home stays: moving it would give the other endpoint more than
				// RehomeSlack x the mean home share.
				ix.Clear(holder)
			}
			cs[0].InFlight, cs[1].InFlight = 2, 1
			d, err := p.Pick(plRequest(prompt(0, 1)), cs)
			if err != nil {
				t.Fatal(err)
			}
			if (d.Endpoint == other) != tc.leaves {
				t.Fatalf("went to %s (holder %s), want to leave the holder: %v", d.Endpoint, holder, tc.leaves)
			}
		})
	}
}

// branchedSystemPrompt returns a policy on the clock now (nil: a fixed one) over two endpoints of capacity blocks each, a
// 64-block system prompt that two short conversations have branched and that the index
// shows on its holder, the holder, the other endpoint and a builder of prompts: the
// system prompt followed by n blocks of document d.
func branchedSystemPrompt(t *testing.T, cfg placement.Config, capacity int, now func() time.Time) (p *placement.Policy, ix *testindex.Index, cs []scoring.Endpoint, holder, other string, doc func(d, n int) []uint32) {
	t.Helper()
	ix = testindex.New()
	if now == nil {
		now = func() time.Time { return time.Unix(0, 0) }
	}
	p, err := placement.New(cfg, ix, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs = fleet(2, []int{capacity, capacity})
	system := plTokens(1_000_000, 64*16)
	doc = func(d, n int) []uint32 {
		return append(append([]uint32(nil), system...), plTokens(500_000_000+1_000_000*d, n*16)...)
	}
	holder = place(t, p, doc(100, 8), cs)
	ix.Hold(holder, plKeysOf(system))
	if got := place(t, p, doc(101, 8), cs); got != holder {
		t.Fatalf("second short conversation went to %s, the system prompt is on %s", got, holder)
	}
	other = cs[0].Address
	if other == holder {
		other = cs[1].Address
	}
	return p, ix, cs, holder, other, doc
}

// TestPlacementKeepsALongHistory: a 16k-token document's first turn goes where its
// system prompt is, and so does the next document's, unless that would evict the first
// (1,000 + 1,000 blocks of documents and the 64-block system prompt on 2,000 blocks):
// then it goes where it evicts nothing, if there is such an endpoint.
func TestPlacementKeepsALongHistory(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keep      bool
		otherFull bool // the other endpoint holds a long prompt of its own
		moves     bool
	}{
		{"second document goes where it evicts nothing", true, false, true},
		{"without long_contexts it evicts the first", false, false, false},
		{"evicting everywhere it stays", true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.LongContexts = tc.keep
			// The documents fill the 2,000 blocks exactly: their output (4 blocks each) is
			// what the second one would evict.
			cfg.OutputBlocks = 4
			p, ix, cs, holder, other, doc := branchedSystemPrompt(t, cfg, 2000, nil)
			if got := place(t, p, doc(1, 1000), cs); got != holder {
				t.Fatalf("first document went to %s, its system prompt is on %s", got, holder)
			}
			ix.Hold(holder, plKeysOf(doc(1, 1000)))
			if tc.otherFull {
				req := plRequest(plTokens(900_000_000, 1200*16))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, other)
				p.Finished(req.ID)
			}
			got := place(t, p, doc(2, 1000), cs)
			if moved := got != holder; moved != tc.moves {
				t.Errorf("second document went to %s (system prompt's holder %s), want moved=%v", got, holder, tc.moves)
			}
		})
	}
}

// TestPlacementTurnJoinsItsHistoryInPrefill: a conversation's second turn sent while
// its first (routed to the other endpoint) is still in prefill, so the index does not
// show it yet, goes where the first is: it waits behind that prefill instead of
// recomputing the document where the system prompt is. It does so however loaded that
// endpoint is: with Saturated requests decoding there too (a fleet behind its
// arrivals), the document would still be recomputed anywhere else.
func TestPlacementTurnJoinsItsHistoryInPrefill(t *testing.T) {
	for _, tc := range []struct {
		name      string
		keep      bool
		saturated bool // the first turn's endpoint runs Saturated other requests too
	}{
		{"long_contexts=true", true, false},
		{"long_contexts=false", false, false},
		{"past saturated it still joins", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.LongContexts = tc.keep
			p, _, cs, holder, other, doc := branchedSystemPrompt(t, cfg, 1000, nil)
			first := plRequest(doc(1, 150))
			if _, err := p.Pick(first, cs); err != nil {
				t.Fatal(err)
			}
			p.Routed(first, other) // no first token: in prefill
			if tc.saturated {
				for i := range cs {
					if cs[i].Address == other {
						cs[i].InFlight = 1 + cfg.Saturated // the first turn and others decoding
					}
				}
			}
			second := append(doc(1, 150), plTokens(700_000_000, 8*16)...)
			want := holder
			if tc.keep {
				want = other
			}
			if got := place(t, p, second, cs); got != want {
				t.Errorf("second turn went to %s, want %s (first turn in prefill on %s, system prompt on %s)", got, want, other, holder)
			}
		})
	}
}

// TestPlacementTurnLeavesASlowerHistoryInPrefill: a conversation's second turn sent
// while its first is in prefill on the other endpoint joins it there, unless an
// endpoint with no prefill backlog would compute the whole turn, at its measured
// prefill speed, before the first turn's prefill ends at the other endpoint's measured
// speed: then it is recomputed there.
func TestPlacementTurnLeavesASlowerHistoryInPrefill(t *testing.T) {
	for _, tc := range []struct {
		name       string
		holderTTFT time.Duration // a 16,000-token prompt's time to first token on the holder
		otherTTFT  time.Duration // and on the other endpoint, where the first turn is
		since      time.Duration // from the first turn's routing to the second's
		recomputed bool
	}{
		{"history measured slower: recomputed", time.Second, 2 * time.Second, 0, true},
		{"history measured faster: joined", 2 * time.Second, time.Second, 0, false},
		{"history almost prefilled: joined", time.Second, 2 * time.Second, 1500 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p, _, cs, holder, other, doc := branchedSystemPrompt(t, placement.DefaultConfig(), 100_000, func() time.Time { return clock })
			measurePrefill(t, p, cs, &clock, timedAt{holder, tc.holderTTFT}, timedAt{other, tc.otherTTFT})
			// The first turn: 15,424 tokens, routed to the other endpoint, in prefill.
			first := plRequest(doc(1, 900))
			if _, err := p.Pick(first, cs); err != nil {
				t.Fatal(err)
			}
			p.Routed(first, other)
			clock = clock.Add(tc.since)
			want := other
			if tc.recomputed {
				want = holder
			}
			second := append(doc(1, 900), plTokens(700_000_000, 8*16)...)
			if got := place(t, p, second, cs); got != want {
				t.Errorf("second turn went to %s, want %s (first turn in prefill on %s)", got, want, other)
			}
		})
	}
}

// TestPlacementTurnsShareTheirHistorysBlocks: a document's turns in flight together on
// one endpoint share the document's blocks there, so they count once in its KV
// footprint. The second turn (572 blocks) is sent while the first (564) is in prefill
// and joins it; with both decoding on the holder (1,000 blocks), a third turn (580)
// fits beside them (600 blocks with its output) and stays, where counting the second
// turn's blocks apart (1,100) or the third's (1,164) would divert it to recompute the
// document on the other endpoint.
func TestPlacementTurnsShareTheirHistorysBlocks(t *testing.T) {
	p, ix, cs, holder, _, doc := branchedSystemPrompt(t, placement.DefaultConfig(), 1000, nil)
	var turns [][]uint32
	for k := range 3 {
		turns = append(turns, append(doc(1, 500), plTokens(700_000_000, k*8*16)...))
	}
	var reqs []*scoring.Request
	for k, toks := range turns[:2] {
		req := plRequest(toks)
		d, err := p.Pick(req, cs)
		if err != nil {
			t.Fatal(err)
		}
		if d.Endpoint != holder {
			t.Fatalf("turn %d went to %s, its system prompt is on %s", k+1, d.Endpoint, holder)
		}
		p.Routed(req, d.Endpoint) // the first in prefill when the second is sent
		reqs = append(reqs, req)
	}
	for k, req := range reqs {
		p.FirstToken(req.ID) // both decoding: in flight, holding the document's blocks
		ix.Hold(holder, plKeysOf(turns[k]))
	}
	if got := place(t, p, turns[2], cs); got != holder {
		t.Errorf("third turn went to %s, want %s (its first two turns decoding there)", got, holder)
	}
}

// TestPlacementLongMissGoesToTheFasterPrefill: a 16k-token document's first turn goes
// where its system prompt is, unless the other endpoint was measured prefilling prompts
// of its size twice as fast: there it starts sooner, recomputing the system prompt too.
func TestPlacementLongMissGoesToTheFasterPrefill(t *testing.T) {
	for _, long := range []bool{true, false} {
		t.Run(fmt.Sprint("long_contexts=", long), func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.LongContexts = long
			clock := time.Unix(100, 0)
			p, _, cs, holder, other, doc := branchedSystemPrompt(t, cfg, 100_000, func() time.Time { return clock })
			// One unrelated 16k-token prompt on each endpoint: 2 s to its first token on
			// the holder, 1 s on the other.
			measurePrefill(t, p, cs, &clock, timedAt{holder, 2 * time.Second}, timedAt{other, time.Second})
			want := holder
			if long {
				want = other
			}
			if got := place(t, p, doc(1, 1000), cs); got != want {
				t.Errorf("document went to %s, want %s (system prompt on %s, measured slower)", got, want, holder)
			}
		})
	}
}

// TestPlacementLongMissCountsAnUnmeasuredEndpointSlowest: a 16k-token document's first
// turn at its system prompt's holder, whose prefill speed for its size is unmeasured,
// counts there as the slowest measured endpoint (1.4 s per 16,000 tokens), as the other
// rules timing prefills count an unknown endpoint: the endpoint measured at 1 s then
// takes it (1.06 s with the system prompt, under 0.85 x 1.4 s). Counted at the mean of
// the measured ones (1.2 s), it stayed on the holder. With the holder measured at the
// slow speed too it moves the same; measured as fast, it stays.
func TestPlacementLongMissCountsAnUnmeasuredEndpointSlowest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		holder time.Duration // the holder's measured time for 16,000 tokens; 0: unmeasured
		moves  bool
	}{
		{"holder unmeasured: moves to the fast one", 0, true},
		{"holder measured slow: moves", 1400 * time.Millisecond, true},
		{"holder measured fast: stays", time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			ix := testindex.New()
			p := clockedPolicy(t, placement.DefaultConfig(), ix, &clock)
			cs := fleet(3, []int{100_000, 100_000, 100_000})
			system := plTokens(1_000_000, 64*16)
			doc := func(d, n int) []uint32 {
				return append(append([]uint32(nil), system...), plTokens(500_000_000+1_000_000*d, n*16)...)
			}
			holder := place(t, p, doc(100, 8), cs)
			ix.Hold(holder, plKeysOf(system))
			var others []string
			for _, c := range cs {
				if c.Address != holder {
					others = append(others, c.Address)
				}
			}
			fast, slow := others[0], others[1]
			at := []timedAt{{fast, time.Second}, {slow, 1400 * time.Millisecond}}
			if tc.holder > 0 {
				at = append(at, timedAt{holder, tc.holder})
			}
			measurePrefill(t, p, cs, &clock, at...)
			want := holder
			if tc.moves {
				want = fast
			}
			if got := place(t, p, doc(1, 1000), cs); got != want {
				t.Errorf("document went to %s, want %s (system prompt on %s, %s measured fastest)", got, want, holder, fast)
			}
		})
	}
}

// TestPlacementLongMissWeighsItsOwnPrefill: a 16k-token document's first turn stays
// on its system prompt's holder, measured fastest, though it evicts a history there
// (the holder's KV holds one such prompt): the evicted history's recompute is not this
// request's cost. Only an endpoint measured faster beyond noise takes it.
func TestPlacementLongMissWeighsItsOwnPrefill(t *testing.T) {
	for _, tc := range []struct {
		name      string
		otherTTFT time.Duration // a 16,000-token prompt's time to first token on the other endpoint; 1 s on the holder
		moves     bool
	}{
		{"other measured slower: stays though it evicts", 1400 * time.Millisecond, false},
		{"other measured faster: moves", 500 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p, _, cs, holder, other, doc := branchedSystemPrompt(t, placement.DefaultConfig(), 1100, func() time.Time { return clock })
			for i := range cs {
				if cs[i].Address == other {
					cs[i].Metrics.NumGPUBlocks = 100_000 // evicts no history there
				}
			}
			measurePrefill(t, p, cs, &clock, timedAt{holder, time.Second}, timedAt{other, tc.otherTTFT})
			want := holder
			if tc.moves {
				want = other
			}
			if got := place(t, p, doc(1, 1000), cs); got != want {
				t.Errorf("document went to %s, want %s (system prompt on %s)", got, want, holder)
			}
		})
	}
}

// TestPlacementLongMissCountsTheBacklog: a 16k-token document's first turn goes where
// its prefill ends soonest, its prefill backlog counted: with prefill speeds measured
// even and a 16k-token prompt in prefill on its system prompt's holder, it goes to the
// other endpoint (no backlog, the system prompt recomputed too); with no backlog on the
// holder it stays. (Both endpoints run a decoding request, so no replica is made, and
// the other starts it less than twice as soon, so the divert rules leave it.)
func TestPlacementLongMissCountsTheBacklog(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backlog bool
		moves   bool
	}{
		{"holder's prefill backlog: moves", true, true},
		{"no backlog: stays", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p, _, cs, holder, other, doc := branchedSystemPrompt(t, placement.DefaultConfig(), 100_000, func() time.Time { return clock })
			measurePrefill(t, p, cs, &clock, timedAt{holder, time.Second}, timedAt{other, time.Second})
			for i := range cs {
				cs[i].InFlight = 1
			}
			if tc.backlog {
				req := plRequest(plTokens(800_000_000, 1000*16))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, holder) // no first token: in prefill
			}
			want := holder
			if tc.moves {
				want = other
			}
			if got := place(t, p, doc(1, 1000), cs); got != want {
				t.Errorf("document went to %s, want %s (system prompt on %s)", got, want, holder)
			}
		})
	}
}

// TestPlacementMissLeavesALongPrefill: a new prefix's first request (longer than one
// step, so besidePrefill does not take it) homed beside a prefill in progress is a miss
// no idle faster endpoint takes (one speed measured). Behind a long prefill (16,000
// tokens) it goes where it starts twice as soon; behind a short one (2,400 tokens) it
// stays with its home. (The fleet is not starting: one decode time is measured, so the
// home is the partition's, not one beside no prefill.)
func TestPlacementMissLeavesALongPrefill(t *testing.T) {
	for _, tc := range []struct {
		name          string
		backlogBlocks int
		leaves        bool
	}{
		{"behind a long prefill: leaves", 1000, true},
		{"behind a short prefill: stays", 150, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p := clockedPolicy(t, placement.DefaultConfig(), testindex.New(), &clock)
			cs := fleet(2, []int{100_000, 100_000})
			first := plRequest(plTokens(100_000_000, 1100*16))
			d, err := p.Pick(first, cs)
			if err != nil {
				t.Fatal(err)
			}
			big := d.Endpoint
			p.Routed(first, big)
			clock = clock.Add(time.Second)
			p.FirstToken(first.ID)
			clock = clock.Add(time.Second)
			p.Finished(first.ID)
			backlog := plRequest(plTokens(200_000_000, tc.backlogBlocks*16))
			d, err = p.Pick(backlog, cs)
			if err != nil {
				t.Fatal(err)
			}
			if d.Endpoint == big {
				t.Fatalf("the backlog's prompt went to %s beside the larger home", d.Endpoint)
			}
			p.Routed(backlog, d.Endpoint) // no first token: in prefill
			busy := d.Endpoint
			setInFlight(cs, busy, 1)
			got := place(t, p, plTokens(300_000_000, 164*16), cs)
			if (got != busy) != tc.leaves {
				t.Errorf("went to %s (prefill of %d blocks in progress on %s), want to leave it: %v", got, tc.backlogBlocks, busy, tc.leaves)
			}
		})
	}
}

// TestPlacementHistoryStaysWithABusyHolder: a growing prefix (a conversation's
// history, no branch) whose holder is busy takes no replica on the idle endpoint when
// that would recompute its history (60 blocks and more) for an 8-block turn, room
// within Fill or not, unless another request of it is in flight: then the replica
// shares their load. Prompts stay within one step, so no divert moves them back.
func TestPlacementHistoryStaysWithABusyHolder(t *testing.T) {
	for _, tc := range []struct {
		name     string
		inFlight bool
		moves    bool
	}{
		{"a turn alone stays with its busy holder", false, false},
		{"with another request of it in flight it takes a replica", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			p := newPlacement(t, placement.DefaultConfig(), ix)
			cs := fleet(2, []int{10_000, 10_000})
			turn := plTokens(100_000_000, 60*16)
			next := func() []uint32 {
				turn = append(append([]uint32(nil), turn...), plTokens(200_000_000+len(turn), 8*16)...)
				return turn
			}
			holder := place(t, p, turn, cs)
			ix.Hold(holder, plKeysOf(turn))
			if got := place(t, p, next(), cs); got != holder {
				t.Fatalf("second turn went to %s, the first is on %s", got, holder)
			}
			ix.Hold(holder, plKeysOf(turn))
			if tc.inFlight {
				req := plRequest(next())
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, holder)
				p.FirstToken(req.ID) // decoding, not finished
				ix.Hold(holder, plKeysOf(turn))
			}
			setInFlight(cs, holder, 2)
			got := place(t, p, next(), cs)
			if (got != holder) != tc.moves {
				t.Errorf("went to %s (holder %s busy), want moved=%v", got, holder, tc.moves)
			}
		})
	}
}

// TestPlacementCopyWithinFillPaysForItsMiss: with KV memory to spare (Fill never binds),
// a busy holder's shared prefix takes a replica on a less loaded endpoint only when the
// request's miss there delays fewer requests' steps than its hit at the holder (its
// uncached tokens times the requests running there plus itself), or when that endpoint
// is measured faster beyond noise. Without copy_cost any less loaded endpoint takes one.
func TestPlacementCopyWithinFillPaysForItsMiss(t *testing.T) {
	for _, tc := range []struct {
		name   string
		load   int           // requests running at the holder; -1: one, of the prefix
		decode time.Duration // the other endpoint's measured decode time; the holder's is 1 s
		copies bool
	}{
		{"one running, equal speeds: the hit", 1, time.Second, false},
		{"nine running: a copy", 9, time.Second, true},
		{"one running, the other faster beyond noise: a copy", 1, 500 * time.Millisecond, true},
		{"one running, the other faster within noise: the hit", 1, 900 * time.Millisecond, false},
		{"one of its own running: a copy (its share of the load needs both)", -1, time.Second, true},
	} {
		for _, on := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/copy_cost=%v", tc.name, on), func(t *testing.T) {
				cfg := placement.DefaultConfig()
				cfg.CopyCost = on
				cfg.Saturated = 10
				clock := time.Unix(100, 0)
				p, cs, holder, _ := heldPrefix(t, cfg, &clock, tc.decode)
				if tc.load < 0 {
					// One request of the prefix decoding at its holder, picked while idle.
					req := plRequest(prefixed(0, 9))
					if d, err := p.Pick(req, cs); err != nil || d.Endpoint != holder {
						t.Fatalf("Pick = %v, %v; want the idle holder %s", d.Endpoint, err, holder)
					}
					p.Routed(req, holder)
					p.FirstToken(req.ID)
				}
				for i := range cs {
					if cs[i].Address == holder {
						cs[i].InFlight = max(tc.load, 1)
					}
				}
				want := tc.copies || !on
				if got := place(t, p, prefixed(0, 2), cs); (got != holder) != want {
					t.Fatalf("went to %s (holder %s), want a copy elsewhere: %v", got, holder, want)
				}
			})
		}
	}
}

// TestPlacementCopyShareInOneReplicasView: a router replica judges a prefix's share of
// the load (copy_cost's allowance) from its own requests, of the prefix and in all: it
// does not know its peers' requests per prefix, and counted against the whole fleet's
// load (peers' included) the share of a prefix only this replica sends looked a
// fraction of what it is, and its copy was refused (4 replicas, N = 24, C = 16: -1.6
// points against one router; docs/results-policy.md).
func TestPlacementCopyShareInOneReplicasView(t *testing.T) {
	cfg := placement.DefaultConfig()
	cfg.Saturated = 10
	clock := time.Unix(100, 0)
	p, cs, holder, others := heldPrefix(t, cfg, &clock, time.Second)
	other := others[0]
	req := plRequest(prefixed(0, 9))
	if d, err := p.Pick(req, cs); err != nil || d.Endpoint != holder {
		t.Fatalf("Pick = %v, %v; want the idle holder %s", d.Endpoint, err, holder)
	}
	p.Routed(req, holder)
	p.FirstToken(req.ID)
	// A peer runs two requests of other prefixes on each endpoint.
	p.SetPeers(&fakePeers{rank: 0, replicas: 2, load: map[string]placement.Load{
		holder: {Requests: 2}, other: {Requests: 2},
	}})
	setInFlight(cs, holder, 1)
	if got := place(t, p, prefixed(0, 2), cs); got != other {
		t.Fatalf("went to %s (holder %s): want a copy on %s, the prefix's share of this replica's load needs both", got, holder, other)
	}
}

// TestPlacementRefusedCopyGoesToTheSoonestHolder: a copy that does not pay for its miss
// leaves the request with the holders, and it goes where a copy's request diverted back
// to them would: to the holder that starts it soonest, the least loaded of those within
// noise of it in measured decode time, not by wait (load + 1 times decode time) to a
// slow holder running fewer. Without copy_cost the idle endpoint takes a copy.
func TestPlacementRefusedCopyGoesToTheSoonestHolder(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("copy_cost=", on), func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.CopyCost = on
			cfg.HoldMax = 0
			ix := testindex.New()
			clock := time.Unix(100, 0)
			p := clockedPolicy(t, cfg, ix, &clock)
			cs := fleet(3, []int{10_000, 10_000, 10_000})
			fast, slow, idle := cs[0].Address, cs[1].Address, cs[2].Address
			for k, m := range []struct {
				addr string
				d    time.Duration
			}{{fast, 700 * time.Millisecond}, {slow, time.Second}, {idle, time.Second}} {
				req := plRequest(plTokens(900_000_000+10_000_000*k, 8*16))
				if _, err := p.Pick(req, cs[k:k+1]); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, m.addr)
				p.FirstToken(req.ID)
				clock = clock.Add(m.d)
				p.Finished(req.ID)
			}
			ix.Hold(fast, plKeysOf(prefixed(0, 0))[:64])
			ix.Hold(slow, plKeysOf(prefixed(0, 0))[:64])
			place(t, p, prefixed(0, 1), cs[:2])
			place(t, p, prefixed(0, 2), cs[:2]) // the prefix's size is learned: 64 blocks
			// By wait the slow holder ((1 + 1) x 1 s) beats the fast one ((2 + 1) x 0.7 s).
			cs[0].InFlight, cs[1].InFlight = 2, 1
			want := fast
			if !on {
				want = idle
			}
			if got := place(t, p, prefixed(0, 3), cs); got != want {
				t.Fatalf("went to %s, want %s (fast %s, slow %s, idle %s)", got, want, fast, slow, idle)
			}
		})
	}
}

// contextAgents returns a 100k-token context (6,400 blocks) and agent a's turn-th
// request on it: the context, then the agent's own 8 blocks per turn so far.
func contextAgents() (context []uint32, agent func(a, turn int) []uint32) {
	context = plTokens(1_000_000, 6400*16)
	return context, func(a, turn int) []uint32 {
		return append(append([]uint32(nil), context...), plTokens(500_000_000+1_000_000*a, (turn+1)*8*16)...)
	}
}

// agentsOnHolder routes agent 0's first turn, then agent 1's first and agent 0's
// second, which must follow it to the context's endpoint; the index shows that endpoint
// holding each. It returns the endpoint.
func agentsOnHolder(t *testing.T, p *placement.Policy, ix *testindex.Index, cs []scoring.Endpoint, agent func(a, turn int) []uint32) string {
	t.Helper()
	holder := place(t, p, agent(0, 0), cs)
	ix.Hold(holder, plKeysOf(agent(0, 0)))
	for _, toks := range [][]uint32{agent(1, 0), agent(0, 1)} {
		if got := place(t, p, toks, cs); got != holder {
			t.Fatalf("a turn on the context went to %s, the context is on %s", got, holder)
		}
		ix.Hold(holder, plKeysOf(toks))
	}
	return holder
}

// TestPlacementCountsAContextOnceAcrossAgents: agents on one 100k-token context (6,400
// blocks, longer than the keys a prefix keeps densely) on endpoints of 7,000 blocks.
// With one agent's turn in flight on the holder, a new agent's first turn still has KV
// room there: the context is counted once (the turn's conversation activates its
// parent), at its whole size. Counted per conversation, or learned as its first 4,096
// blocks, it looked twice its size and the new agent recomputed it on the other
// endpoint.
func TestPlacementCountsAContextOnceAcrossAgents(t *testing.T) {
	ix := testindex.New()
	p := newPlacement(t, placement.DefaultConfig(), ix)
	cs := fleet(2, []int{7000, 7000})
	_, agent := contextAgents()
	holder := agentsOnHolder(t, p, ix, cs, agent)
	routeOn(t, p, cs, agent(0, 2), holder, true) // agent 0's third turn, decoding
	setInFlight(cs, holder, 1)
	if got := place(t, p, agent(2, 0), cs); got != holder {
		t.Errorf("a new agent went to %s, its context is on %s with room for it", got, holder)
	}
}

// TestPlacementWaitsForItsLongPrefixInPrefill: a second agent on a 32k-token context
// whose first request is still in prefill on the holder (the index shows half of it)
// waits there for that prefill and hits it: a copy elsewhere would redo the whole
// context in about the same time. Without long_contexts the holder's backlog counts as
// one the move skips, and the request recomputes the context on the idle endpoint.
func TestPlacementWaitsForItsLongPrefixInPrefill(t *testing.T) {
	for _, long := range []bool{true, false} {
		t.Run(fmt.Sprint("long_contexts=", long), func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.LongContexts = long
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(2, []int{20000, 20000})
			context := plTokens(1_000_000, 2048*16)
			agent := func(a int) []uint32 {
				return append(append([]uint32(nil), context...), plTokens(500_000_000+1_000_000*a, 8*16)...)
			}
			first := plRequest(agent(0))
			d, err := p.Pick(first, cs)
			if err != nil {
				t.Fatal(err)
			}
			holder := d.Endpoint
			p.Routed(first, holder)
			ix.Hold(holder, plKeysOf(context[:1024*16]))
			setInFlight(cs, holder, 1)
			if got := place(t, p, agent(1), cs); (got == holder) != long {
				t.Errorf("second agent went to %s (holder %s), want holder %v", got, holder, long)
			}
		})
	}
}

// TestPlacementHomesALongPrefixWhereItPrefillsSoonest: a new prefix whose first prompt
// is a long prefill (16k tokens) is homed on the endpoint measured faster beyond noise,
// though the partition (fewest home blocks per capacity) would take the slower one.
func TestPlacementHomesALongPrefixWhereItPrefillsSoonest(t *testing.T) {
	for _, long := range []bool{true, false} {
		t.Run(fmt.Sprint("long_contexts=", long), func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.LongContexts = long
			clock := time.Unix(100, 0)
			p := clockedPolicy(t, cfg, testindex.New(), &clock)
			// The slow endpoint has four times the KV capacity: the partition, by
			// home blocks per block of capacity, prefers it.
			cs := fleet(2, []int{10000, 40000})
			fast, slow := cs[0].Address, cs[1].Address
			// Decode measured at 1 s on the fast endpoint and 1.5 s on the slow one
			// (not twice as slow: the divert rules leave the request alone).
			for k, m := range []struct {
				addr string
				ms   time.Duration
			}{{fast, 1000}, {slow, 1500}} {
				req := plRequest(prefixed(k, 0))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, m.addr)
				p.FirstToken(req.ID)
				clock = clock.Add(m.ms * time.Millisecond)
				p.Finished(req.ID)
			}
			want := slow
			if long {
				want = fast
			}
			if got := place(t, p, plTokens(700_000_000, 1000*16), cs); got != want {
				t.Errorf("long new prefix homed on %s, want %s (fast %s)", got, want, fast)
			}
		})
	}
}

// TestPlacementColdBurstHomesBesidePrefills: a fleet starting (no decode time measured)
// takes a burst of new prefixes at once. Each first request is a miss computed now, of
// more than one engine step (the reference's 2,371 tokens: no divert moves it beside a
// prefill), so it is homed, by the partition's share, among the endpoints with no
// prefill in progress while there are any: the two endpoints of 4x the KV capacity
// would otherwise take four homes and four simultaneous prefills while small endpoints
// idle. Once every endpoint is prefilling, the share alone decides again.
func TestPlacementColdBurstHomesBesidePrefills(t *testing.T) {
	p := newPlacement(t, placement.DefaultConfig(), testindex.New())
	cs := fleet(6, []int{4000, 4000, 1000, 1000, 1000, 1000})
	prompt := func(k int) []uint32 { return plTokens(1_000_000*(k+1), 148*16) }
	homes := map[string]int{}
	for k := range cs {
		req := plRequest(prompt(k))
		d, err := p.Pick(req, cs)
		if err != nil {
			t.Fatal(err)
		}
		p.Routed(req, d.Endpoint) // in prefill: no first token yet
		homes[d.Endpoint]++
		for i := range cs {
			if cs[i].Address == d.Endpoint {
				cs[i].InFlight++
			}
		}
	}
	for _, c := range cs {
		if homes[c.Address] != 1 {
			t.Fatalf("homes of the burst per endpoint = %v, want one on each", homes)
		}
	}
	d, err := p.Pick(plRequest(prompt(len(cs))), cs)
	if err != nil {
		t.Fatal(err)
	}
	if d.Endpoint != cs[0].Address && d.Endpoint != cs[1].Address {
		t.Fatalf("with every endpoint prefilling, the next home went to %s, want a large endpoint", d.Endpoint)
	}
}

// timedAt is an endpoint and how long a request took there.
type timedAt struct {
	addr string
	d    time.Duration
}

// measurePrefill routes one 16,000-token miss to each endpoint in turn, its first token
// at.d after its routing, so that p has measured each endpoint's prefill speed for
// prompts of that size.
func measurePrefill(t *testing.T, p *placement.Policy, cs []scoring.Endpoint, clock *time.Time, at ...timedAt) {
	t.Helper()
	for k, m := range at {
		req := plRequest(plTokens(900_000_000+10_000_000*k, 1000*16))
		if _, err := p.Pick(req, cs); err != nil {
			t.Fatal(err)
		}
		p.Routed(req, m.addr)
		*clock = clock.Add(m.d)
		p.FirstToken(req.ID)
		p.Finished(req.ID)
	}
}

// chatTurns is a 64-block system prompt and, for conversation c, its first turn (the
// system prompt and 8 blocks of its own) and its second (the first and 8 more blocks).
func chatTurns() (system []uint32, turn1, turn2 func(c int) []uint32) {
	turn1 = func(c int) []uint32 { return chatTurn(c, 1) }
	turn2 = func(c int) []uint32 { return chatTurn(c, 2) }
	return chatTurn(0, 0), turn1, turn2
}

// chatTurn is conversation c's k-th turn: the 64-block system prompt and k messages of
// 8 blocks each, every turn extending the one before.
func chatTurn(c, k int) []uint32 {
	out := plTokens(1_000_000, 64*16)
	for j := range k {
		out = append(out, plTokens(500_000_000+200_000_000*j+10_000*c, 8*16)...)
	}
	return out
}

// wantTurnsOnHistory places conversation c's turn (turn(c)) for each endpoint c, which
// holds its history, and wants it there.
func wantTurnsOnHistory(t *testing.T, p *placement.Policy, cs []scoring.Endpoint, turn func(c int) []uint32) {
	t.Helper()
	for c := range cs {
		if got := place(t, p, turn(c), cs); got != cs[c].Address {
			t.Errorf("conversation %d's turn went to %s, its history is on %s", c, got, cs[c].Address)
		}
	}
}

// measureDecode routes one 8-block request to each endpoint in turn, its first token at
// once and its end at.d later, so that p has measured each endpoint's decode time.
func measureDecode(t *testing.T, p *placement.Policy, cs []scoring.Endpoint, clock *time.Time, at ...timedAt) {
	t.Helper()
	for k, m := range at {
		req := plRequest(plTokens(900_000_000+10_000_000*k, 8*16))
		if _, err := p.Pick(req, cs); err != nil {
			t.Fatal(err)
		}
		p.Routed(req, m.addr)
		p.FirstToken(req.ID)
		*clock = clock.Add(m.d)
		p.Finished(req.ID)
	}
}

// TestPlacementHeldHitLeavesForASoonerMiss: a hit held behind a 15,000-token miss in
// prefill at its holder goes, as a miss of its own, to an endpoint with no prefill
// where its whole prompt (600 blocks) takes less time, at the measured prefill speeds,
// than the miss's prefill left plus its own tail at the holder; it stays held when the
// miss is nearly done, or when the other endpoint is measured slower (speeds uneven).
func TestPlacementHeldHitLeavesForASoonerMiss(t *testing.T) {
	for _, tc := range []struct {
		name      string
		otherTTFT time.Duration // a 16,000-token prompt's time to first token on the other endpoint
		since     time.Duration // from the miss's routing to the hit's arrival
		leaves    bool
	}{
		{"even speeds, the miss just started: leaves", time.Second, 10 * time.Millisecond, true},
		{"even speeds, the miss nearly done: held", time.Second, 700 * time.Millisecond, false},
		{"the other endpoint measured slower: held", 2 * time.Second, 10 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p, cs, hit, holder, other := prefillHolder(t, &clock, 100_000, tc.otherTTFT)
			miss := plRequest(plTokens(300_000_000, 15_000))
			if _, err := p.Pick(miss, cs); err != nil {
				t.Fatal(err)
			}
			p.Routed(miss, holder) // in prefill: no first token yet
			setInFlight(cs, holder, 1)
			clock = clock.Add(tc.since)
			d, err := p.Pick(plRequest(hit), cs)
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Endpoint == other && d.Hold == 0; got != tc.leaves {
				t.Fatalf("decision %+v (holder %s, other %s), want to leave for the other: %v", d, holder, other, tc.leaves)
			}
			if !tc.leaves && (d.Endpoint != holder || d.Hold == 0) {
				t.Fatalf("decision %+v, want held at the holder %s", d, holder)
			}
		})
	}
}

// TestPlacementNewHomeLeavesAHitsPrefill: while speeds are even, a new prefix's first
// request (a 148-block miss: two engine steps) whose home, by the partition, has a
// prefill in progress goes to an idle endpoint with no prefill where it takes less time
// at the measured prefill speed, though that prefill is a hit's short tail (under
// HoldPrefillTokens, no miss): its tokens would fill the miss's steps and push its
// first token back (8 servers, N = 24, C = 8: clients finishing together send their
// requests at once). It stays on its home when the tail was routed long enough ago to
// be done, when the home prefills nothing, when speeds are uneven, or while an
// endpoint's speed is not measured (the reference's fleet, 0.7 and full speed, looks
// even until its slow endpoints are measured).
func TestPlacementNewHomeLeavesAHitsPrefill(t *testing.T) {
	for _, tc := range []struct {
		name        string
		hit         bool          // a hit's tail is routed to the home first
		since       time.Duration // from the hit's routing to the new prefix's request
		otherDecode time.Duration // the idle endpoint's measured decode time (the home's: 1 s; 0: not measured)
		leaves      bool
	}{
		{"a hit's tail just routed: leaves", true, 0, time.Second, true},
		{"the tail routed long ago: home", true, 500 * time.Millisecond, time.Second, false},
		{"no prefill at the home: home", false, 0, time.Second, false},
		{"speeds uneven: home", true, 0, 2 * time.Second, false},
		{"the idle endpoint's speed not measured yet: home", true, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			ix := testindex.New()
			p := clockedPolicy(t, placement.DefaultConfig(), ix, &clock)
			// The first endpoint has ten times the KV capacity: the partition homes
			// new prefixes there.
			cs := fleet(2, []int{10_000, 1000})
			home, other := cs[0].Address, cs[1].Address
			decodes := []timedAt{{home, time.Second}}
			if tc.otherDecode > 0 {
				decodes = append(decodes, timedAt{other, tc.otherDecode})
			}
			measureDecode(t, p, cs, &clock, decodes...)
			// Each endpoint's prefill speed for prompts of two steps: 100 ms each.
			for k, addr := range []string{home, other} {
				req := plRequest(plTokens(800_000_000+10_000_000*k, 148*16))
				if _, err := p.Pick(req, cs); err != nil {
					t.Fatal(err)
				}
				p.Routed(req, addr)
				clock = clock.Add(100 * time.Millisecond)
				p.FirstToken(req.ID)
				p.Finished(req.ID)
			}
			if tc.hit {
				// A prefix held on the home, and a hit of it (8 blocks of its own)
				// routed there: in prefill, no first token yet.
				prefix := prefixed(0, 0)
				if got := place(t, p, prefix, cs); got != home {
					t.Fatalf("prefix 0 homed on %s, want %s", got, home)
				}
				ix.Hold(home, plKeysOf(prefix))
				req := plRequest(prefixed(0, 1))
				d, err := p.Pick(req, cs)
				if err != nil {
					t.Fatal(err)
				}
				if d.Endpoint != home {
					t.Fatalf("the hit went to %s, want its holder %s", d.Endpoint, home)
				}
				p.Routed(req, home)
				cs[0].InFlight = 1
			}
			clock = clock.Add(tc.since)
			d, err := p.Pick(plRequest(plTokens(700_000_000, 148*16)), cs)
			if err != nil {
				t.Fatal(err)
			}
			want := home
			if tc.leaves {
				want = other
			}
			if d.Endpoint != want || d.Hold != 0 {
				t.Fatalf("decision %+v, want %s (home %s)", d, want, home)
			}
		})
	}
}

// prefillHolder is the prefill-hold tests' fleet: a default policy on clock over two
// endpoints of capacity blocks each, a 600-block prefix placed on holder (the index
// shows it there), the holder's prefill time measured at 1 s and the other's at
// otherTTFT (measurePrefill). hit is the prefix and an 8-block tail.
func prefillHolder(t *testing.T, clock *time.Time, capacity int, otherTTFT time.Duration) (p *placement.Policy, cs []scoring.Endpoint, hit []uint32, holder, other string) {
	t.Helper()
	ix := testindex.New()
	p = clockedPolicy(t, placement.DefaultConfig(), ix, clock)
	cs = fleet(2, []int{capacity, capacity})
	prefix := plTokens(1_000_000, 600*16)
	hit = append(append([]uint32(nil), prefix...), plTokens(500_000_000, 8*16)...)
	holder = place(t, p, prefix, cs)
	other = cs[0].Address
	if other == holder {
		other = cs[1].Address
	}
	ix.Hold(holder, plKeysOf(prefix))
	measurePrefill(t, p, cs, clock, timedAt{holder, time.Second}, timedAt{other, otherTTFT})
	return p, cs, hit, holder, other
}

// heldPrefix is the copy_cost tests' fleet: a policy with cfg, its clock reading *clock,
// over one endpoint per decode time given plus the holder, each of 10,000 blocks (a
// 72-block prompt: Fill never binds); prefix 0 placed on holder, which holds 64 blocks
// of it; each endpoint's decode time measured with one unrelated request (the holder's
// 1 s, the others' decodes in fleet order); and the prefix's size learned (64 blocks).
// It returns the policy, the fleet, the holder and the other endpoints in fleet order.
func heldPrefix(t *testing.T, cfg placement.Config, clock *time.Time, decodes ...time.Duration) (*placement.Policy, []scoring.Endpoint, string, []string) {
	t.Helper()
	ix := testindex.New()
	p := clockedPolicy(t, cfg, ix, clock)
	blocks := make([]int, len(decodes)+1)
	for i := range blocks {
		blocks[i] = 10_000
	}
	cs := fleet(len(blocks), blocks)
	holder := place(t, p, prefixed(0, 0), cs)
	var others []string
	for _, c := range cs {
		if c.Address != holder {
			others = append(others, c.Address)
		}
	}
	ix.Hold(holder, plKeysOf(prefixed(0, 0))[:64])
	at := []timedAt{{holder, time.Second}}
	for k, d := range decodes {
		at = append(at, timedAt{others[k], d})
	}
	measureDecode(t, p, cs, clock, at...)
	place(t, p, prefixed(0, 1), cs)
	return p, cs, holder, others
}

// TestPlacementNoRoomPrefersTheShorterPrefill: with no KV room on any endpoint and room
// coming as soon at each (a decoding request past its measured decode time frees enough
// on both), the request goes where its prefill ends soonest, the prefill backlog ahead of
// it included: off its prefix's holder while a 15,000-token miss prefills there (its
// 9,728-token prompt recomputed elsewhere ends first), kept on the holder when nothing
// prefills there (its 128 uncached tokens end first).
func TestPlacementNoRoomPrefersTheShorterPrefill(t *testing.T) {
	for _, tc := range []struct {
		name       string
		missThere  bool // a 15,000-token miss in prefill on the holder
		wantHolder bool
	}{
		{"a long prefill at the holder: leaves", true, false},
		{"no prefill at the holder: stays", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p, cs, hit, holder, other := prefillHolder(t, &clock, 2000, time.Second)
			// Two 1,000-block requests decoding on the other endpoint, one on the holder:
			// each endpoint is full, and the first decode to end frees room for the hit.
			for k, addr := range []string{holder, other, other} {
				routeOn(t, p, cs, plTokens(100_000_000*(k+1), 1000*16), addr, true)
			}
			clock = clock.Add(10 * time.Second) // past every measured decode time
			miss := plRequest(plTokens(300_000_000, 15_000))
			if _, err := p.Pick(miss, cs); err != nil {
				t.Fatal(err)
			}
			p.Routed(miss, holder)
			if !tc.missThere {
				p.FirstToken(miss.ID) // decoding: nothing in prefill at the holder
			}
			wantHolderPick(t, p, cs, hit, holder, tc.wantHolder)
		})
	}
}

// TestPlacementNoRoomAtTheHolderWeighsTheRecompute: a hit whose holder has no KV room
// for it while another endpoint has room waits at the holder when its first token comes
// sooner there (room freed as a decode past its measured time ends, then its 128
// uncached tokens) than at the other endpoint (its whole 9,728-token prompt at the
// measured prefill speed, about 0.6 s), and leaves when the holder's decode has most of
// its measured 10 s to run.
func TestPlacementNoRoomAtTheHolderWeighsTheRecompute(t *testing.T) {
	for _, tc := range []struct {
		name       string
		since      time.Duration // from the holder's decode's first token to the hit
		wantHolder bool
	}{
		{"room soon at the holder: waits there", 20 * time.Second, true},
		{"room late at the holder: leaves", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p, cs, hit, holder, other := prefillHolder(t, &clock, 1500, time.Second)
			measureDecode(t, p, cs, &clock, timedAt{holder, 10 * time.Second}, timedAt{other, 10 * time.Second})
			// A 1,000-block request decoding on the holder fills it beside the prefix.
			routeOn(t, p, cs, plTokens(100_000_000, 1000*16), holder, true)
			clock = clock.Add(tc.since)
			wantHolderPick(t, p, cs, hit, holder, tc.wantHolder)
		})
	}
}

// TestPlacementOutputBlocksFromMeasuredOutput: a request's output blocks are derived from
// the engines' measured mean output per finished request (vllm:request_generation_tokens),
// at most its max_tokens, or its max_tokens alone while nothing is measured; half of them
// count in the footprint (allocated as it decodes), from the request's first token. On
// 120-block endpoints, a holder decoding one request of the 72-block prompt's prefix has
// room for a second only when each holds at most 20 output blocks: 1,000-token outputs
// (32 held) send it to the idle endpoint, where the fixed output_blocks override keeps it
// at the holder, as does the first request still in prefill; 500-token outputs (16 held,
// 32 counted whole) keep it there.
func TestPlacementOutputBlocksFromMeasuredOutput(t *testing.T) {
	for _, tc := range []struct {
		name       string
		override   int     // output_blocks; 0 derives
		mean       float64 // measured output tokens per finished request; 0: none finished
		maxTokens  int
		wantHolder bool
	}{
		{"measured long outputs leave no room at the holder", 0, 1000, 0, false},
		{"measured short outputs fit", 0, 50, 0, true},
		{"half of 500-token outputs fit", 0, 500, 0, true},
		{"max_tokens bounds the measured mean", 0, 1000, 100, true},
		{"nothing measured: max_tokens", 0, 0, 1000, false},
		{"nothing measured and no max_tokens", 0, 0, 0, true},
		{"output_blocks overrides the measurement", 4, 1000, 0, true},
		{"a request in prefill holds no output", 0, 1000, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.OutputBlocks = tc.override
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(2, []int{120, 120})
			holder := place(t, p, prefixed(0, 0), cs)
			ix.Hold(holder, plKeysOf(prefixed(0, 0))[:64]) // the holder computed the prefix
			if tc.mean > 0 {
				for i := range cs {
					cs[i].Metrics.FinishedRequests, cs[i].Metrics.OutputTokens = 10, 10*tc.mean
				}
			}
			send := func(tail int) *scoring.Request {
				req := plRequest(prefixed(0, tail))
				req.MaxTokens = tc.maxTokens
				return req
			}
			first := send(1)
			if _, err := p.Pick(first, cs); err != nil {
				t.Fatal(err)
			}
			p.Routed(first, holder)
			if !strings.HasSuffix(tc.name, "in prefill holds no output") {
				p.FirstToken(first.ID)
			}
			d, err := p.Pick(send(2), cs)
			if err != nil {
				t.Fatal(err)
			}
			if (d.Endpoint == holder) != tc.wantHolder {
				t.Fatalf("went to %s (holder %s), want holder %v", d.Endpoint, holder, tc.wantHolder)
			}
		})
	}
}

// TestPlacementSpillsWhenTheMissEndsBeforeTheWait: a hit whose holder runs SpillLoad
// requests spills to the idle endpoint, though recomputing its 9,728-token prompt there
// adds more than one engine step of prefill, when that prefill (about 0.6 s at the
// measured 16,000 tokens a second) ends before the holder's wait exceeds the idle
// endpoint's (the requests there, plus this one, times the measured decode time: 11 s
// against 1 s); it queues at the holder when decodes are measured short (0.55 s against
// 0.05 s).
func TestPlacementSpillsWhenTheMissEndsBeforeTheWait(t *testing.T) {
	for _, tc := range []struct {
		name       string
		decode     time.Duration // measured at each endpoint
		wantHolder bool
	}{
		{"long decodes: the miss ends first", time.Second, false},
		{"short decodes: queues at the holder", 50 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			p, cs, hit, holder, other := prefillHolder(t, &clock, 10_000, time.Second)
			measureDecode(t, p, cs, &clock, timedAt{holder, tc.decode}, timedAt{other, tc.decode})
			setInFlight(cs, holder, placement.DefaultConfig().SpillLoad)
			wantHolderPick(t, p, cs, hit, holder, tc.wantHolder)
		})
	}
}
