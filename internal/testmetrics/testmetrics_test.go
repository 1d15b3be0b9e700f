package testmetrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/testmetrics"
)

func TestValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"result", "model"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	reg.MustRegister(c, g)
	c.WithLabelValues("hit", "a").Add(2)
	c.WithLabelValues("miss", "a").Add(3)
	g.Set(7)
	for _, tc := range []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"gauge", "g", nil, 7},
		{"counter series", "c_total", []string{"result", "miss"}, 3},
		{"two labels", "c_total", []string{"result", "hit", "model", "a"}, 2},
		{"series not yet incremented", "c_total", []string{"result", "evicted"}, 0},
		{"no such metric", "nope", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := testmetrics.Value(t, reg, tc.metric, tc.labels...); got != tc.want {
				t.Errorf("Value = %v, want %v", got, tc.want)
			}
		})
	}
	if got := testmetrics.Must(t, reg, "c_total", "result", "hit"); got != 2 {
		t.Errorf("Must = %v, want 2", got)
	}
}
