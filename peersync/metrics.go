package peersync

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are peersync's Prometheus metrics; a nil *Metrics counts nothing.
type Metrics struct {
	messages *prometheus.CounterVec
	versions *prometheus.CounterVec
	refused  *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	lagSec   prometheus.Histogram
	peers    *prometheus.GaugeVec
	joins    *prometheus.CounterVec
}

// NewMetrics registers peersync's metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_peersync_messages_total",
			Help: "Snapshots of in-flight state by direction: sent (built once, sent to every peer), received (applied), stale (older than the one held).",
		}, []string{"direction"}),
		versions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_peersync_snapshots_decoded_total",
			Help: "Peers' snapshots decoded, by the wire version they were written in (several during a rolling upgrade).",
		}, []string{"version"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_peersync_snapshots_refused_total",
			Help: "Peers' messages refused as malformed, by reason: magic, version, truncated, limit, invalid, trailing.",
		}, []string{"reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_peersync_bytes_total",
			Help: "Bytes of snapshots built (sent, once per snapshot) and received.",
		}, []string{"direction"}),
		lagSec: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_peersync_lag_seconds",
			Help:    "Age of a peer's snapshot when applied: receive time minus the peer's send time (includes clock skew between hosts).",
			Buckets: []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1},
		}),
		peers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_peersync_peers",
			Help: "Other kvrouter replicas by state: alive (memberlist members besides this one), live (whose shared state counts: heard within the expiry).",
		}, []string{"state"}),
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_peersync_joins_total",
			Help: "Attempts to join the configured peers, by result (ok, error).",
		}, []string{"result"}),
	}
	for _, d := range []string{"sent", "received", "stale"} {
		m.messages.WithLabelValues(d)
	}
	for v := minVersion; v <= version; v++ {
		m.versions.WithLabelValues(strconv.Itoa(v))
	}
	for _, r := range reasons {
		m.refused.WithLabelValues(r)
	}
	for _, d := range []string{"sent", "received"} {
		m.bytes.WithLabelValues(d)
	}
	for _, s := range []string{"alive", "live"} {
		m.peers.WithLabelValues(s)
	}
	for _, s := range []string{"ok", "error"} {
		m.joins.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(m.messages, m.versions, m.refused, m.bytes, m.lagSec, m.peers, m.joins)
	}
	return m
}

func (m *Metrics) published(n int) {
	if m == nil {
		return
	}
	m.messages.WithLabelValues("sent").Inc()
	m.bytes.WithLabelValues("sent").Add(float64(n))
}

func (m *Metrics) received(n int, applied bool) {
	if m == nil {
		return
	}
	if applied {
		m.messages.WithLabelValues("received").Inc()
	} else {
		m.messages.WithLabelValues("stale").Inc()
	}
	m.bytes.WithLabelValues("received").Add(float64(n))
}

func (m *Metrics) decoded(version int) {
	if m != nil {
		m.versions.WithLabelValues(strconv.Itoa(version)).Inc()
	}
}

// refuse counts a refused message by its reason (a *MalformedError's).
func (m *Metrics) refuse(err error) {
	var me *MalformedError
	if m != nil && errors.As(err, &me) {
		m.refused.WithLabelValues(me.Reason).Inc()
	}
}

func (m *Metrics) lag(d time.Duration) {
	if m != nil {
		m.lagSec.Observe(max(d.Seconds(), 0))
	}
}

func (m *Metrics) setPeers(alive, live int) {
	if m != nil {
		m.peers.WithLabelValues("alive").Set(float64(alive))
		m.peers.WithLabelValues("live").Set(float64(live))
	}
}

func (m *Metrics) join(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.joins.WithLabelValues("error").Inc()
	} else {
		m.joins.WithLabelValues("ok").Inc()
	}
}
