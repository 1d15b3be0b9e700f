package scoring_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/scoring"
)

// TestExplainMatchesPick drives a kv policy (one endpoint with unhealthy events, so both
// the index and the prediction are exercised) and an approximate one through a sequence
// of requests; before every Pick, Explain must report the same costs and the same winner
// and decision kind (when the winner is unique; the sequence has hits, load picks and
// untokenized requests), and calling it must not change what Pick then does.
func TestExplainMatchesPick(t *testing.T) {
	ix := testindex.New()
	shared := kvTokens(1000, 160)
	ix.Hold("a", kvKeysOf(shared))
	kv, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, kvFakeHealth{down: map[string]bool{"c": true}}, rand.NewPCG(1, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	approx, err := scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(1, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    kvPolicy
	}{{"kv", kv}, {"approximate", approx}} {
		t.Run(tc.name, func(t *testing.T) {
			var got map[string]float64 // Pick's costs, seen through the test hook
			scoring.SetCostHook(tc.p, func(cands []scoring.Endpoint, costs []float64) {
				got = map[string]float64{}
				for i, c := range cands {
					got[c.Address] = costs[i]
				}
			})
			eps := kvCands("a", "b", "c")
			kinds := map[string]int{}
			defer func() {
				for _, k := range []string{scoring.KindHit, scoring.KindLoad, scoring.KindUntokenized} {
					if kinds[k] == 0 {
						t.Errorf("no request explained as %q: %v", k, kinds)
					}
				}
			}()
			for i := range 12 {
				toks := append(append([]uint32{}, shared[:16*(1+i%5)]...), kvTokens(5000+100*i, 40)...)
				if i%4 == 3 {
					toks = nil // untokenized: scored by load
				}
				req := kvReq(toks)
				ex, err := tc.p.Explain(req, eps)
				if err != nil {
					t.Fatal(err)
				}
				again, _ := tc.p.Explain(req, eps)
				d, err := tc.p.Pick(req, eps)
				if err != nil {
					t.Fatal(err)
				}
				for j, c := range ex.Candidates {
					if c.Cost != again.Candidates[j].Cost {
						t.Fatalf("request %d: Explain changed state: %v then %v", i, c.Cost, again.Candidates[j].Cost)
					}
					if want := got[c.Address]; c.Cost != want {
						t.Errorf("request %d, %s: Explain cost %v, Pick cost %v (%+v)", i, c.Address, c.Cost, want, c)
					}
				}
				if ex.Ties == 1 && ex.Pick != d.Endpoint {
					t.Errorf("request %d: Explain picks %s, Pick %s", i, ex.Pick, d.Endpoint)
				}
				if ex.Ties == 1 && ex.Kind != d.Kind {
					t.Errorf("request %d: Explain's kind %q, Pick's %q", i, ex.Kind, d.Kind)
				}
				kinds[ex.Kind]++
				if ex.Tokenized != (toks != nil) {
					t.Errorf("request %d: Tokenized = %v", i, ex.Tokenized)
				}
				if i%3 != 2 { // let some requests finish, keep others in flight
					tc.p.Routed(req, d.Endpoint)
					if i%2 == 0 {
						tc.p.FirstToken(req.ID)
					}
				}
			}
		})
	}
}

func TestRoundRobinPeek(t *testing.T) {
	p := scoring.NewRoundRobin()
	eps := kvCands("a", "b", "c")
	for i := range 5 {
		peek := p.Peek(eps)
		if again := p.Peek(eps); again != peek {
			t.Fatalf("Peek advanced the turn: %s then %s", peek, again)
		}
		d, _ := p.Pick(nil, eps)
		if d.Endpoint != peek {
			t.Errorf("turn %d: Peek %s, Pick %s", i, peek, d.Endpoint)
		}
	}
	if p.Peek(nil) != "" {
		t.Error("Peek with no candidates is not empty")
	}
}
