package app_test

import (
	"context"
	"fmt"
	"io"
	clocktesting "k8s.io/utils/clock/testing"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/tlscert"
)

const model = "Qwen/Qwen3-0.6B"

// vllmMetrics is what vLLM 0.11 serves on /metrics (trimmed to the families kvrouter
// reads, plus one it ignores).
const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.1
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1024.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="585"} 1.0
`

// fakeVLLM serves /metrics, failing with 503 until up is set.
type fakeVLLM struct {
	*httptest.Server
	up      atomic.Bool
	waiting atomic.Int64 // vllm:num_requests_waiting it reports
}

func newFakeVLLM(t *testing.T) *fakeVLLM {
	f := &fakeVLLM{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.up.Load() || r.URL.Path != "/metrics" {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, strings.Replace(vllmMetrics, `model_name="Qwen/Qwen3-0.6B"} 0.0`,
			fmt.Sprintf(`model_name="Qwen/Qwen3-0.6B"} %d`, f.waiting.Load()), 1))
	}))
	t.Cleanup(f.Close)
	return f
}

// loopbackConfig is the default configuration with every listener on an ephemeral
// loopback port. The ext_proc port speaks plaintext, so that tests of routing dial it
// simply; TestExtProcTLS covers the default (TLS).
func loopbackConfig() config.Config {
	cfg := config.Default()
	cfg.Listen = config.ListenConfig{ExtProc: "127.0.0.1:0", Health: "127.0.0.1:0", Metrics: "127.0.0.1:0", Debug: "127.0.0.1:0",
		TLS: tlscert.Config{Mode: tlscert.ModeDisabled}}
	cfg.Limits.DrainDelay = 0 // TestDrainDelayKeepsTakingStreams sets its own
	return cfg
}

// testConfig is a valid configuration whose fleet is the fake vLLMs, each serving model,
// scraped often and taken out after three failed scrapes in a row (one slow scrape on a
// loaded machine must not take the only endpoint out).
func testConfig(t *testing.T, vllms ...*fakeVLLM) *config.Config {
	t.Helper()
	cfg := loopbackConfig()
	for _, v := range vllms {
		cfg.Endpoints = append(cfg.Endpoints, fleet.EndpointConfig{
			Address: v.Listener.Addr().String(), Models: []string{model}, MetricsURL: v.URL + "/metrics"})
	}
	cfg.Limits.Scrape.Interval = 50 * time.Millisecond
	cfg.Limits.Scrape.Timeout = 50 * time.Millisecond
	cfg.Limits.Scrape.StalenessLimit = time.Second
	cfg.Limits.Scrape.FailuresBeforeIneligible = 3
	cfg.Limits.DrainTimeout = 30 * time.Second
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

// runningApp is a runner serving on ephemeral loopback ports for one test.
type runningApp struct {
	*app.App
	addrs app.Addrs
	drain context.CancelFunc // what SIGTERM does: readiness drops, open streams may finish
	done  chan struct{}      // closed when Run has returned
	err   error              // Run's result, once done is closed
}

// startApp builds the runner from cfg and opts, listens and runs it. When the test ends
// it is drained, and Run must return nil.
func startApp(t *testing.T, cfg *config.Config, opts app.Options) *runningApp {
	t.Helper()
	a, err := app.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := a.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningApp{App: a, addrs: addrs, drain: cancel, done: make(chan struct{})}
	go func() { r.err = a.Run(ctx); close(r.done) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// stop drains the runner and returns Run's result once it has returned.
func (r *runningApp) stop() error {
	r.drain()
	<-r.done
	return r.err
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// waitHealth waits until service on cc reports want. It waits for a condition; it
// asserts nothing about time.
func waitHealth(t *testing.T, cc *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("watch %q: %v", service, err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("health %q never became %v: %v", service, want, err)
		}
		if r.GetStatus() == want {
			return
		}
	}
}

func checkHealth(t *testing.T, cc *grpc.ClientConn, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	r, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("check %q: %v", service, err)
	}
	if r.GetStatus() != want {
		t.Errorf("health %q = %v, want %v", service, r.GetStatus(), want)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeAndDrain runs the whole service on ephemeral ports against a fake vLLM: the
// health transitions, a real ext_proc stream, and a drain that lets that stream finish.
func TestServeAndDrain(t *testing.T) {
	vllm := newFakeVLLM(t)
	cfg := testConfig(t, vllm)
	a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry()})
	addrs := a.addrs

	ext := dial(t, addrs.ExtProc)
	probe := dial(t, addrs.Health)
	metricsURL := "http://" + addrs.Metrics

	t.Run("not ready while no endpoint answers", func(t *testing.T) {
		for _, s := range []string{app.ExtProcService, ""} {
			checkHealth(t, ext, s, healthpb.HealthCheckResponse_NOT_SERVING)
		}
		for _, s := range []string{app.ReadinessService, "", app.ExtProcService} {
			checkHealth(t, probe, s, healthpb.HealthCheckResponse_NOT_SERVING)
		}
		checkHealth(t, probe, app.LivenessService, healthpb.HealthCheckResponse_SERVING)
		// The Inference Extension chart's probe name follows start-up, not the fleet.
		checkHealth(t, probe, app.InferenceExtensionService, healthpb.HealthCheckResponse_SERVING)
		if code, body := httpGet(t, metricsURL+"/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d %q, want 503", code, body)
		}
		if code, _ := httpGet(t, metricsURL+"/healthz"); code != http.StatusOK {
			t.Errorf("/healthz = %d, want 200", code)
		}
		if code, body := httpGet(t, "http://"+addrs.Debug+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile") {
			t.Errorf("debug port /debug/pprof/goroutine = %d %.80q, want 200 and a goroutine profile", code, body)
		}
		// The metrics port (reachable by the scraper) serves no debug view or profile.
		for _, path := range []string{"/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline", "/debug/kv", "/debug/endpoints"} {
			if code, _ := httpGet(t, metricsURL+path); code != http.StatusNotFound {
				t.Errorf("metrics port %s = %d, want 404", path, code)
			}
		}
	})

	vllm.up.Store(true)
	t.Run("ready once the endpoint's metrics answer", func(t *testing.T) {
		waitHealth(t, ext, app.ExtProcService, healthpb.HealthCheckResponse_SERVING)
		waitHealth(t, probe, app.ReadinessService, healthpb.HealthCheckResponse_SERVING)
		checkHealth(t, ext, "", healthpb.HealthCheckResponse_SERVING)
		checkHealth(t, probe, "", healthpb.HealthCheckResponse_SERVING)
		checkHealth(t, probe, app.ExtProcService, healthpb.HealthCheckResponse_SERVING)
		checkHealth(t, probe, app.InferenceExtensionService, healthpb.HealthCheckResponse_SERVING)
		if code, body := httpGet(t, metricsURL+"/readyz"); code != http.StatusOK {
			t.Errorf("/readyz = %d %q, want 200", code, body)
		}
	})

	endpoint := cfg.Endpoints[0].Address
	client := extprocv3.NewExternalProcessorClient(ext)
	x, err := fakeenvoy.Start(context.Background(), client, fakeenvoy.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ext_proc stream routes to the endpoint", func(t *testing.T) {
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`
		res, err := x.Request(fakeenvoy.Request{
			Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
				{Key: ":authority", Value: "gw"}, {Key: "content-type", Value: "application/json"},
				{Key: "x-gateway-destination-endpoint", Value: "6.6.6.6:666"}},
			Body: [][]byte{[]byte(body[:20]), []byte(body[20:])},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Headers.Values("x-gateway-destination-endpoint"); len(got) != 1 || got[0] != endpoint {
			t.Fatalf("destination = %q, want [%s]", got, endpoint)
		}
		if string(res.Body) != body {
			t.Errorf("body changed: %q", res.Body)
		}
		h, err := x.ResponseHeaders(fakeenvoy.Headers{{Key: ":status", Value: "200"}}, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := h.Get("x-gateway-destination-endpoint-served"); v != endpoint {
			t.Errorf("served header = %q, want %s", v, endpoint)
		}
		if !strings.Contains(metricsText(t, metricsURL), `kvrouter_endpoint_in_flight_requests{endpoint="`+endpoint+`"} 1`) {
			t.Error("in-flight count is not 1 while the response streams")
		}
	})

	// SIGTERM: the stream above is still open.
	a.drain()
	t.Run("draining refuses new work", func(t *testing.T) {
		waitHealth(t, probe, app.ReadinessService, healthpb.HealthCheckResponse_NOT_SERVING)
		checkHealth(t, probe, app.LivenessService, healthpb.HealthCheckResponse_SERVING)
		checkHealth(t, probe, app.InferenceExtensionService, healthpb.HealthCheckResponse_NOT_SERVING)
		if code, body := httpGet(t, metricsURL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
			t.Errorf("/readyz = %d %q, want 503 draining", code, body)
		}
		y, err := fakeenvoy.Start(context.Background(), client, fakeenvoy.FullDuplex())
		if err == nil {
			_, err = y.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}})
		}
		if status.Code(unwrapStatus(err)) != codes.Unavailable {
			t.Errorf("new stream during drain: %v, want Unavailable", err)
		}
	})
	select {
	case <-a.done:
		t.Fatalf("Run returned (%v) while a stream was open", a.err)
	default:
	}

	t.Run("the open stream finishes", func(t *testing.T) {
		var wg sync.WaitGroup
		var got []byte
		wg.Go(func() {
			for {
				chunk, eos, err := x.ReadResponseBody()
				if err != nil {
					t.Error(err)
					return
				}
				got = append(got, chunk...)
				if eos {
					return
				}
			}
		})
		sse := "data: {\"choices\":[{\"delta\":{\"content\":\"hello\"}}]}\n\ndata: [DONE]\n\n"
		if err := x.ResponseBody([]byte(sse), true); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if string(got) != sse {
			t.Errorf("response body %q, want %q", got, sse)
		}
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
	})
	if err := a.stop(); err != nil {
		t.Fatalf("Run = %v, want nil after drain", err)
	}
	if st := a.Fleet().Status(); st[0].InFlight != 0 {
		t.Errorf("in flight after the response ended: %d", st[0].InFlight)
	}
	if _, err := net.Dial("tcp", addrs.ExtProc); err == nil {
		t.Error("ext_proc port still accepts connections after Run returned")
	}
}

