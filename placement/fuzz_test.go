package placement_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/scoring"
)

// FuzzPlacementNeverFails drives the policy through random sequences of picks, routes
// (to the pick or elsewhere), first tokens, finishes, moves, departures (Forget), index
// changes, merged peer placements and metric changes, with and without router replicas,
// over one to four endpoints whose metrics may be missing or report no capacity, with
// short, branched and long (past longMiss's threshold) prompts. Whatever happens, Pick
// must return one of its candidates, and its fallbacks must be candidates too: a request
// never fails because of scoring.
func FuzzPlacementNeverFails(f *testing.F) {
	for _, seed := range [][]byte{
		{},
		{0, 0, 0},
		{1, 3, 0, 2, 5, 0, 1, 3, 0, 2, 9, 1, 1, 0, 1, 0, 0, 3, 5},
		{3, 4, 0, 2, 7, 0, 1, 7, 0, 5, 40, 1, 0, 0, 2, 15, 0, 8, 3, 0, 1, 0},
		{2, 1, 0, 34, 15, 0, 35, 15, 0, 34, 15, 4, 1, 0, 37, 15, 2, 0, 0, 2, 15},
		{4, 2, 6, 1, 2, 0, 2, 15, 0, 2, 15, 7, 0, 0, 2, 15, 8, 1, 0, 0, 2, 15, 3, 0, 2},
		{0, 0, 2, 1, 0, 1, 2, 1, 8, 0, 0, 2, 1, 0, 2, 1, 4, 0, 0, 2, 1},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		clock := time.Unix(1000, 0)
		ix := testindex.New()
		p := clockedPolicy(t, placement.DefaultConfig(), ix, &clock)
		if r := next(); r%4 > 0 {
			// With router replicas: this one's rank among r%4+1.
			p.SetPeers(&fakePeers{rank: next() % (r%4 + 1), replicas: r%4 + 1,
				load: map[string]placement.Load{}, active: map[string]uint64{}})
		}
		cs := fleet(4, []int{4000, 2500, 1500, 3000})
		type inflight struct {
			req *scoring.Request
			ep  string
		}
		var live []inflight
		prompt := func(b int) []uint32 {
			// A system prompt (one of two), a conversation (one of four), and a length:
			// 8 blocks, 130 (past one step), 1,100 (a long miss).
			system := plTokens(1_000_000*(b%2+1), 64*16)
			n := []int{8, 130, 1100, 0}[(b/2)%4]
			conv := plTokens(500_000_000+1_000_000*((b/8)%4), n*16)
			return append(append([]uint32(nil), system...), conv...)
		}
		for steps := 0; len(data) > 0 && steps < 200; steps++ {
			switch op := next() % 9; op {
			case 0: // pick and route
				mask, b, to := next()%15+1, next(), next()
				var cands []scoring.Endpoint
				for i := range cs {
					if mask&(1<<i) != 0 {
						cands = append(cands, cs[i])
					}
				}
				req := plRequest(prompt(b))
				d, err := p.Pick(req, cands)
				if err != nil {
					t.Fatalf("Pick: %v", err)
				}
				if !slices.ContainsFunc(cands, func(c scoring.Endpoint) bool { return c.Address == d.Endpoint }) {
					t.Fatalf("Pick chose %q, not a candidate", d.Endpoint)
				}
				for _, fb := range d.Fallbacks {
					if !slices.ContainsFunc(cands, func(c scoring.Endpoint) bool { return c.Address == fb }) {
						t.Fatalf("fallback %q is not a candidate", fb)
					}
				}
				ep := d.Endpoint
				if to%3 == 0 { // the proxy served it elsewhere (a fallback)
					ep = cands[to%len(cands)].Address
				}
				if d.Hold > 0 && to%2 == 0 {
					continue // held and then dropped: never routed
				}
				p.Routed(req, ep)
				live = append(live, inflight{req, ep})
			case 1, 2, 3: // first token, finish or move of an in-flight request
				if len(live) == 0 {
					continue
				}
				k := next() % len(live)
				switch op {
				case 1:
					p.FirstToken(live[k].req.ID)
				case 2:
					p.Finished(live[k].req.ID)
					live = slices.Delete(live, k, k+1)
				case 3:
					live[k].ep = cs[next()%len(cs)].Address
					p.Moved(live[k].req.ID, live[k].ep)
				}
			case 4: // an endpoint leaves (and may come back)
				p.Forget(cs[next()%len(cs)].Address)
			case 5:
				clock = clock.Add(time.Duration(next()+1) * 10 * time.Millisecond)
			case 6: // the index shows a prompt's blocks on an endpoint
				b, i := next(), next()
				ix.Hold(cs[i%len(cs)].Address, plKeysOf(prompt(b)))
			case 7: // a peer's decisions: this router's placements, moved one endpoint on
				ps := p.Placements(nil, true)
				shift := next()%3 + 1
				for j := range ps {
					for s := range ps[j].Sites {
						k := slices.IndexFunc(cs, func(c scoring.Endpoint) bool { return c.Address == ps[j].Sites[s].Endpoint })
						ps[j].Sites[s].Endpoint = cs[(max(k, 0)+shift)%len(cs)].Address
					}
					ps[j].Decided = clock.Add(time.Millisecond)
				}
				p.MergePlacements(ps, next()%2 == 0, time.Duration(next())*time.Millisecond)
			case 8: // an endpoint's metrics: missing, no capacity, busy or idle
				i, m := next()%len(cs), next()
				c := &cs[i].Metrics
				switch m % 4 {
				case 0:
					c.Valid = !c.Valid
				case 1:
					c.NumGPUBlocks = []int{0, 1, 200, 4000}[(m/4)%4]
				case 2:
					c.Running, c.Waiting = (m/4)%8, (m/32)%4
				case 3:
					c.KVCacheUsage = float64(m%101) / 100
				}
			}
		}
		for _, l := range live {
			p.Finished(l.req.ID)
		}
	})
}

