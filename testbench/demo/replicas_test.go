package demo

import (
	"strings"
	"testing"
)

const routerPage = `# HELP kvrouter_routing_decisions_total Requests routed.
kvrouter_routing_decisions_total{endpoint="a",policy="placement"} 3
kvrouter_routing_decisions_total{endpoint="b",policy="placement"} 4
kvrouter_peersync_messages_total{direction="sent"} 10
kvrouter_peersync_messages_total{direction="received"} 9
kvrouter_peersync_bytes_total{direction="received"} 1200
kvrouter_routing_holds_total 2
kvrouter_routing_hold_seconds_total 0.006
kvrouter_routing_decision_duration_seconds_bucket{le="0.001"} 5
kvrouter_routing_decision_duration_seconds_bucket{le="+Inf"} 7
kvrouter_routing_decision_duration_seconds_sum 0.014
kvrouter_routing_decision_duration_seconds_count 7
`

func TestSumFamilies(t *testing.T) {
	got := sumFamilies(routerPage, "kvrouter_routing_decisions_total", `kvrouter_peersync_messages_total{direction="sent"}`,
		`kvrouter_peersync_bytes_total{direction="sent"}`, holdsMetric, holdSecondsMetric)
	for k, want := range map[string]float64{"kvrouter_routing_decisions_total": 7, `kvrouter_peersync_messages_total{direction="sent"}`: 10,
		`kvrouter_peersync_bytes_total{direction="sent"}`: 0, holdsMetric: 2, holdSecondsMetric: 0.006} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v", k, got[k], want)
		}
	}
}

func TestDecisionHistogramDifferences(t *testing.T) {
	after, err := parseHistogram(strings.NewReader(routerPage), decisionMetric)
	if err != nil {
		t.Fatal(err)
	}
	before := &LagHistogram{Count: 2, SumSeconds: 0.004, Buckets: []LagBucket{{LE: 0.001, Count: 2}, {LE: after.Buckets[1].LE, Count: 2}}}
	d := subHistogram(after, before)
	if d.Count != 5 || d.Buckets[0].Count != 3 || d.Buckets[1].Count != 5 {
		t.Fatalf("after - before = %+v", d)
	}
	sum := addHistogram(d, nil, d)
	if sum.Count != 10 || sum.Buckets[0].Count != 6 || sum.MeanMs() != 2 {
		t.Fatalf("d + d = %+v (mean %v ms)", sum, sum.MeanMs())
	}
	if got := sum.QuantileBoundMs(0.5); got != 1 {
		t.Errorf("p50 bound %v ms, want 1", got)
	}
}

func TestSumRoutersAddsHolds(t *testing.T) {
	got := SumRouters([]RouterStats{{Routed: 3, Holds: 1, HoldSeconds: 0.002}, {Routed: 4, Holds: 2, HoldSeconds: 0.004}})
	if got.Routed != 7 || got.Holds != 3 || got.HoldSeconds != 0.006 {
		t.Errorf("sum %+v, want 7 routed, 3 holds, 0.006 s held", got)
	}
}
