package tokenizer

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts the prefix-cache use of every tokenizer that reports to it, labelled
// by model. One Metrics serves any number of tokenizers.
type Metrics struct {
	lookups *prometheus.CounterVec
	tokens  *prometheus.CounterVec
	proven  *prometheus.CounterVec
	bytes   *prometheus.GaugeVec
}

// NewMetrics creates the tokenizer metrics and registers them on reg (nil: not
// registered, counted only):
//
//	kvrouter_tokenizer_prefix_cache_lookups_total{model, result="hit"|"miss"}
//	kvrouter_tokenizer_prefix_cache_tokens_total{model, source="cached"|"encoded"}
//	kvrouter_tokenizer_prefix_cache_proven_total{model}
//	kvrouter_tokenizer_prefix_cache_bytes{model}
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_tokenizer_prefix_cache_lookups_total",
			Help: "Encodes of a text with a cut point (an added token such as <|im_start|>) that looked up the prefix cache, by result: hit when a cached prefix was used.",
		}, []string{"model", "result"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_tokenizer_prefix_cache_tokens_total",
			Help: "Token ids of those encodes, by source: cached (copied from the prefix cache) or encoded.",
		}, []string{"model", "source"}),
		proven: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_tokenizer_prefix_cache_proven_total",
			Help: "Encodes whose cached prefix was found from the caller's provenance of the text (a chat template's stored loop iterations) rather than by hashing the text.",
		}, []string{"model"}),
		bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvrouter_tokenizer_prefix_cache_bytes",
			Help: "Memory the prefix cache accounts for (ids at 4 bytes plus a fixed overhead per span, and the block keys stored on spans), bounded by its configured budget.",
		}, []string{"model"}),
	}
	if reg != nil {
		reg.MustRegister(m.lookups, m.tokens, m.proven, m.bytes)
	}
	return m
}

// WithMetrics makes the tokenizer report its prefix cache in m under the label model.
func WithMetrics(m *Metrics, model string) Option {
	return func(o *options) { o.metrics, o.model = m, model }
}

// cacheCounters are the resolved metrics of one tokenizer (zero: not counted).
type cacheCounters struct {
	hit, miss, cached, encoded, proven prometheus.Counter
	bytes                              prometheus.Gauge
}

func newCacheCounters(m *Metrics, model string) cacheCounters {
	if m == nil {
		return cacheCounters{}
	}
	return cacheCounters{
		hit:     m.lookups.WithLabelValues(model, "hit"),
		miss:    m.lookups.WithLabelValues(model, "miss"),
		cached:  m.tokens.WithLabelValues(model, "cached"),
		encoded: m.tokens.WithLabelValues(model, "encoded"),
		proven:  m.proven.WithLabelValues(model),
		bytes:   m.bytes.WithLabelValues(model),
	}
}

func (c cacheCounters) lookup(hit bool, cached, encoded int) {
	if c.hit == nil {
		return
	}
	if hit {
		c.hit.Inc()
	} else {
		c.miss.Inc()
	}
	c.cached.Add(float64(cached))
	c.encoded.Add(float64(encoded))
}

func (c cacheCounters) resumed() {
	if c.proven != nil {
		c.proven.Inc()
	}
}

func (c cacheCounters) setBytes(n int64) {
	if c.bytes != nil {
		c.bytes.Set(float64(n))
	}
}
