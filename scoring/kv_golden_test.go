package scoring_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/scoring"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden")

// TestKVPicksGolden drives the kv and approximate policies through a seeded workload
// (shared prefixes in flight on several endpoints at once, two block sizes, an endpoint
// whose events are down, requests finishing out of order, some never routed) and
// compares every decision, endpoint and fallbacks, with testdata/kv_picks.golden,
// recorded before the policies' internals were reworked for speed: a refactor must not
// change a single pick. Rewrite with -update only for an intended change of behaviour.
func TestKVPicksGolden(t *testing.T) {
	var out strings.Builder
	for _, name := range []string{"kv", "approximate"} {
		rng := rand.New(rand.NewPCG(7, 8))
		ix := testindex.New()
		var p kvPolicy
		var err error
		if name == "kv" {
			p, err = scoring.NewKV(scoring.DefaultKVConfig(), ix, kvFakeHealth{down: map[string]bool{"e3": true}}, rand.NewPCG(1, 2), nil)
		} else {
			p, err = scoring.NewApproximate(scoring.DefaultKVConfig(), rand.NewPCG(1, 2), nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		cands := kvCands("e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7")
		for i := range cands {
			cands[i].Metrics = scoring.Metrics{Valid: true, BlockSize: 16, NumGPUBlocks: 400}
		}
		cands[5].Metrics.BlockSize = 32
		prefixes := make([][]uint32, 5)
		for i := range prefixes {
			prefixes[i] = kvTokens(10000*(i+1), 16*(3+4*i))
		}
		var inflight []*scoring.Request
		fmt.Fprintf(&out, "policy %s\n", name)
		for i := range 400 {
			toks := append(append([]uint32{}, prefixes[rng.IntN(len(prefixes))]...), kvTokens(1_000_000+100*i, rng.IntN(80))...)
			req := kvReq(toks)
			if i%29 == 0 {
				req.TokenIDs = nil
			}
			d, err := p.Pick(req, cands)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&out, "%d %s %v\n", i, d.Endpoint, d.Fallbacks)
			switch {
			case i%11 == 0: // never routed
				p.Finished(req.ID)
				continue
			case i%7 == 0: // routed elsewhere than picked
				d.Endpoint = cands[rng.IntN(len(cands))].Address
			}
			p.Routed(req, d.Endpoint)
			if rng.IntN(3) > 0 {
				p.FirstToken(req.ID)
			}
			if req.TokenIDs != nil && name == "kv" && rng.IntN(4) == 0 {
				ix.Hold(d.Endpoint, kvKeysOf(req.TokenIDs)) // events report what it cached
			}
			inflight = append(inflight, req)
			for len(inflight) > 0 && rng.IntN(3) == 0 { // finish any one, in random order
				j := rng.IntN(len(inflight))
				p.Finished(inflight[j].ID)
				inflight = append(inflight[:j], inflight[j+1:]...)
			}
		}
	}
	const golden = "testdata/kv_picks.golden"
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("line %d: got %q, want %q", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("got %d lines, want %d", len(gl), len(wl))
	}
}
