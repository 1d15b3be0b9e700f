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

func TestHistogram(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "h", Help: "h", Buckets: []float64{1, 10}}, []string{"model"})
	reg.MustRegister(h)
	h.WithLabelValues("a").Observe(2)
	h.WithLabelValues("a").Observe(30)
	h.WithLabelValues("b").Observe(5)
	for _, tc := range []struct {
		name      string
		labels    []string
		wantCount uint64
		wantSum   float64
	}{
		{"series a", []string{"model", "a"}, 2, 32},
		{"series b", []string{"model", "b"}, 1, 5},
		{"no such series", []string{"model", "c"}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, s := testmetrics.Histogram(t, reg, "h", tc.labels...)
			if n != tc.wantCount || s != tc.wantSum {
				t.Errorf("Histogram = %d, %v, want %d, %v", n, s, tc.wantCount, tc.wantSum)
			}
		})
	}
	if !testmetrics.Exists(t, reg, "h", "model", "a") || testmetrics.Exists(t, reg, "h", "model", "c") {
		t.Error("Exists disagrees with the series registered")
	}
}
