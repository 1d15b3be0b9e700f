package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/scoring"
)

const qwen = "Qwen/Qwen3-0.6B"

func scrapeCfg() fleet.ScrapeConfig {
	c := fleet.DefaultScrapeConfig()
	c.Timeout = 500 * time.Millisecond
	return c
}

func newFleet(t *testing.T, clk *clock, reg prometheus.Registerer, eps ...fleet.EndpointConfig) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(fleet.Config{Endpoints: eps, Scrape: scrapeCfg()}, fleet.Options{Now: clk.Now, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func addrs(eps []scoring.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Address)
	}
	return out
}

func TestCandidatesResolvesModels(t *testing.T) {
	clk := newClock()
	f := newFleet(t, clk, nil,
		fleet.EndpointConfig{Address: "10.0.0.3:8000", Models: []string{qwen}},
		fleet.EndpointConfig{Address: "10.0.0.1:8000", Models: []string{qwen},
			LoRAAdapters: []fleet.LoRAAdapter{{Name: "sql-lora", BaseModel: qwen}}},
		fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{"llama"}},
	)
	tests := []struct {
		name       string
		model      string
		want       []string
		base, lora string
		ok         bool
	}{
		{"base model, ordered by address", qwen, []string{"10.0.0.1:8000", "10.0.0.3:8000"}, qwen, "", true},
		{"other model", "llama", []string{"10.0.0.2:8000"}, "llama", "", true},
		{"adapter resolves to its base", "sql-lora", []string{"10.0.0.1:8000"}, qwen, "sql-lora", true},
		{"unknown model: every endpoint, not ok", "gpt-9", []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, "", "", false},
		{"any model", "", []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, "", "", true},
	}
	// AppendCandidates must give the same answer into a reused buffer, whatever it held.
	buf := make([]scoring.Endpoint, 1, 2)
	buf[0].Address = "stale"
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps, base, lora, ok := f.Candidates(tc.model)
			if !slices.Equal(addrs(eps), tc.want) || base != tc.base || lora != tc.lora || ok != tc.ok {
				t.Errorf("Candidates(%q) = %v, %q, %q, %v; want %v, %q, %q, %v",
					tc.model, addrs(eps), base, lora, ok, tc.want, tc.base, tc.lora, tc.ok)
			}
			eps, base, lora, ok = f.AppendCandidates(buf, tc.model)
			if !slices.Equal(addrs(eps), tc.want) || base != tc.base || lora != tc.lora || ok != tc.ok {
				t.Errorf("AppendCandidates(%q) = %v, %q, %q, %v; want %v, %q, %q, %v",
					tc.model, addrs(eps), base, lora, ok, tc.want, tc.base, tc.lora, tc.ok)
			}
			buf = eps
		})
	}
}