// unwrapStatus finds the gRPC status inside fakeenvoy's wrapped errors.
func unwrapStatus(err error) error {
	for e := err; e != nil; {
		if _, ok := status.FromError(e); ok {
			return e
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return err
}

func metricsText(t *testing.T, base string) string {
	t.Helper()
	code, body := httpGet(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d", code)
	}
	return body
}

func TestDrainTimeoutCutsStreams(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	cfg := testConfig(t, vllm)
	cfg.Limits.DrainTimeout = 50 * time.Millisecond
	a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry()})
	ext := dial(t, a.addrs.ExtProc)
	waitHealth(t, ext, app.ExtProcService, healthpb.HealthCheckResponse_SERVING)
	x, err := fakeenvoy.Start(context.Background(), extprocv3.NewExternalProcessorClient(ext), fakeenvoy.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := x.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}}); err != nil {
		t.Fatal(err)
	}
	// The stream never ends: the drain timeout must cut it.
	if err := a.stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	x.Cancel()
	if st := a.Fleet().Status(); st[0].InFlight != 0 {
		t.Errorf("in flight after the stream was cut: %d", st[0].InFlight)
	}
}

// TestDrainDelayKeepsTakingStreams: after SIGTERM, health turns NOT_SERVING at once, but a
// stream a gateway opens before its health checks have seen it is still served for
// limits.drain_delay (a rollout behind Envoy fails no request).
func TestDrainDelayKeepsTakingStreams(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	cfg := testConfig(t, vllm)
	cfg.Limits.DrainDelay = 5 * time.Second
	clk := clocktesting.NewFakeClock(time.Now())
	a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry(), Clock: clk})
	ext := dial(t, a.addrs.ExtProc)
	waitHealth(t, ext, app.ExtProcService, healthpb.HealthCheckResponse_SERVING)
	a.drain()
	waitHealth(t, ext, app.ExtProcService, healthpb.HealthCheckResponse_NOT_SERVING)
	x, err := fakeenvoy.Start(context.Background(), extprocv3.NewExternalProcessorClient(ext), fakeenvoy.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	defer x.Cancel()
	if _, err := x.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}}); err != nil {
		t.Fatalf("a stream opened during drain_delay: %v, want it served", err)
	}
	select {
	case <-a.done:
		t.Fatal("Run returned before drain_delay had passed on its clock")
	default:
	}
	x.Cancel() // the drain would wait for it (limits.drain_timeout)
	// Once the delay has passed on the injected clock, the drain goes on and Run returns.
	for stepped := time.Duration(0); ; stepped += time.Second {
		select {
		case <-a.done:
			if stepped < cfg.Limits.DrainDelay {
				t.Fatalf("Run returned after %v of a %v drain delay", stepped, cfg.Limits.DrainDelay)
			}
			return
		case <-time.After(10 * time.Millisecond):
			clk.Step(time.Second)
		}
	}
}

