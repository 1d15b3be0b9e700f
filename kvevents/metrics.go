package kvevents

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Clear reasons, as counted in kvrouter_kv_events_clears_total and passed to Status.
const (
	ClearGap          = "gap"           // sequence gap and no replay socket
	ClearReplayFailed = "replay_failed" // replay socket unreachable, silent or garbled
	ClearEvicted      = "evicted"       // the missed batches left the replay buffer
	ClearRestart      = "restart"       // the sequence went backwards on one connection
	ClearReconnect    = "reconnect"     // a new connection: rebuilt from the replay socket if any
	ClearAllBlocks    = "all_blocks_cleared"
	ClearRemoved      = "removed" // the endpoint was removed from the subscriber
)

var clearReasons = []string{ClearGap, ClearReplayFailed, ClearEvicted, ClearRestart, ClearReconnect,
	ClearAllBlocks, ClearRemoved}

// Bad message reasons (messages that are not three well-formed frames).
const (
	badFrames = "frame_count"
	badSeq    = "seq_size"
	badTopic  = "topic"
	// badTooLarge: over max_message_bytes (read past), or announcing an absurd size (the
	// connection is dropped).
	badTooLarge = "too_large"
	// badProtocol: the peer broke ZMTP; the connection was dropped (per-pod mode).
	badProtocol = "protocol"
	// Central mode only.
	badUnknownEndpoint = "unknown_endpoint" // the topic names no endpoint discovery knows
	badSource          = "source"           // the topic names an IP other than the connection's
	badRank            = "rank"             // the endpoint has no stream for the port's rank
)

var badReasons = []string{badFrames, badSeq, badTopic, badTooLarge, badProtocol, badUnknownEndpoint, badSource, badRank}

type metrics struct {
	batches      prometheus.Counter
	events       *prometheus.CounterVec
	blocks       *prometheus.CounterVec
	decodeErrors *prometheus.CounterVec
	badMessages  *prometheus.CounterVec
	gaps         prometheus.Counter
	replays      *prometheus.CounterVec
	clears       *prometheus.CounterVec
	redials      prometheus.Counter
	connected    prometheus.Gauge
	lag          prometheus.Histogram

	centralConns *prometheus.CounterVec
	centralPeers prometheus.Gauge
	bindErrors   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_batches_total",
			Help: "Event batches applied (live and replayed).",
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_events_total",
			Help: "Events applied, by type.",
		}, []string{"type"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_blocks_total",
			Help: "Blocks in applied events, by event type (stored, removed).",
		}, []string{"type"}),
		decodeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_decode_errors_total",
			Help: "Payloads that failed to decode, by reason.",
		}, []string{"reason"}),
		badMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_bad_messages_total",
			Help: "Messages dropped before decoding: wrong frame count, sequence frame size or topic, over max_message_bytes, a connection ended by a ZMTP protocol error; in central mode also unknown endpoint, source mismatch, rank without a stream.",
		}, []string{"reason"}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_gaps_total",
			Help: "Sequence gaps detected (including undecodable batches).",
		}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_replays_total",
			Help: "Replay recoveries, by result (ok, evicted, failed).",
		}, []string{"result"}),
		clears: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_clears_total",
			Help: "Times an endpoint's entries were dropped, by reason.",
		}, []string{"reason"}),
		redials: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_redials_total",
			Help: "Per-pod connections redialled: after a failed dial or handshake, a lost connection, a protocol error or a watchdog timeout.",
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_kv_events_streams_connected",
			Help: "Streams (endpoint x data-parallel rank) currently connected.",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_kv_events_lag_seconds",
			Help:    "Receive time minus the batch's timestamp.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		centralConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_central_connections_total",
			Help: "Publisher connections to the central-mode socket, by outcome (accepted, rejected over max_peers, handshake_failed, protocol_error).",
		}, []string{"result"}),
		centralPeers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_kv_events_central_peers",
			Help: "Publisher connections open on the central-mode socket.",
		}),
		bindErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_kv_events_central_bind_errors_total",
			Help: "Central-mode ports (bind port + rank) that could not be listened on.",
		}),
	}
	for _, t := range []string{"BlockStored", "BlockRemoved", "AllBlocksCleared"} {
		m.events.WithLabelValues(t)
	}
	m.blocks.WithLabelValues("stored")
	m.blocks.WithLabelValues("removed")
	for _, r := range Reasons {
		m.decodeErrors.WithLabelValues(string(r))
	}
	for _, r := range badReasons {
		m.badMessages.WithLabelValues(r)
	}
	for _, r := range []string{connAccepted, connRejected, connHandshakeFailed, connProtocolError} {
		m.centralConns.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "evicted", "failed"} {
		m.replays.WithLabelValues(r)
	}
	for _, r := range clearReasons {
		m.clears.WithLabelValues(r)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.batches, m.events, m.blocks, m.decodeErrors,
			m.badMessages, m.gaps, m.replays, m.clears, m.redials, m.connected, m.lag,
			m.centralConns, m.centralPeers, m.bindErrors} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("kvevents: register metrics: %w", err)
			}
		}
	}
	return m, nil
}