func TestScrapeLifecycle(t *testing.T) {
	clk := newClock()
	vllm := newFakeVLLM(t, load{Running: 3, Waiting: 1, Usage: 0.42, Blocks: 585})
	static := fleet.EndpointConfig{Address: "10.0.0.9:8000", Models: []string{qwen}}
	scraped := fleet.EndpointConfig{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: vllm.metricsURL()}
	f := newFleet(t, clk, nil, scraped)
	ctx := context.Background()

	var changes []string
	var mu sync.Mutex
	f.Subscribe(func(c fleet.Change) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, fmt.Sprintf("%s %s %s", c.Kind, c.Address, c.State))
	})
	eligible := func() []string {
		eps, _, _, _ := f.Candidates(qwen)
		return addrs(eps)
	}

	steps := []struct {
		name      string
		do        func()
		eligible  []string
		ready     bool
		valid     bool
		wantState fleet.State
	}{
		{"pending before the first scrape", func() {}, nil, false, false, fleet.StatePending},
		{"healthy after a good scrape", func() { f.ScrapeAll(ctx) }, []string{scraped.Address}, true, true, fleet.StateHealthy},
		{"stale metrics are not valid", func() { clk.Advance(6 * time.Second) }, []string{scraped.Address}, true, false, fleet.StateHealthy},
		{"fresh again", func() { clk.Advance(time.Second); f.ScrapeAll(ctx) }, []string{scraped.Address}, true, true, fleet.StateHealthy},
		{"one failure keeps it eligible", func() { vllm.fail(http.StatusInternalServerError); f.ScrapeAll(ctx) }, []string{scraped.Address}, true, true, fleet.StateHealthy},
		{"two failures keep it eligible", func() { f.ScrapeAll(ctx) }, []string{scraped.Address}, true, true, fleet.StateHealthy},
		{"the third failure makes it ineligible", func() { f.ScrapeAll(ctx) }, nil, false, true, fleet.StateUnhealthy},
		{"a static endpoint is eligible without scrapes", func() {
			if err := f.Upsert(static); err != nil {
				t.Fatal(err)
			}
		}, []string{static.Address}, true, true, fleet.StateUnhealthy},
		{"recovers after one good scrape", func() { vllm.fail(0); f.ScrapeAll(ctx) }, []string{static.Address, scraped.Address}, true, true, fleet.StateHealthy},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.do()
			if got := eligible(); !slices.Equal(got, s.eligible) {
				t.Errorf("eligible = %v, want %v", got, s.eligible)
			}
			if f.Ready() != s.ready {
				t.Errorf("Ready() = %v, want %v", f.Ready(), s.ready)
			}
			st := status(t, f, scraped.Address)
			if st.State != s.wantState {
				t.Errorf("state = %v, want %v", st.State, s.wantState)
			}
			if st.Metrics.Valid != s.valid {
				t.Errorf("metrics valid = %v, want %v (%+v)", st.Metrics.Valid, s.valid, st.Metrics)
			}
		})
	}
	st := status(t, f, scraped.Address)
	want := scoring.Metrics{Valid: true, Running: 3, Waiting: 1, KVCacheUsage: 0.42, NumGPUBlocks: 585, BlockSize: 16, At: st.ScrapedAt}
	if st.ScrapedAt.IsZero() {
		t.Error("ScrapedAt is zero after a good scrape")
	}
	if st.Metrics != want {
		t.Errorf("metrics = %+v, want %+v", st.Metrics, want)
	}
	wantChanges := []string{
		"state_changed 127.0.0.1:8000 healthy",
		"state_changed 127.0.0.1:8000 unhealthy",
		"added 10.0.0.9:8000 unscraped",
		"state_changed 127.0.0.1:8000 healthy",
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(changes, wantChanges) {
		t.Errorf("changes:\n%s\nwant:\n%s", strings.Join(changes, "\n"), strings.Join(wantChanges, "\n"))
	}
}

func status(t *testing.T, f *fleet.Fleet, addr string) fleet.EndpointStatus {
	t.Helper()
	for _, s := range f.Status() {
		if s.Config.Address == addr {
			return s
		}
	}
	t.Fatalf("no endpoint %s", addr)
	return fleet.EndpointStatus{}
}

