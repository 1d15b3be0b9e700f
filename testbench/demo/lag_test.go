package demo_test

import (
	"math"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/testbench/demo"
)

func TestParseLagHistogram(t *testing.T) {
	page := `# HELP kvrouter_kv_events_lag_seconds Receive time minus the batch's timestamp.
# TYPE kvrouter_kv_events_lag_seconds histogram
kvrouter_kv_events_lag_seconds_bucket{le="0.001"} 90
kvrouter_kv_events_lag_seconds_bucket{le="0.0025"} 98
kvrouter_kv_events_lag_seconds_bucket{le="0.005"} 100
kvrouter_kv_events_lag_seconds_bucket{le="+Inf"} 100
kvrouter_kv_events_lag_seconds_sum 0.05
kvrouter_kv_events_lag_seconds_count 100
kvrouter_other_total 3
`
	tests := []struct {
		name       string
		page       string
		wantErr    bool
		mean, p50  float64
		p99, p100  float64
		wantCount  uint64
		emptyLimit bool
	}{
		{name: "histogram", page: page, mean: 0.5, p50: 1, p99: 5, p100: 5, wantCount: 100},
		{name: "no histogram", page: "kvrouter_other_total 3\n", wantErr: true},
		{name: "bad value", page: "kvrouter_kv_events_lag_seconds_count x\n", wantErr: true},
		{name: "empty histogram", page: "kvrouter_kv_events_lag_seconds_count 0\n", emptyLimit: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := demo.ParseLagHistogram(strings.NewReader(tt.page))
			if tt.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.emptyLimit {
				if !math.IsNaN(h.MeanMs()) || !math.IsNaN(h.QuantileBoundMs(0.5)) {
					t.Errorf("empty histogram: mean %v, p50 %v, want NaN", h.MeanMs(), h.QuantileBoundMs(0.5))
				}
				return
			}
			if h.Count != tt.wantCount {
				t.Errorf("count %d, want %d", h.Count, tt.wantCount)
			}
			for _, c := range []struct {
				what      string
				got, want float64
			}{
				{"mean", h.MeanMs(), tt.mean},
				{"p50", h.QuantileBoundMs(0.5), tt.p50},
				{"p99", h.QuantileBoundMs(0.99), tt.p99},
				{"p100", h.QuantileBoundMs(1), tt.p100},
			} {
				if math.Abs(c.got-c.want) > 1e-9 {
					t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
				}
			}
		})
	}
}

func TestOptionsValidateSpeedFactors(t *testing.T) {
	tests := []struct {
		name    string
		speeds  []float64
		wantErr bool
	}{
		{name: "none", speeds: nil},
		{name: "one per worker", speeds: []float64{1, 1, 0.7, 0.7, 0.7, 0.7}},
		{name: "too few", speeds: []float64{1, 1}, wantErr: true},
		{name: "zero", speeds: []float64{1, 1, 0, 0.7, 0.7, 0.7}, wantErr: true},
		{name: "NaN", speeds: []float64{1, 1, math.NaN(), 0.7, 0.7, 0.7}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := demo.DefaultOptions()
			o.SpeedFactors = tt.speeds
			if err := o.Validate(); (err != nil) != tt.wantErr {
				t.Errorf("Validate() = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}
