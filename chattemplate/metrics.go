package chattemplate

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// Metrics reports the message cache of every template that reports to it, labelled by
// model. One Metrics serves any number of templates.
type Metrics struct {
	lookups    *prometheus.CounterVec
	bytes      *prometheus.GaugeVec
	iterations *prometheus.CounterVec
}

// NewMetrics creates the template metrics and registers them on reg (nil: not
// registered, counted only):
//
//	kvrouter_chattemplate_message_cache_lookups_total{model, result="hit"|"miss"}
//	kvrouter_chattemplate_message_cache_bytes{model}
//	kvrouter_chattemplate_render_iterations_total{model, result="reused"|"rendered"}
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_chattemplate_message_cache_lookups_total",
			Help: "Request messages looked up in the converted-message cache, by result: hit when the message was converted before.",
		}, []string{"model", "result"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_chattemplate_message_cache_bytes",
			Help: "Memory the converted-message cache accounts for (raw JSON, converted strings and values, a fixed overhead per message), bounded by its configured budget.",
		}, []string{"model"}),
		iterations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_chattemplate_render_iterations_total",
			Help: "Iterations of the chat template's message loops, by result: reused from the message cache (same message, same position, same values read from the rest of the conversation) or rendered.",
		}, []string{"model", "result"}),
	}
	if reg != nil {
		reg.MustRegister(m.lookups, m.bytes, m.iterations)
	}
	return m
}

// cacheMetrics are the resolved metrics of one template's cache (nil: not counted).
type cacheMetrics struct {
	hit, miss        prometheus.Counter
	bytes            prometheus.Gauge
	reused, rendered prometheus.Counter
}

func newCacheMetrics(m *Metrics, model string) *cacheMetrics {
	if m == nil {
		return nil
	}
	return &cacheMetrics{
		hit:      m.lookups.WithLabelValues(model, "hit"),
		miss:     m.lookups.WithLabelValues(model, "miss"),
		bytes:    m.bytes.WithLabelValues(model),
		reused:   m.iterations.WithLabelValues(model, "reused"),
		rendered: m.iterations.WithLabelValues(model, "rendered"),
	}
}

func (c *cacheMetrics) lookup(hit bool) {
	switch {
	case c == nil:
	case hit:
		c.hit.Inc()
	default:
		c.miss.Inc()
	}
}

// hits counts n lookups that hit.
func (c *cacheMetrics) hits(n int) {
	if c != nil && n > 0 {
		c.hit.Add(float64(n))
	}
}

func (c *cacheMetrics) setBytes(n int64) {
	if c != nil {
		c.bytes.Set(float64(n))
	}
}

func (c *cacheMetrics) iterations(s jinja.RenderStats) {
	if c != nil {
		c.reused.Add(float64(s.Reused))
		c.rendered.Add(float64(s.Rendered))
	}
}