func TestScrapeFailures(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(v *fakeVLLM) string // returns the metrics URL
		reason string
	}{
		{"HTTP error", func(v *fakeVLLM) string { v.fail(http.StatusServiceUnavailable); return v.metricsURL() }, "status"},
		{"wrong path", func(v *fakeVLLM) string { return v.URL + "/nope" }, "status"},
		{"not prometheus text", func(v *fakeVLLM) string { v.serveBody([]byte("<html>hi</html>\n")); return v.metricsURL() }, "parse_syntax"},
		{"no vllm gauges", func(v *fakeVLLM) string { v.serveBody([]byte("up 1\n")); return v.metricsURL() }, "parse_missing"},
		{"too large", func(v *fakeVLLM) string {
			v.serveBody([]byte(strings.Repeat("# padding comment line\n", 600)))
			return v.metricsURL()
		}, "too_large"},
		{"connection refused", func(v *fakeVLLM) string { v.Close(); return v.metricsURL() }, "connect"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vllm := newFakeVLLM(t, load{})
			url := tc.setup(vllm)
			reg := prometheus.NewPedanticRegistry()
			cfg := scrapeCfg()
			cfg.MaxBytes = 10 << 10
			f, err := fleet.New(fleet.Config{
				Endpoints: []fleet.EndpointConfig{{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: url}},
				Scrape:    cfg,
			}, fleet.Options{Now: newClock().Now, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			f.ScrapeAll(context.Background())
			want := fmt.Sprintf(`
# HELP kvrouter_fleet_scrape_errors_total Failed scrapes of endpoints' vLLM /metrics, by endpoint and reason.
# TYPE kvrouter_fleet_scrape_errors_total counter
kvrouter_fleet_scrape_errors_total{endpoint="127.0.0.1:8000",reason=%q} 1
`, tc.reason)
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_fleet_scrape_errors_total"); err != nil {
				t.Error(err)
			}
			if st := status(t, f, "127.0.0.1:8000"); st.State != fleet.StatePending || st.Failures != 1 {
				t.Errorf("state %v failures %d, want pending after 1 failure", st.State, st.Failures)
			}
		})
	}
}

func TestScrapeTimeout(t *testing.T) {
	release := make(chan struct{})
	hang := newFakeVLLM(t, load{})
	hang.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	cfg := scrapeCfg()
	cfg.Timeout = 20 * time.Millisecond
	reg := prometheus.NewPedanticRegistry()
	f, err := fleet.New(fleet.Config{
		Endpoints: []fleet.EndpointConfig{{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: hang.metricsURL()}},
		Scrape:    cfg,
	}, fleet.Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	f.ScrapeAll(context.Background())
	if n := testutil.ToFloat64(counter(t, reg, "timeout")); n != 1 {
		t.Errorf("timeout errors = %v, want 1", n)
	}
}

// counter gathers kvrouter_fleet_scrape_errors_total for one reason.
func counter(t *testing.T, reg *prometheus.Registry, reason string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	for _, mf := range mfs {
		if mf.GetName() != "kvrouter_fleet_scrape_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					c.Add(m.GetCounter().GetValue())
				}
			}
		}
	}
	return c
}

func TestInFlight(t *testing.T) {
	f := newFleet(t, newClock(), nil,
		fleet.EndpointConfig{Address: "10.0.0.1:8000", Models: []string{qwen}},
		fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{qwen}})
	inFlight := func() map[string]int {
		out := map[string]int{}
		eps, _, _, _ := f.Candidates(qwen)
		for _, e := range eps {
			out[e.Address] = e.InFlight
		}
		return out
	}
	steps := []struct {
		name string
		do   func()
		want map[string]int
	}{
		{"begin twice", func() { f.Begin("10.0.0.1:8000"); f.Begin("10.0.0.1:8000") }, map[string]int{"10.0.0.1:8000": 2, "10.0.0.2:8000": 0}},
		{"end once", func() { f.End("10.0.0.1:8000") }, map[string]int{"10.0.0.1:8000": 1, "10.0.0.2:8000": 0}},
		{"never negative", func() { f.End("10.0.0.2:8000"); f.End("10.0.0.2:8000") }, map[string]int{"10.0.0.1:8000": 1, "10.0.0.2:8000": 0}},
		{"unknown addresses ignored", func() { f.Begin("1.2.3.4:5"); f.End("1.2.3.4:5") }, map[string]int{"10.0.0.1:8000": 1, "10.0.0.2:8000": 0}},
		{"upsert keeps the count", func() {
			if err := f.Upsert(fleet.EndpointConfig{Address: "10.0.0.1:8000", Models: []string{qwen, "llama"}}); err != nil {
				t.Fatal(err)
			}
		}, map[string]int{"10.0.0.1:8000": 1, "10.0.0.2:8000": 0}},
		{"end after remove is ignored", func() { f.Remove("10.0.0.2:8000"); f.End("10.0.0.2:8000") }, map[string]int{"10.0.0.1:8000": 1}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.do()
			if got := inFlight(); fmt.Sprint(got) != fmt.Sprint(s.want) {
				t.Errorf("in flight = %v, want %v", got, s.want)
			}
		})
	}
}

