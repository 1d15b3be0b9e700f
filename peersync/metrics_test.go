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
	a := NewReplica("a", 1, src, 0, 0, nil, m)
	b := NewReplica("b", 1, nil, 0, 0, nil, m)
	msg := a.State()
	if err := b.Receive(msg); err != nil {
		t.Fatal(err)
	}
	_ = b.Receive(msg) // the same snapshot again: stale
	_ = b.Receive([]byte{0})
	_ = b.Receive(msg[:len(msg)-1])
	_ = b.Receive(append(appendV1(nil, &Snapshot{Origin: "c", Seq: 1}), 0))
	if err := b.Receive(appendV1(nil, &Snapshot{Origin: "c", Seq: 2})); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP kvrouter_peersync_messages_total Snapshots of in-flight state by direction: sent (built once, sent to every peer), received (applied), stale (older than the one held).
# TYPE kvrouter_peersync_messages_total counter
kvrouter_peersync_messages_total{direction="received"} 2
kvrouter_peersync_messages_total{direction="sent"} 1
kvrouter_peersync_messages_total{direction="stale"} 1
# HELP kvrouter_peersync_snapshots_decoded_total Peers' snapshots decoded, by the wire version they were written in (several during a rolling upgrade).
# TYPE kvrouter_peersync_snapshots_decoded_total counter
kvrouter_peersync_snapshots_decoded_total{version="1"} 1
kvrouter_peersync_snapshots_decoded_total{version="2"} 2
kvrouter_peersync_snapshots_decoded_total{version="3"} 0
# HELP kvrouter_peersync_snapshots_refused_total Peers' messages refused as malformed, by reason: magic, version, truncated, limit, invalid, trailing.
# TYPE kvrouter_peersync_snapshots_refused_total counter
kvrouter_peersync_snapshots_refused_total{reason="invalid"} 0
kvrouter_peersync_snapshots_refused_total{reason="limit"} 0
kvrouter_peersync_snapshots_refused_total{reason="magic"} 1
kvrouter_peersync_snapshots_refused_total{reason="trailing"} 1
kvrouter_peersync_snapshots_refused_total{reason="truncated"} 1
kvrouter_peersync_snapshots_refused_total{reason="version"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_peersync_messages_total",
		"kvrouter_peersync_snapshots_decoded_total", "kvrouter_peersync_snapshots_refused_total"); err != nil {
		t.Fatal(err)
	}
	v1 := len(appendV1(nil, &Snapshot{Origin: "c", Seq: 2}))
	if got := testutil.ToFloat64(m.bytes.WithLabelValues("received")); got != float64(2*len(msg)+v1) {
		t.Fatalf("received bytes = %v, want %d", got, 2*len(msg)+v1)
	}
}