func TestMetricsEndpoint(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	a := startApp(t, testConfig(t, vllm), app.Options{}) // own registry with Go/process collectors
	waitHealth(t, dial(t, a.addrs.Health), app.ReadinessService, healthpb.HealthCheckResponse_SERVING)
	text := metricsText(t, "http://"+a.addrs.Metrics)
	for _, name := range []string{"kvrouter_ready 1", "kvrouter_fleet_endpoints{state=\"healthy\"} 1", "go_goroutines", "process_cpu_seconds_total",
		"kvrouter_extproc_streams_in_flight"} {
		if !strings.Contains(text, name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
}

// TestHealthFollowsEndpoint: the endpoint's metrics stop answering, then recover; both
// health ports and /readyz follow.
func TestHealthFollowsEndpoint(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	a := startApp(t, testConfig(t, vllm), app.Options{Registry: prometheus.NewRegistry()})
	ext, probe := dial(t, a.addrs.ExtProc), dial(t, a.addrs.Health)
	steps := []struct {
		name string
		up   bool
		want healthpb.HealthCheckResponse_ServingStatus
		code int
	}{
		{"serving", true, healthpb.HealthCheckResponse_SERVING, http.StatusOK},
		{"endpoint stops answering", false, healthpb.HealthCheckResponse_NOT_SERVING, http.StatusServiceUnavailable},
		{"endpoint recovers", true, healthpb.HealthCheckResponse_SERVING, http.StatusOK},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			vllm.up.Store(s.up)
			waitHealth(t, ext, app.ExtProcService, s.want)
			waitHealth(t, probe, app.ReadinessService, s.want)
			checkHealth(t, probe, app.LivenessService, healthpb.HealthCheckResponse_SERVING)
			if code, body := httpGet(t, "http://"+a.addrs.Metrics+"/readyz"); code != s.code {
				t.Errorf("/readyz = %d %q, want %d", code, body, s.code)
			}
		})
	}
}