func TestUpsertRemove(t *testing.T) {
	f := newFleet(t, newClock(), nil, fleet.EndpointConfig{Address: "10.0.0.1:8000", Models: []string{qwen},
		LoRAAdapters: []fleet.LoRAAdapter{{Name: "sql", BaseModel: qwen}}})
	var got []string
	unsub := f.Subscribe(func(c fleet.Change) { got = append(got, c.Kind.String()+" "+c.Address) })

	tests := []struct {
		name    string
		do      func() error
		wantErr error
		models  map[string][]string // model -> eligible addresses after the step
	}{
		{"add", func() error {
			return f.Upsert(fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{"llama"}})
		}, nil, map[string][]string{"llama": {"10.0.0.2:8000"}, qwen: {"10.0.0.1:8000"}}},
		{"identical upsert is no change", func() error {
			return f.Upsert(fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{"llama"}})
		}, nil, map[string][]string{"llama": {"10.0.0.2:8000"}}},
		{"update models", func() error {
			return f.Upsert(fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{"llama", qwen}})
		}, nil, map[string][]string{"llama": {"10.0.0.2:8000"}, qwen: {"10.0.0.1:8000", "10.0.0.2:8000"}}},
		{"adapter with another base conflicts", func() error {
			return f.Upsert(fleet.EndpointConfig{Address: "10.0.0.3:8000", Models: []string{"llama"},
				LoRAAdapters: []fleet.LoRAAdapter{{Name: "sql", BaseModel: "llama"}}})
		}, fleet.ErrConflict, map[string][]string{"sql": {"10.0.0.1:8000"}}},
		{"adapter named like a model conflicts", func() error {
			return f.Upsert(fleet.EndpointConfig{Address: "10.0.0.3:8000", Models: []string{"x"},
				LoRAAdapters: []fleet.LoRAAdapter{{Name: "llama", BaseModel: "x"}}})
		}, fleet.ErrConflict, map[string][]string{"x": nil}},
		{"invalid endpoint", func() error {
			return f.Upsert(fleet.EndpointConfig{Address: "pod-3:8000", Models: []string{"x"}})
		}, errAny, nil},
		{"remove", func() error {
			if !f.Remove("10.0.0.1:8000") {
				return errors.New("Remove returned false")
			}
			return nil
		}, nil, map[string][]string{qwen: {"10.0.0.2:8000"}, "sql": nil}},
		{"remove unknown", func() error {
			if f.Remove("10.0.0.1:8000") {
				return errors.New("Remove returned true")
			}
			return nil
		}, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			switch {
			case tc.wantErr == errAny && err == nil:
				t.Fatal("no error")
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			case tc.wantErr == nil && err != nil:
				t.Fatal(err)
			}
			for model, want := range tc.models {
				eps, _, _, ok := f.Candidates(model)
				if !ok {
					eps = nil // unknown models fall back to every endpoint; compare the known ones
				}
				if !slices.Equal(addrs(eps), want) {
					t.Errorf("Candidates(%q) = %v, want %v", model, addrs(eps), want)
				}
			}
		})
	}
	unsub()
	_ = f.Upsert(fleet.EndpointConfig{Address: "10.0.0.4:8000", Models: []string{"z"}})
	want := []string{"added 10.0.0.2:8000", "updated 10.0.0.2:8000", "removed 10.0.0.1:8000"}
	if !slices.Equal(got, want) {
		t.Errorf("notifications %v, want %v", got, want)
	}
}

