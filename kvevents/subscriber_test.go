package kvevents_test

import (
	"context"
	"encoding/binary"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/kvevents"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

func stored(hs ...uint64) *kvevents.BlockStored {
	return &kvevents.BlockStored{BlockHashes: hs, TokenIDs: make([]uint32, 16*len(hs)), BlockSize: 16, Medium: "GPU"}
}

// TestSubscriberSequence drives the subscriber from a Go PUB socket (no replay socket):
// malformed messages are dropped and counted, undecodable batches and gaps clear the
// endpoint, AllBlocksCleared clears at its place in the batch, and a sequence that goes
// back to 0 is a restart. Metrics are compared with golden text.
func TestSubscriberSequence(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePorts(t, 1)
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(nil))
	defer pub.Close()
	if err := pub.Listen(tcp(port)); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_764_000_000, 0)
	reg := prometheus.NewRegistry()
	sink := newRefSink()
	sub, err := kvevents.NewSubscriber(kvevents.Config{Topic: "kv", Endpoints: []kvevents.EndpointConfig{
		{Name: "pod", Address: tcp(port)}}}, sink, nil, reg, fixedClock{now})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- sub.Run(ctx) }()

	send := func(frames ...[]byte) {
		t.Helper()
		if err := pub.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	batch := func(seq uint64, enc kvevents.Encoding, evs ...kvevents.Event) {
		t.Helper()
		b := &kvevents.Batch{TS: float64(now.Unix()) - 0.5, Events: evs, DPRank: 0, HasDPRank: true}
		send([]byte("kv@pod"), seqFrame(seq), kvevents.Encode(b, enc))
	}
	// The PUB drops messages until the subscription arrives: probe with two-frame
	// messages (counted as drops) until one gets through.
	testwait.For(t, "the subscription", func() bool {
		send([]byte("kv"), []byte("probe"))
		return statusOf(t, sub, "pod", 0).Drops > 0
	})
	drops := statusOf(t, sub, "pod", 0).Drops

	batch(0, kvevents.EncodingArray, stored(1, 2))
	batch(1, kvevents.EncodingMap, stored(3), &kvevents.BlockRemoved{BlockHashes: []uint64{1}})
	send([]byte("kv"), []byte{0, 1}, []byte{0x90})                                     // sequence frame of 2 bytes
	send([]byte("kv"), seqFrame(2), []byte{0xc1, 0x00})                                // garbage: decode error, cleared
	batch(3, kvevents.EncodingArray, stored(4))                                        // {4}
	batch(5, kvevents.EncodingMap, stored(5))                                          // gap: cleared, {5}
	batch(6, kvevents.EncodingArray, &kvevents.BlockRemoved{BlockHashes: []uint64{5}}, // {}
		&kvevents.AllBlocksCleared{}, stored(6)) // cleared, {6}
	testwait.For(t, "seq 6", func() bool { st := statusOf(t, sub, "pod", 0); return st.HasSeq && st.LastSeq == 6 })
	if got := sink.snapshot("pod", 0); !maps.Equal(got, map[uint64]int{6: 1}) {
		t.Fatalf("after seq 6 the sink holds %v, want {6:1}", got)
	}
	batch(0, kvevents.EncodingMap, stored(7), stored(7)) // restart: cleared, {7:2}
	testwait.For(t, "the restart", func() bool { return statusOf(t, sub, "pod", 0).LastSeq == 0 })
	if got := sink.snapshot("pod", 0); !maps.Equal(got, map[uint64]int{7: 2}) {
		t.Fatalf("after the restart the sink holds %v, want {7:2}", got)
	}

	st := statusOf(t, sub, "pod", 0)
	want := kvevents.StreamStatus{Endpoint: "pod", Address: tcp(port), Connected: true, LastSeq: 0, HasSeq: true,
		Batches: 6, Events: 10, Gaps: 2, Drops: st.Drops, LastBatchAt: now, LastLag: 500 * time.Millisecond,
		Clears:       map[string]uint64{kvevents.ClearGap: 2, kvevents.ClearAllBlocks: 1, kvevents.ClearRestart: 1},
		DecodeErrors: map[kvevents.Reason]uint64{kvevents.ReasonBadType: 1}}
	// Probes still in flight when the subscription was seen may add drops: at least the
	// bad sequence frame must be counted.
	if st.Drops < drops+1 {
		t.Errorf("drops %d, want at least %d", st.Drops, drops+1)
	}
	if fmtStatus(st) != fmtStatus(want) {
		t.Errorf("status\n got %s\nwant %s", fmtStatus(st), fmtStatus(want))
	}

	const golden = `
# HELP kvrouter_kv_events_batches_total Event batches applied (live and replayed).
# TYPE kvrouter_kv_events_batches_total counter
kvrouter_kv_events_batches_total 6
# HELP kvrouter_kv_events_blocks_total Blocks in applied events, by event type (stored, removed).
# TYPE kvrouter_kv_events_blocks_total counter
kvrouter_kv_events_blocks_total{type="removed"} 2
kvrouter_kv_events_blocks_total{type="stored"} 8
# HELP kvrouter_kv_events_clears_total Times an endpoint's entries were dropped, by reason.
# TYPE kvrouter_kv_events_clears_total counter
kvrouter_kv_events_clears_total{reason="all_blocks_cleared"} 1
kvrouter_kv_events_clears_total{reason="evicted"} 0
kvrouter_kv_events_clears_total{reason="gap"} 2
kvrouter_kv_events_clears_total{reason="reconnect"} 0
kvrouter_kv_events_clears_total{reason="removed"} 0
kvrouter_kv_events_clears_total{reason="replay_failed"} 0
kvrouter_kv_events_clears_total{reason="restart"} 1
# HELP kvrouter_kv_events_decode_errors_total Payloads that failed to decode, by reason.
# TYPE kvrouter_kv_events_decode_errors_total counter
kvrouter_kv_events_decode_errors_total{reason="bad_hash_size"} 0
kvrouter_kv_events_decode_errors_total{reason="bad_shape"} 0
kvrouter_kv_events_decode_errors_total{reason="bad_type"} 1
kvrouter_kv_events_decode_errors_total{reason="invalid_msgpack"} 0
kvrouter_kv_events_decode_errors_total{reason="missing_field"} 0
kvrouter_kv_events_decode_errors_total{reason="too_deep"} 0
kvrouter_kv_events_decode_errors_total{reason="trailing_bytes"} 0
kvrouter_kv_events_decode_errors_total{reason="truncated"} 0
# HELP kvrouter_kv_events_events_total Events applied, by type.
# TYPE kvrouter_kv_events_events_total counter
kvrouter_kv_events_events_total{type="AllBlocksCleared"} 1
kvrouter_kv_events_events_total{type="BlockRemoved"} 2
kvrouter_kv_events_events_total{type="BlockStored"} 7
# HELP kvrouter_kv_events_gaps_total Sequence gaps detected (including undecodable batches).
# TYPE kvrouter_kv_events_gaps_total counter
kvrouter_kv_events_gaps_total 2
# HELP kvrouter_kv_events_lag_seconds Receive time minus the batch's timestamp.
# TYPE kvrouter_kv_events_lag_seconds histogram
kvrouter_kv_events_lag_seconds_bucket{le="0.001"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.0025"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.005"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.01"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.025"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.05"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.1"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.25"} 0
kvrouter_kv_events_lag_seconds_bucket{le="0.5"} 6
kvrouter_kv_events_lag_seconds_bucket{le="1"} 6
kvrouter_kv_events_lag_seconds_bucket{le="2.5"} 6
kvrouter_kv_events_lag_seconds_bucket{le="5"} 6
kvrouter_kv_events_lag_seconds_bucket{le="10"} 6
kvrouter_kv_events_lag_seconds_bucket{le="+Inf"} 6
kvrouter_kv_events_lag_seconds_sum 3
kvrouter_kv_events_lag_seconds_count 6
# HELP kvrouter_kv_events_replays_total Replay recoveries, by result (ok, evicted, failed).
# TYPE kvrouter_kv_events_replays_total counter
kvrouter_kv_events_replays_total{result="evicted"} 0
kvrouter_kv_events_replays_total{result="failed"} 0
kvrouter_kv_events_replays_total{result="ok"} 0
# HELP kvrouter_kv_events_streams_connected Streams (endpoint x data-parallel rank) currently connected.
# TYPE kvrouter_kv_events_streams_connected gauge
kvrouter_kv_events_streams_connected 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(golden),
		"kvrouter_kv_events_batches_total", "kvrouter_kv_events_blocks_total",
		"kvrouter_kv_events_clears_total", "kvrouter_kv_events_decode_errors_total",
		"kvrouter_kv_events_events_total", "kvrouter_kv_events_gaps_total",
		"kvrouter_kv_events_lag_seconds", "kvrouter_kv_events_replays_total",
		"kvrouter_kv_events_streams_connected"); err != nil {
		t.Error(err)
	}

	cancel()
	select {
	case <-runDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}

func fmtStatus(s kvevents.StreamStatus) string {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return strings.Join([]string{
		s.Endpoint, s.Address, strconv.FormatBool(s.Connected), u(s.LastSeq), strconv.FormatBool(s.HasSeq),
		u(s.Batches), u(s.Events), u(s.Gaps), u(s.Replays), u(s.ReplayFailures), u(s.Drops),
		s.LastBatchAt.UTC().String(), s.LastLag.String(),
		"clears=" + mapS(s.Clears), "decode=" + mapS(s.DecodeErrors),
	}, " ")
}

// mapS formats the non-zero counts of m, sorted.
func mapS[K ~string](m map[K]uint64) string {
	var keys []string
	for k, v := range m {
		if v != 0 {
			keys = append(keys, string(k)+":"+strconv.FormatUint(v, 10))
		}
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

// TestSubscriberWatchdogRedials: with no publisher every dial fails and is retried with
// backoff; once a publisher (here zmq4's) appears, batches flow.
func TestSubscriberWatchdogRedials(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePorts(t, 1)
	sink := newRefSink()
	sub := runSubscriber(t, kvevents.Config{}, sink)
	if err := sub.Add(kvevents.EndpointConfig{Name: "late", Address: tcp(port)}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "a watchdog redial", func() bool { return statusOf(t, sub, "late", 0).Redials >= 1 })
	if statusOf(t, sub, "late", 0).Connected {
		t.Fatal("connected to nothing")
	}
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(nil))
	defer pub.Close()
	if err := pub.Listen(tcp(port)); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "a batch after the publisher appeared", func() bool {
		b := &kvevents.Batch{Events: []kvevents.Event{stored(42)}}
		_ = pub.SendMulti(zmq4.NewMsgFrom([]byte{}, seqFrame(0), kvevents.Encode(b, kvevents.EncodingArray)))
		return len(sink.snapshot("late", 0)) == 1
	})
	if err := sub.Add(kvevents.EndpointConfig{Name: "late", Address: tcp(port)}); err == nil {
		t.Error("adding an endpoint twice succeeded")
	}
	if err := sub.Remove("nope"); err == nil {
		t.Error("removing an unknown endpoint succeeded")
	}
}
