package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
)

// The Inference Extension's pool series are derived from the scraped figures of the
// eligible endpoints whose figures are fresh, named after Options.PoolName.
func TestInferencePoolSeries(t *testing.T) {
	a := newFakeVLLM(t, load{Running: 4, Waiting: 2, Usage: 0.25})
	b := newFakeVLLM(t, load{Running: 2, Waiting: 6, Usage: 0.75})
	eps := []fleet.EndpointConfig{
		{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: a.metricsURL()},
		{Address: "127.0.0.1:8001", Models: []string{qwen}, MetricsURL: b.metricsURL()},
		{Address: "127.0.0.1:8002", Models: []string{qwen}, MetricsURL: "http://127.0.0.1:1/metrics"}, // never scraped
		{Address: "127.0.0.1:8003", Models: []string{qwen}},                                           // not scraped: eligible, no figures
	}
	tests := []struct {
		name     string
		pool     string
		wantName string
		setup    func(f *fleet.Fleet, clk *clock)
		ready    float64
		kv, q, r float64 // the averages; unset when ready is 0
	}{
		{name: "two fresh endpoints", pool: "qwen-pool", wantName: "qwen-pool", setup: func(*fleet.Fleet, *clock) {},
			ready: 2, kv: 0.5, q: 4, r: 3},
		{name: "default pool name", wantName: fleet.DefaultPoolName, setup: func(*fleet.Fleet, *clock) {},
			ready: 2, kv: 0.5, q: 4, r: 3},
		{name: "an endpoint held out by discovery", pool: "p", wantName: "p",
			setup: func(f *fleet.Fleet, _ *clock) { f.SetReady("127.0.0.1:8001", false) },
			ready: 1, kv: 0.25, q: 2, r: 4},
		{name: "stale figures count for nothing", pool: "p", wantName: "p",
			setup: func(_ *fleet.Fleet, clk *clock) { clk.Advance(scrapeCfg().StalenessLimit + time.Second) },
			ready: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			reg := prometheus.NewPedanticRegistry()
			f, err := fleet.New(fleet.Config{Endpoints: eps, Scrape: scrapeCfg()},
				fleet.Options{Now: clk.Now, Registerer: reg, PoolName: tc.pool})
			if err != nil {
				t.Fatal(err)
			}
			f.ScrapeAll(context.Background())
			tc.setup(f, clk)
			name := []string{"name", tc.wantName}
			if got := testmetrics.Must(t, reg, "inference_pool_ready_pods", name...); got != tc.ready {
				t.Errorf("ready_pods = %v, want %v", got, tc.ready)
			}
			// Every scraped endpoint's queue, fresh or not, as the picker's per-pod series.
			for addr, want := range map[string]float64{"127.0.0.1:8000": 2, "127.0.0.1:8001": 6} {
				if got := testmetrics.Must(t, reg, "inference_pool_per_pod_queue_size", "name", tc.wantName, "model_server_pod", addr); got != want {
					t.Errorf("per_pod_queue_size{%s} = %v, want %v", addr, got, want)
				}
			}
			if testmetrics.Exists(t, reg, "inference_pool_per_pod_queue_size", "model_server_pod", "127.0.0.1:8003") {
				t.Error("per_pod_queue_size for an endpoint never scraped")
			}
			avgs := map[string]float64{
				"inference_pool_average_kv_cache_utilization": tc.kv,
				"inference_pool_average_queue_size":           tc.q,
				"inference_pool_average_running_requests":     tc.r,
			}
			for metric, want := range avgs {
				if tc.ready == 0 {
					if testmetrics.Exists(t, reg, metric) {
						t.Errorf("%s exported with no endpoint to average", metric)
					}
					continue
				}
				if got := testmetrics.Must(t, reg, metric, name...); got != want {
					t.Errorf("%s = %v, want %v", metric, got, want)
				}
			}
		})
	}
}