var errAny = errors.New("any error")

func TestMetricsGolden(t *testing.T) {
	clk := newClock()
	vllm := newFakeVLLM(t, load{Running: 4, Waiting: 2, Usage: 0.25, Blocks: 585})
	reg := prometheus.NewPedanticRegistry()
	f := newFleet(t, clk, reg,
		fleet.EndpointConfig{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: vllm.metricsURL()},
		fleet.EndpointConfig{Address: "127.0.0.1:8001", Models: []string{qwen}, MetricsURL: "http://127.0.0.1:1/metrics"},
		fleet.EndpointConfig{Address: "127.0.0.1:8002", Models: []string{qwen}},
	)
	f.ScrapeAll(context.Background())
	f.Begin("127.0.0.1:8000")
	f.Begin("127.0.0.1:8002")
	clk.Advance(1500 * time.Millisecond)
	want := `
# HELP kvrouter_endpoint_eligible 1 when the endpoint may receive requests, else 0.
# TYPE kvrouter_endpoint_eligible gauge
kvrouter_endpoint_eligible{endpoint="127.0.0.1:8000"} 1
kvrouter_endpoint_eligible{endpoint="127.0.0.1:8001"} 0
kvrouter_endpoint_eligible{endpoint="127.0.0.1:8002"} 1
# HELP kvrouter_endpoint_in_flight_requests Requests the router sent to the endpoint that have not finished.
# TYPE kvrouter_endpoint_in_flight_requests gauge
kvrouter_endpoint_in_flight_requests{endpoint="127.0.0.1:8000"} 1
kvrouter_endpoint_in_flight_requests{endpoint="127.0.0.1:8001"} 0
kvrouter_endpoint_in_flight_requests{endpoint="127.0.0.1:8002"} 1
# HELP kvrouter_endpoint_kv_cache_usage_ratio The endpoint's vllm:kv_cache_usage_perc (0..1) at the last good scrape.
# TYPE kvrouter_endpoint_kv_cache_usage_ratio gauge
kvrouter_endpoint_kv_cache_usage_ratio{endpoint="127.0.0.1:8000"} 0.25
# HELP kvrouter_endpoint_metrics_age_seconds Age of the endpoint's last good scrape.
# TYPE kvrouter_endpoint_metrics_age_seconds gauge
kvrouter_endpoint_metrics_age_seconds{endpoint="127.0.0.1:8000"} 1.5
# HELP kvrouter_endpoint_running_requests The endpoint's vllm:num_requests_running at the last good scrape.
# TYPE kvrouter_endpoint_running_requests gauge
kvrouter_endpoint_running_requests{endpoint="127.0.0.1:8000"} 4
# HELP kvrouter_endpoint_waiting_requests The endpoint's vllm:num_requests_waiting at the last good scrape.
# TYPE kvrouter_endpoint_waiting_requests gauge
kvrouter_endpoint_waiting_requests{endpoint="127.0.0.1:8000"} 2
# HELP kvrouter_fleet_endpoints Endpoints by state (pending, healthy, unhealthy, unscraped, suspect).
# TYPE kvrouter_fleet_endpoints gauge
kvrouter_fleet_endpoints{state="healthy"} 1
kvrouter_fleet_endpoints{state="pending"} 1
kvrouter_fleet_endpoints{state="suspect"} 0
kvrouter_fleet_endpoints{state="unhealthy"} 0
kvrouter_fleet_endpoints{state="unscraped"} 1
# HELP kvrouter_fleet_changes_total Endpoints added, updated and removed.
# TYPE kvrouter_fleet_changes_total counter
kvrouter_fleet_changes_total{kind="removed"} 1
`
	f.Remove("127.0.0.1:8003") // unknown: no change counted
	if err := f.Upsert(fleet.EndpointConfig{Address: "127.0.0.1:8004", Models: []string{qwen}}); err != nil {
		t.Fatal(err)
	}
	f.Remove("127.0.0.1:8004")
	err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"kvrouter_endpoint_eligible", "kvrouter_endpoint_in_flight_requests", "kvrouter_endpoint_kv_cache_usage_ratio",
		"kvrouter_endpoint_metrics_age_seconds", "kvrouter_endpoint_running_requests", "kvrouter_endpoint_waiting_requests",
		"kvrouter_fleet_endpoints")
	if err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "kvrouter_fleet_scrape_duration_seconds"); n != 1 {
		t.Errorf("scrape duration series = %d, want 1", n)
	}
}

