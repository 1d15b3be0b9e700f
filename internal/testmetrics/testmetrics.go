package testmetrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the first series of counter or gauge name in g that carries
// every label pair of labels (name, value, name, value, ...). A counter vector's series
// appears at its first increment, so a missing series reads 0.
func Value(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	v, _ := lookup(tb, g, name, labels)
	return v
}

// Must is Value for a series that must exist: it fails tb when none does.
func Must(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	v, ok := lookup(tb, g, name, labels)
	if !ok {
		tb.Fatalf("no metric %s%v", name, labels)
	}
	return v
}

func lookup(tb testing.TB, g prometheus.Gatherer, name string, labels []string) (float64, bool) {
	tb.Helper()
	m := series(tb, g, name, labels)
	if m == nil {
		return 0, false
	}
	if c := m.GetCounter(); c != nil {
		return c.GetValue(), true
	}
	return m.GetGauge().GetValue(), true
}

// series returns the first series of name in g that carries every label pair of labels,
// nil when there is none: the one Gather loop of this package.
func series(tb testing.TB, g prometheus.Gatherer, name string, labels []string) *dto.Metric {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if hasLabels(m, labels) {
				return m
			}
		}
	}
	return nil
}

func hasLabels(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Histogram returns the sample count and sum of the first series of histogram name in g
// that carries every label pair of labels; a missing series reads 0, 0.
func Histogram(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) (count uint64, sum float64) {
	tb.Helper()
	h := series(tb, g, name, labels).GetHistogram() // nil-safe: a missing series reads 0, 0
	return h.GetSampleCount(), h.GetSampleSum()
}

// Exists reports whether g has a series of name carrying every label pair of labels.
func Exists(tb testing.TB, g prometheus.Gatherer, name string, labels ...string) bool {
	tb.Helper()
	_, ok := lookup(tb, g, name, labels)
	return ok
}
