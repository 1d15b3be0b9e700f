package placement_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/placement"
)

// TestPlacementDecisionNamesItsKind: each decision's Kind is the kind it counts in
// kvrouter_scoring_placement_decisions_total: a new prefix's request says home, a
// request of a prefix an endpoint holds (this router's placement or the index's) says
// holder, one without tokens says untokenized.
func TestPlacementDecisionNamesItsKind(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ix := testindex.New()
	p, err := placement.New(placement.DefaultConfig(), ix, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	cs := fleet(4, nil)
	// Another router replica placed prefix 1 on the third endpoint: the index says so.
	ix.Hold(cs[2].Address, plKeysOf(prefixed(1, 99))[:64])
	for _, step := range []struct {
		name string
		toks []uint32
		want string
	}{
		{"new prefix", prefixed(0, 0), "home"},
		{"its repeat", prefixed(0, 1), "holder"},
		{"a prefix the index holds", prefixed(1, 0), "holder"},
		{"another new prefix", prefixed(2, 0), "home"},
		{"no tokens", nil, "untokenized"},
	} {
		before := decisionCount(t, reg, step.want)
		req := plRequest(step.toks)
		d, err := p.Pick(req, cs)
		if err != nil {
			t.Fatal(err)
		}
		p.Routed(req, d.Endpoint)
		p.Finished(req.ID)
		if d.Kind != step.want {
			t.Errorf("%s: Kind %q, want %q", step.name, d.Kind, step.want)
		}
		if got := decisionCount(t, reg, step.want) - before; got != 1 {
			t.Errorf("%s: counted %v decisions of kind %q, want 1", step.name, got, step.want)
		}
	}
}
