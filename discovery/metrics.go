package discovery

import "github.com/prometheus/client_golang/prometheus"

// Metrics are discovery's Prometheus metrics, shared by every source of a process
// (each labels its series with its source name).
type Metrics struct {
	targets *prometheus.GaugeVec
	changes *prometheus.CounterVec
	errors  *prometheus.CounterVec
	syncs   *prometheus.CounterVec
}

// NewMetrics builds discovery's metrics and registers them on reg; nil reg: not
// exported.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		targets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_discovery_targets",
			Help: "Endpoints discovery holds in the fleet, by source and state (ready, unready: held out during the grace).",
		}, []string{"source", "state"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_discovery_changes_total",
			Help: "Fleet changes made by discovery, by source and kind (added, updated, unready, ready, removed, expired).",
		}, []string{"source", "kind"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_discovery_errors_total",
			Help: "Targets skipped and failed look-ups, by source and reason.",
		}, []string{"source", "reason"}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_discovery_syncs_total",
			Help: "Complete target sets applied to the fleet, by source.",
		}, []string{"source"}),
	}
	if reg != nil {
		reg.MustRegister(m.targets, m.changes, m.errors, m.syncs)
	}
	return m
}

// Error counts one failure of a source's own (a list or a resolution that failed).
func (m *Metrics) Error(source, reason string) {
	if m != nil {
		m.errors.WithLabelValues(source, reason).Inc()
	}
}

// Synced counts one complete target set applied.
func (m *Metrics) Synced(source string) {
	if m != nil {
		m.syncs.WithLabelValues(source).Inc()
	}
}
