package prompt

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts the requests whose prompt ids could not be computed. A nil *Metrics
// counts nothing.
type Metrics struct {
	unsupported *prometheus.CounterVec
	failures    *prometheus.CounterVec
}

// Failure kinds counted in kvrouter_prompt_failures_total.
const (
	failBadRequest   = "bad_request"
	failUnknownModel = "unknown_model"
	failLoad         = "load"
	failRender       = "render"
)

// NewMetrics creates the metrics and registers them on reg; a nil reg registers
// nothing (the counters still work).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		unsupported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_prompt_unsupported_total",
			Help: "Requests whose prompt token ids cannot be reproduced exactly (routed by load), by reason.",
		}, []string{"reason"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_prompt_failures_total",
			Help: "Requests whose prompt token ids could not be computed, by kind: bad_request (vLLM rejects it too), unknown_model, load, render.",
		}, []string{"kind"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.unsupported, m.failures} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) observe(err error) {
	if m == nil || err == nil {
		return
	}
	var unsupported *UnsupportedError
	var unknown *UnknownModelError
	var load *LoadError
	switch {
	case errors.As(err, &unsupported):
		m.unsupported.WithLabelValues(unsupported.Reason).Inc()
	case errors.As(err, &unknown):
		m.failures.WithLabelValues(failUnknownModel).Inc()
	case errors.As(err, &load):
		m.failures.WithLabelValues(failLoad).Inc()
	case errors.Is(err, ErrBadRequest):
		m.failures.WithLabelValues(failBadRequest).Inc()
	default:
		m.failures.WithLabelValues(failRender).Inc()
	}
}