// TestPlacementNewRulesEdgeCases: the replica and long-context rules with one
// candidate, with nothing measured, and with the chosen endpoint gone between picks:
// every pick is a candidate.
func TestPlacementNewRulesEdgeCases(t *testing.T) {
	long := func(d int) []uint32 {
		return append(plTokens(1_000_000, 64*16), plTokens(500_000_000+1_000_000*d, 1100*16)...)
	}
	for _, tc := range []struct {
		name  string
		peers *fakePeers
		n     int
		run   func(t *testing.T, p *placement.Policy, ix *testindex.Index, cs []scoring.Endpoint, clock *time.Time)
	}{
		{"one candidate, long misses, replicas", &fakePeers{rank: 1, replicas: 3}, 1,
			func(t *testing.T, p *placement.Policy, _ *testindex.Index, cs []scoring.Endpoint, clock *time.Time) {
				for d := range 4 {
					req := plRequest(long(d))
					dec, err := p.Pick(req, cs)
					if err != nil || dec.Endpoint != cs[0].Address {
						t.Fatalf("pick %d: %v, %v", d, dec.Endpoint, err)
					}
					p.Routed(req, dec.Endpoint)
					*clock = clock.Add(time.Second)
					p.FirstToken(req.ID)
					p.Finished(req.ID)
				}
			}},
		{"nothing measured, no metrics", &fakePeers{rank: 2, replicas: 4}, 3,
			func(t *testing.T, p *placement.Policy, _ *testindex.Index, cs []scoring.Endpoint, _ *time.Time) {
				for i := range cs {
					cs[i].Metrics = scoring.Metrics{}
				}
				for d := range 6 {
					place(t, p, long(d%2), cs)
					place(t, p, prefixed(d%3, d), cs)
				}
			}},
		{"the holder leaves between picks", &fakePeers{rank: 1, replicas: 2}, 3,
			func(t *testing.T, p *placement.Policy, ix *testindex.Index, cs []scoring.Endpoint, clock *time.Time) {
				first := plRequest(long(0))
				d, err := p.Pick(first, cs)
				if err != nil {
					t.Fatal(err)
				}
				p.Routed(first, d.Endpoint) // in prefill when its endpoint leaves
				ix.Hold(d.Endpoint, plKeysOf(long(0)))
				p.Forget(d.Endpoint)
				rest := slices.DeleteFunc(slices.Clone(cs), func(c scoring.Endpoint) bool { return c.Address == d.Endpoint })
				for k := range 4 {
					got := place(t, p, append(long(0), plTokens(700_000_000+k*10_000, 8*16)...), rest)
					if got == d.Endpoint {
						t.Fatalf("picked %s after it left", got)
					}
				}
				*clock = clock.Add(time.Second)
				p.FirstToken(first.ID)
				p.Moved(first.ID, rest[0].Address)
				p.Finished(first.ID)
				place(t, p, long(1), rest)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Unix(100, 0)
			ix := testindex.New()
			p := clockedPolicy(t, placement.DefaultConfig(), ix, &clock)
			tc.peers.load, tc.peers.active = map[string]placement.Load{}, map[string]uint64{}
			p.SetPeers(tc.peers)
			cs := fleet(tc.n, nil)
			for i := range cs {
				cs[i].Address = fmt.Sprintf("10.0.1.%d:8000", i+1)
			}
			tc.run(t, p, ix, cs, &clock)
		})
	}
}
