package fleet_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/fleet"
)

func candidates(f *fleet.Fleet, model string) []string {
	eps, _, _, _ := f.Candidates(model)
	var out []string
	for _, e := range eps {
		out = append(out, e.Address)
	}
	return out
}

// TestPassiveFailure: a passive signal takes a healthy endpoint out at once; a scrape
// that starts after the signal and succeeds brings it back; the last eligible endpoint
// of a model is never taken out on a passive signal; a refused scrape is itself a
// passive signal.
func TestPassiveFailure(t *testing.T) {
	const a, b, c = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
	tests := []struct {
		name string
		run  func(t *testing.T, f *fleet.Fleet, clk *clock, pods map[string]*fakeVLLM)
		// want is kvrouter_fleet_passive_signals_total's expected text.
		want string
	}{
		{"ejected, back after the next scrape", func(t *testing.T, f *fleet.Fleet, clk *clock, _ map[string]*fakeVLLM) {
			f.ReportFailure(a, fleet.SignalEvents)
			if got := candidates(f, qwen); !slices.Equal(got, []string{b, c}) {
				t.Errorf("candidates after the signal %v, want [%s %s]", got, b, c)
			}
			st := status(t, f, a)
			if st.State != fleet.StateSuspect || !st.SuspectSince.Equal(clk.Now()) {
				t.Errorf("state %v since %v; want suspect since now", st.State, st.SuspectSince)
			}
			f.ReportFailure(a, fleet.SignalUpstream) // already out: ignored
			clk.Advance(time.Second)
			f.ScrapeAll(context.Background())
			if got := candidates(f, qwen); len(got) != 3 {
				t.Errorf("candidates after a good scrape %v, want all three", got)
			}
		}, `
kvrouter_fleet_passive_signals_total{result="ejected",signal="kv_events"} 1
kvrouter_fleet_passive_signals_total{result="ignored",signal="upstream"} 1
`},
		{"never the last eligible", func(t *testing.T, f *fleet.Fleet, _ *clock, _ map[string]*fakeVLLM) {
			f.SetReady(b, false)
			f.ReportFailure(c, fleet.SignalUpstream) // c out, a left
			f.ReportFailure(a, fleet.SignalUpstream) // the last one: kept
			if got := candidates(f, qwen); !slices.Equal(got, []string{a}) {
				t.Errorf("candidates %v, want [%s]", got, a)
			}
		}, `
kvrouter_fleet_passive_signals_total{result="ejected",signal="upstream"} 1
kvrouter_fleet_passive_signals_total{result="kept_last",signal="upstream"} 1
`},
		{"refused scrape ejects at once", func(t *testing.T, f *fleet.Fleet, clk *clock, pods map[string]*fakeVLLM) {
			pods[c].Close()
			clk.Advance(time.Second)
			f.ScrapeAll(context.Background())
			if st := status(t, f, c); st.State != fleet.StateSuspect || st.Failures != 1 {
				t.Errorf("after one refused scrape: state %v failures %d; want suspect, 1", st.State, st.Failures)
			}
			for range 2 {
				clk.Advance(time.Second)
				f.ScrapeAll(context.Background())
			}
			if st := status(t, f, c); st.State != fleet.StateUnhealthy {
				t.Errorf("after 3 refused scrapes: state %v, want unhealthy", st.State)
			}
		}, `
kvrouter_fleet_passive_signals_total{result="ejected",signal="scrape"} 1
`},
		{"unknown endpoint ignored", func(t *testing.T, f *fleet.Fleet, _ *clock, _ map[string]*fakeVLLM) {
			f.ReportFailure("10.9.9.9:8000", fleet.SignalEvents)
			if got := candidates(f, qwen); len(got) != 3 {
				t.Errorf("candidates %v, want all three", got)
			}
		}, `
kvrouter_fleet_passive_signals_total{result="ignored",signal="kv_events"} 1
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			reg := prometheus.NewPedanticRegistry()
			pods := map[string]*fakeVLLM{}
			var eps []fleet.EndpointConfig
			for _, addr := range []string{a, b, c} {
				pods[addr] = newFakeVLLM(t, load{})
				eps = append(eps, fleet.EndpointConfig{Address: addr, Models: []string{qwen}, MetricsURL: pods[addr].metricsURL()})
			}
			f := newFleet(t, clk, reg, eps...)
			f.ScrapeAll(context.Background())
			tc.run(t, f, clk, pods)
			want := "# HELP kvrouter_fleet_passive_signals_total Passive failure signals (kv_events, upstream, scrape) by result: ejected (the endpoint became suspect), kept_last (the last eligible endpoint of a model), ignored.\n# TYPE kvrouter_fleet_passive_signals_total counter" + tc.want
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_fleet_passive_signals_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPassiveFailureScrapeInFlight: a scrape that was already running when the signal
// came proves nothing about it and does not bring the endpoint back; the next one does.
func TestPassiveFailureScrapeInFlight(t *testing.T) {
	pod, other := newFakeVLLM(t, load{}), newFakeVLLM(t, load{})
	clk := newClock()
	f := newFleet(t, clk, nil,
		fleet.EndpointConfig{Address: "10.0.0.1:8000", Models: []string{qwen}, MetricsURL: pod.metricsURL()},
		fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{qwen}, MetricsURL: other.metricsURL()})
	f.ScrapeAll(context.Background())
	entered, release := make(chan struct{}), make(chan struct{})
	hold := func() { entered <- struct{}{}; <-release }
	pod.hold.Store(&hold)
	done := make(chan struct{})
	go func() { f.ScrapeAll(context.Background()); close(done) }()
	<-entered // the scrape of 10.0.0.1 has started
	clk.Advance(time.Millisecond)
	f.ReportFailure("10.0.0.1:8000", fleet.SignalEvents)
	pod.hold.Store(nil)
	close(release)
	<-done
	if st := status(t, f, "10.0.0.1:8000"); st.State != fleet.StateSuspect {
		t.Errorf("after a scrape begun before the signal: state %v, want suspect", st.State)
	}
	f.ScrapeAll(context.Background())
	if st := status(t, f, "10.0.0.1:8000"); st.State != fleet.StateHealthy {
		t.Errorf("after a later scrape: state %v, want healthy", st.State)
	}
}