func TestRun(t *testing.T) {
	vllm := newFakeVLLM(t, load{Running: 1})
	f := newFleet(t, newClock(), nil, fleet.EndpointConfig{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: vllm.metricsURL()})
	ready := make(chan struct{}, 1)
	f.Subscribe(func(c fleet.Change) {
		if c.Kind == fleet.StateChanged && c.State == fleet.StateHealthy {
			select {
			case ready <- struct{}{}:
			default:
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	<-ready // Run scrapes at once
	if !f.Ready() {
		t.Error("not ready after the first scrape")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

// TestConcurrentUse exercises the request path against registry changes and scrapes
// under the race detector.
func TestConcurrentUse(t *testing.T) {
	vllm := newFakeVLLM(t, load{Running: 1})
	var eps []fleet.EndpointConfig
	for i := range 8 {
		eps = append(eps, fleet.EndpointConfig{Address: fmt.Sprintf("127.0.0.%d:8000", i+1), Models: []string{qwen}, MetricsURL: vllm.metricsURL()})
	}
	f := newFleet(t, newClock(), prometheus.NewRegistry(), eps...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 500 {
				cands, _, _, _ := f.Candidates(qwen)
				if len(cands) > 0 {
					a := cands[(i+w)%len(cands)].Address
					f.Begin(a)
					f.End(a)
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			a := fmt.Sprintf("127.0.1.%d:8000", i%5+1)
			_ = f.Upsert(fleet.EndpointConfig{Address: a, Models: []string{qwen}})
			f.Remove(a)
		}
	})
	wg.Go(func() {
		for range 5 {
			f.ScrapeAll(ctx)
		}
	})
	wg.Wait()
	for _, s := range f.Status() {
		if s.InFlight != 0 {
			t.Errorf("%s: in flight %d after balanced Begin/End", s.Config.Address, s.InFlight)
		}
	}
}

// benchFleet is a fleet of n endpoints serving qwen, never scraped.
func benchFleet(b *testing.B, n int) *fleet.Fleet {
	b.Helper()
	var eps []fleet.EndpointConfig
	for i := range n {
		eps = append(eps, fleet.EndpointConfig{Address: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250+1), Models: []string{qwen}})
	}
	f, err := fleet.New(fleet.Config{Endpoints: eps, Scrape: fleet.DefaultScrapeConfig()}, fleet.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return f
}

func BenchmarkCandidates(b *testing.B) {
	for _, n := range []int{6, 64, 512} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			f := benchFleet(b, n)
			b.ReportAllocs()
			for b.Loop() {
				c, _, _, _ := f.Candidates(qwen)
				f.Begin(c[0].Address)
				f.End(c[0].Address)
			}
		})
		b.Run(fmt.Sprintf("%d/append", n), func(b *testing.B) {
			f := benchFleet(b, n)
			b.ReportAllocs()
			var c []scoring.Endpoint
			for b.Loop() {
				c, _, _, _ = f.AppendCandidates(c, qwen)
				f.Begin(c[0].Address)
				f.End(c[0].Address)
			}
		})
	}
}

// TestRunFollowsRegistry: Run scrapes endpoints added after it started and stops
// scraping removed ones.
func TestRunFollowsRegistry(t *testing.T) {
	first := newFakeVLLM(t, load{Running: 1})
	second := newFakeVLLM(t, load{Running: 2})
	cfg := scrapeCfg()
	cfg.Interval, cfg.Timeout = 10*time.Millisecond, 10*time.Millisecond
	f, err := fleet.New(fleet.Config{Scrape: cfg, Endpoints: []fleet.EndpointConfig{
		{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: first.metricsURL()}}}, fleet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	healthy := make(chan string, 16)
	f.Subscribe(func(c fleet.Change) {
		if c.Kind == fleet.StateChanged && c.State == fleet.StateHealthy {
			healthy <- c.Address
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	if got := <-healthy; got != "127.0.0.1:8000" {
		t.Fatalf("first healthy endpoint %s", got)
	}
	// Remove the first endpoint and add the second in one step: once the second is
	// scraped, Run has seen the removal too.
	f.Remove("127.0.0.1:8000")
	if err := f.Upsert(fleet.EndpointConfig{Address: "127.0.0.1:8001", Models: []string{qwen}, MetricsURL: second.metricsURL()}); err != nil {
		t.Fatal(err)
	}
	if got := <-healthy; got != "127.0.0.1:8001" {
		t.Fatalf("second healthy endpoint %s", got)
	}
	if st := status(t, f, "127.0.0.1:8001"); st.Metrics.Running != 2 {
		t.Errorf("second endpoint metrics %+v", st.Metrics)
	}
	hitsOf := func(v *fakeVLLM) int {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.hits
	}
	// Let the second endpoint be scraped five more times; the removed one may finish at
	// most the one scrape that was in flight when it was removed.
	before, base := hitsOf(first), hitsOf(second)
	for hitsOf(second) < base+5 {
		time.Sleep(time.Millisecond)
	}
	if after := hitsOf(first); after > before+1 {
		t.Errorf("removed endpoint scraped %d more times", after-before)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
}

// TestScrapeAsksUncompressed: scrapes ask for the page uncompressed (a gzip reader per
// scrape cost more CPU than the page's parse), and still read a server that compresses
// anyway.
func TestScrapeAsksUncompressed(t *testing.T) {
	vllm := newFakeVLLM(t, load{Running: 3, Waiting: 1, Usage: 0.42, Blocks: 585})
	f := newFleet(t, newClock(), nil, fleet.EndpointConfig{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: vllm.metricsURL()})
	f.ScrapeAll(context.Background())
	vllm.mu.Lock()
	accept := slices.Clone(vllm.accept)
	vllm.mu.Unlock()
	if len(accept) != 1 || accept[0] != "identity" {
		t.Fatalf("Accept-Encoding of the scrapes: %q, want [identity]", accept)
	}
	eps, _, _, _ := f.Candidates(qwen)
	if len(eps) != 1 || eps[0].Metrics.Running != 3 || !eps[0].Metrics.Valid {
		t.Fatalf("candidates after the scrape: %+v", eps)
	}
}

// BenchmarkScrape is one scrape of a vLLM /metrics page over loopback HTTP (the fake
// compresses when asked, as vLLM does): request, read, parse.
func BenchmarkScrape(b *testing.B) {
	text, err := os.ReadFile("testdata/vllm-metrics.txt")
	if err != nil {
		b.Fatal(err)
	}
	vllm := &fakeVLLM{tmpl: template.Must(template.New("m").Parse(string(text))), load: load{Running: 3, Waiting: 1, Usage: 0.42, Blocks: 585}}
	vllm.Server = httptest.NewServer(http.HandlerFunc(vllm.serve))
	defer vllm.Close()
	f, err := fleet.New(fleet.Config{Scrape: fleet.DefaultScrapeConfig(), Endpoints: []fleet.EndpointConfig{
		{Address: "127.0.0.1:8000", Models: []string{qwen}, MetricsURL: vllm.metricsURL()}}}, fleet.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		f.ScrapeAll(ctx)
		vllm.mu.Lock()
		vllm.accept = vllm.accept[:0]
		vllm.mu.Unlock()
	}
}