// TestBufferedLargeBody: in BUFFERED mode a body above gRPC's default 4 MiB message limit
// (but within limits.max_body_bytes) still reaches kvrouter and is routed.
func TestBufferedLargeBody(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	a := startApp(t, testConfig(t, vllm), app.Options{Registry: prometheus.NewRegistry()})
	ext := dial(t, a.addrs.ExtProc)
	waitHealth(t, ext, app.ExtProcService, healthpb.HealthCheckResponse_SERVING)

	cfg := fakeenvoy.Config{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, SendProtocolConfig: true}
	x, err := fakeenvoy.Start(context.Background(), extprocv3.NewExternalProcessorClient(ext), cfg)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"` + model + `","prompt":"` + strings.Repeat("a", 6<<20) + `"}`
	res, err := x.Request(fakeenvoy.Request{
		Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"}, {Key: "content-type", Value: "application/json"}},
		Body:    [][]byte{[]byte(body)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Headers.Values("x-gateway-destination-endpoint"); len(got) != 1 || got[0] != vllm.Listener.Addr().String() {
		t.Errorf("destination = %q (immediate %v)", got, res.Immediate)
	}
	x.Cancel()
}

// TestStopRightAfterStart: a SIGTERM as the process starts (Run's context ends before
// its servers began serving) is a clean shutdown, not an error: the drain may stop a
// gRPC server before its Serve runs, which then reports it was stopped.
func TestStopRightAfterStart(t *testing.T) {
	cfg := testConfig(t, newFakeVLLM(t))
	cfg.Limits.DrainTimeout = time.Second
	for range 20 {
		a, err := app.New(cfg, app.Options{Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Listen(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := a.Run(ctx); err != nil {
			t.Fatalf("Run with its context already ended: %v", err)
		}
	}
}
