package placement_test

import (
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/scoring"
)

// TestPlacementCopyPastEvenShareMustPay: in a fleet of at least two endpoints per placed
// prefix, a busy holder's shared prefix already on its even share of the endpoints (its
// share of the requests routed since it was first seen, times the endpoints) takes a
// further copy only when the copy is worth its miss: the share of the requests in flight
// at one moment (copy_cost's allowance) no longer makes it. Below its even share, or with
// more placed prefixes than half the endpoints, the allowance still copies.
func TestPlacementCopyPastEvenShareMustPay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		others int // prefixes other than A and B placed (each on its own home)
		bPicks int // requests of B routed (A's are 5, the last included)
		copies bool
	}{
		{"on its even share (5 of 9 requests, 2 of 4 endpoints): the hit", 0, 4, false},
		{"under its even share (5 of 6 requests: 3 endpoints): a copy", 0, 1, true},
		{"three placed prefixes on four endpoints: a copy", 1, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := placement.DefaultConfig()
			cfg.Saturated = 10
			cfg.HoldMax = 0
			ix := testindex.New()
			p := newPlacement(t, cfg, ix)
			cs := fleet(4, []int{10_000, 10_000, 10_000, 10_000})
			a := place(t, p, prefixed(0, 0), cs)
			ix.Hold(a, plKeysOf(prefixed(0, 0))[:64])
			b := place(t, p, prefixed(1, 0), cs)
			ix.Hold(b, plKeysOf(prefixed(1, 0))[:64])
			for k := range tc.others {
				o := place(t, p, prefixed(2+k, 0), cs)
				ix.Hold(o, plKeysOf(prefixed(2+k, 0))[:64])
			}
			for k := 1; k < tc.bPicks; k++ {
				place(t, p, prefixed(1, k), cs)
			}
			// A's second site: a copy made while its holder runs one of its requests.
			routeOn(t, p, cs, prefixed(0, 1), a, true)
			busy(cs, a)
			second := place(t, p, prefixed(0, 2), cs)
			if second == a {
				t.Fatalf("A's second request went to its busy holder %s, want a copy", a)
			}
			ix.Hold(second, plKeysOf(prefixed(0, 0))[:64])
			// Both holders run one of A's requests; a third arrives.
			routeOn(t, p, cs, prefixed(0, 3), second, true)
			busy(cs, a, second)
			got := place(t, p, prefixed(0, 4), cs)
			if copied := got != a && got != second; copied != tc.copies {
				t.Fatalf("went to %s (holders %s, %s), want a copy: %v", got, a, second, tc.copies)
			}
		})
	}
}

// busy sets each of addrs' in-flight requests to one.
func busy(cs []scoring.Endpoint, addrs ...string) {
	for i := range cs {
		if slices.Contains(addrs, cs[i].Address) {
			cs[i].InFlight = 1
		}
	}
}
