package peersync

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/placement"
)

func TestMetricsCountMessages(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	src := &fakeSource{loads: []placement.EndpointLoad{{Endpoint: "e", Load: placement.Load{Requests: 1}}}}
	a := NewReplica("a", 1, src, 0, nil, m)
	b := NewReplica("b", 1, nil, 0, nil, m)
	msg := a.State()
	if err := b.Receive(msg); err != nil {
		t.Fatal(err)
	}
	_ = b.Receive(msg) // the same snapshot again: stale
	_ = b.Receive([]byte{0})
	want := `
# HELP kvrouter_peersync_messages_total Snapshots of in-flight state by direction: sent (built once, sent to every peer), received (applied), stale (older than the one held), malformed.
# TYPE kvrouter_peersync_messages_total counter
kvrouter_peersync_messages_total{direction="malformed"} 1
kvrouter_peersync_messages_total{direction="received"} 1
kvrouter_peersync_messages_total{direction="sent"} 1
kvrouter_peersync_messages_total{direction="stale"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_peersync_messages_total"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.bytes.WithLabelValues("received")); got != float64(2*len(msg)) {
		t.Fatalf("received bytes = %v, want %d", got, 2*len(msg))
	}
}
