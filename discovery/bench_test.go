package discovery_test

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/kvrouter/kvrouter/discovery"
)

// BenchmarkApply1000 measures one informer event's work on a 1,000-pod fleet with
// nothing changed: the reconciler recomputes every endpoint and compares.
func BenchmarkApply1000(b *testing.B) {
	f, err := newFleetB()
	if err != nil {
		b.Fatal(err)
	}
	r := discovery.NewReconciler("bench", f, targetCfg(), discovery.DefaultKVEventsConfig(), discovery.ReconcilerOptions{})
	targets := make([]discovery.Target, 1000)
	for i := range targets {
		targets[i] = discovery.Target{ID: "ns/p" + strconv.Itoa(i), IP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}),
			Port: 8000, Ready: true, Rank: -1}
	}
	r.Apply(targets)
	b.ReportAllocs()
	for b.Loop() {
		r.Apply(targets)
	}
}
