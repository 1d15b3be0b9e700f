package tokenizer

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts segment-cache lookups of every tokenizer that uses it, labelled by
// model. One Metrics serves any number of tokenizers.
type Metrics struct {
	lookups *prometheus.CounterVec
}

// NewMetrics creates the tokenizer metrics and registers them on reg (nil: not
// registered, counted only):
//
//	kvrouter_tokenizer_segment_cache_lookups_total{model, result="hit"|"miss"}
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_tokenizer_segment_cache_lookups_total",
		Help: "Lookups of tokenized text segments (text between added tokens) in the tokenizer's LRU, by result.",
	}, []string{"model", "result"})}
	if reg != nil {
		reg.MustRegister(m.lookups)
	}
	return m
}

// WithMetrics makes the tokenizer count its cache lookups in m under the label model.
func WithMetrics(m *Metrics, model string) Option {
	return func(o *options) { o.metrics, o.model = m, model }
}

// cacheCounters are the resolved counters of one tokenizer (nil: not counted).
type cacheCounters struct {
	hit, miss prometheus.Counter
}

func newCacheCounters(m *Metrics, model string) cacheCounters {
	if m == nil {
		return cacheCounters{}
	}
	return cacheCounters{
		hit:  m.lookups.WithLabelValues(model, "hit"),
		miss: m.lookups.WithLabelValues(model, "miss"),
	}
}

func (c cacheCounters) count(hit bool) {
	switch {
	case c.hit == nil:
	case hit:
		c.hit.Inc()
	default:
		c.miss.Inc()
	}
}
