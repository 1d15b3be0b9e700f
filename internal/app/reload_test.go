package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/rewrite"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// reloadYAML is a configuration file over the fake vLLMs at addrs.
func reloadYAML(metrics, policy string, maxHold time.Duration, vllms ...*fakeVLLM) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen:\n  extproc: 127.0.0.1:0\n  health: 127.0.0.1:0\n  debug: 127.0.0.1:0\n  metrics: %s\n", metrics)
	b.WriteString("endpoints:\n")
	for _, v := range vllms {
		fmt.Fprintf(&b, "  - address: %s\n    models: [%s]\n    metrics_url: %s/metrics\n", v.Listener.Addr(), model, v.URL)
	}
	fmt.Fprintf(&b, "policy:\n  name: %s\n", policy)
	fmt.Fprintf(&b, "limits:\n  max_hold: %s\n  drain_delay: 0s\n", maxHold) // the tests stop at once
	return b.String()
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	// Write beside and rename, as a ConfigMap update or an editor does.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// plaintext is a reloadYAML configuration with a plaintext ext_proc listener, so that a
// test dials it simply.
func plaintext(yaml string) string {
	return strings.Replace(yaml, "listen:\n", "listen:\n  tls: {mode: disabled}\n", 1)
}

// startReloadable writes yaml to path, loads it and starts kvrouter on it with reloads
// made only by the test (ConfigCheckInterval -1), metrics in the returned registry.
func startReloadable(t *testing.T, path, yaml string) (*runningApp, *prometheus.Registry) {
	t.Helper()
	writeFile(t, path, yaml)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	return startApp(t, cfg, app.Options{Registry: reg, ConfigPath: path, ConfigCheckInterval: -1}), reg
}

func endpointAddrs(t *testing.T, base string) []string {
	t.Helper()
	_, body := httpGet(t, base+"/debug/endpoints")
	var eps []struct {
		Address string `json:"address"`
	}
	if err := json.Unmarshal([]byte(body), &eps); err != nil {
		t.Fatalf("/debug/endpoints: %v: %s", err, body)
	}
	var out []string
	for _, e := range eps {
		out = append(out, e.Address)
	}
	slices.Sort(out)
	return out
}

func reloads(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvrouter_config_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestReload(t *testing.T) {
	v1, v2 := newFakeVLLM(t), newFakeVLLM(t)
	v1.up.Store(true)
	v2.up.Store(true)
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	r, reg := startReloadable(t, path, reloadYAML("127.0.0.1:0", "round-robin", 50*time.Millisecond, v1, v2))
	base := "http://" + r.addrs.Debug
	if got := endpointAddrs(t, base); len(got) != 2 {
		t.Fatalf("endpoints %v, want 2", got)
	}

	type step struct {
		name        string
		yaml        string
		wantResult  string
		wantApplied []string
		wantRestart []string
		wantEps     []string
		wantPolicy  string
	}
	v1Only := []string{v1.Listener.Addr().String()}
	steps := []step{
		{name: "same file", yaml: reloadYAML("127.0.0.1:0", "round-robin", 50*time.Millisecond, v1, v2),
			wantResult: app.ReloadUnchanged, wantEps: endpointAddrs(t, base), wantPolicy: "round-robin"},
		{name: "endpoint removed, policy, max_hold and a listen address changed",
			yaml:       reloadYAML("127.0.0.1:1", "least-load", 80*time.Millisecond, v1),
			wantResult: app.ReloadApplied, wantApplied: []string{"endpoints", "policy.name", "limits.max_hold"},
			wantRestart: []string{"listen.metrics"}, wantEps: v1Only, wantPolicy: "least-load"},
		{name: "invalid: the configuration in force stays",
			yaml:       reloadYAML("127.0.0.1:0", "no-such-policy", 50*time.Millisecond, v1, v2),
			wantResult: app.ReloadInvalid, wantEps: v1Only, wantPolicy: "least-load"},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			writeFile(t, path, s.yaml)
			before := reloads(t, reg, s.wantResult)
			rep, err := r.Reload()
			if rep.Result != s.wantResult {
				t.Fatalf("result %q (err %v), want %q", rep.Result, err, s.wantResult)
			}
			if s.wantResult == app.ReloadInvalid {
				// The error is what check-config prints for the same file.
				var stdout, stderr bytes.Buffer
				if code := app.Main([]string{"check-config", path}, &stdout, &stderr); code != 1 {
					t.Fatalf("check-config exit %d", code)
				}
				if err == nil || err.Error()+"\n" != stderr.String() {
					t.Fatalf("reload error %q, check-config printed %q", err, stderr.String())
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rep.Applied, s.wantApplied) || !slices.Equal(rep.Restart, s.wantRestart) {
				t.Fatalf("applied %v restart %v, want %v and %v", rep.Applied, rep.Restart, s.wantApplied, s.wantRestart)
			}
			if got := reloads(t, reg, s.wantResult); got != before+1 {
				t.Fatalf("reloads{result=%s} %v, want %v", s.wantResult, got, before+1)
			}
			if got := endpointAddrs(t, base); !slices.Equal(got, s.wantEps) {
				t.Fatalf("endpoints %v, want %v", got, s.wantEps)
			}
			if got := usedPolicy(t, base); got != s.wantPolicy {
				t.Fatalf("/debug/route uses %s, want %s", got, s.wantPolicy)
			}
		})
	}
	// The last valid file asked for one restart-only change; the invalid one changed nothing.
	if got := testmetrics.Must(t, reg, "kvrouter_config_restart_required"); got != 1 {
		t.Fatalf("kvrouter_config_restart_required %v, want 1", got)
	}
}

func usedPolicy(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Post(base+"/debug/route", "application/json", strings.NewReader(`{"model":"`+model+`","prompt":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var x app.RouteExplanation
	if err := json.NewDecoder(resp.Body).Decode(&x); err != nil {
		t.Fatal(err)
	}
	return x.Used
}

// A change of the file is picked up on the next check of the injected clock.
func TestReloadOnFileChange(t *testing.T) {
	v1, v2 := newFakeVLLM(t), newFakeVLLM(t)
	v1.up.Store(true)
	v2.up.Store(true)
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	writeFile(t, path, reloadYAML("127.0.0.1:0", "round-robin", 50*time.Millisecond, v1))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	clk := clocktesting.NewFakeClock(time.Now())
	r := startApp(t, cfg, app.Options{Registry: reg, ConfigPath: path, ConfigCheckInterval: time.Second, Clock: clk})
	base := "http://" + r.addrs.Debug

	writeFile(t, path, reloadYAML("127.0.0.1:0", "round-robin", 50*time.Millisecond, v1, v2))
	testwait.For(t, "the file change to be applied", func() bool {
		clk.Step(time.Second)
		return reloads(t, reg, app.ReloadApplied) == 1
	})
	if got := endpointAddrs(t, base); len(got) != 2 {
		t.Fatalf("endpoints %v, want 2", got)
	}
	// No change: further checks reload nothing.
	for range 3 {
		clk.Step(time.Second)
	}
	if got := reloads(t, reg, app.ReloadApplied) + reloads(t, reg, app.ReloadUnchanged); got != 1 {
		t.Fatalf("%v reloads, want 1", got)
	}
}

// SIGHUP reloads the configuration instead of ending the process (its default action,
// exit 129 without a drain); SIGTERM then drains and exits 0.
func TestSIGHUPReloads(t *testing.T) {
	v1 := newFakeVLLM(t)
	v1.up.Store(true)
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	writeFile(t, path, reloadYAML("127.0.0.1:0", "round-robin", 50*time.Millisecond, v1))
	logs := &syncBuffer{}
	code := make(chan int, 1)
	go func() { code <- app.Main([]string{"--config", path, "--config-check-interval", "0"}, logs, logs) }()
	testwait.For(t, "kvrouter to serve", func() bool { return strings.Contains(logs.String(), "kvrouter serving") })

	writeFile(t, path, reloadYAML("127.0.0.1:0", "least-load", 50*time.Millisecond, v1))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the reload", func() bool { return strings.Contains(logs.String(), `"configuration reloaded"`) })
	if !strings.Contains(logs.String(), `"applied":["policy.name"]`) {
		t.Fatalf("reload log does not name policy.name: %s", logs.String())
	}

	writeFile(t, path, "policy: {name: nope}\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "the rejected reload", func() bool {
		return strings.Contains(logs.String(), "configuration reload rejected: the configuration in force stays")
	})

	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit %d after SIGTERM, want 0: %s", c, logs.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("Main did not return after SIGTERM")
	}
	if !strings.Contains(logs.String(), `"drained"`) {
		t.Fatalf("no drain logged: %s", logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's and the test's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The objectives map reloads: an objective made sheddable (priority < 0) is shed while
// every endpoint's queue is over limits.shed_queue_depth (its default, 5), one of
// priority 0 and requests without an objective are routed all the same.
func TestReloadObjectives(t *testing.T) {
	v1, v2 := newFakeVLLM(t), newFakeVLLM(t)
	for _, v := range []*fakeVLLM{v1, v2} {
		v.waiting.Store(9)
		v.up.Store(true)
	}
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	yaml := func(batch int) string {
		return plaintext(reloadYAML("127.0.0.1:0", "least-load", 50*time.Millisecond, v1, v2)) +
			"  metrics_scrape_interval: 50ms\n  metrics_scrape_timeout: 50ms\n" + fmt.Sprintf("objectives:\n  batch: %d\n  chat: 10\n", batch)
	}
	r, reg := startReloadable(t, path, yaml(-1))
	client := extprocv3.NewExternalProcessorClient(dial(t, r.addrs.ExtProc))
	// status is the status of kvrouter's own answer to a request naming objective (none
	// when ""), 0 when the request was routed.
	status := func(objective string) int32 { return objectiveStatus(t, client, objective) }
	// send reports whether a request naming objective was shed (429).
	send := func(objective string) bool {
		t.Helper()
		switch code := status(objective); code {
		case 0, 429:
			return code == 429
		default:
			t.Fatalf("answered %d", code)
			return false
		}
	}
	// Shed once both queues are scraped: each request until then is routed (or finds no
	// endpoint yet).
	testwait.For(t, "a sheddable request shed", func() bool { return status("batch") == 429 })
	for _, tc := range []struct {
		objective string
		shed      bool
	}{{"chat", false}, {"", false}, {"made-up", false}, {"batch", true}} {
		if got := send(tc.objective); got != tc.shed {
			t.Errorf("objective %q: shed %v, want %v", tc.objective, got, tc.shed)
		}
	}

	if got := getObjectives(t, r); got.Source != "config" || !maps.Equal(got.Objectives, map[string]int{"batch": -1, "chat": 10}) {
		t.Fatalf("/debug/objectives %+v, want the configured batch -1 and chat 10", got)
	}

	writeFile(t, path, yaml(0))
	rep, err := r.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Applied, []string{"objectives"}) || len(rep.Restart) != 0 {
		t.Fatalf("applied %v restart %v, want [objectives] and none", rep.Applied, rep.Restart)
	}
	if send("batch") {
		t.Error("objective made priority 0 by the reload: shed")
	}
	if got := testmetrics.Must(t, reg, "kvrouter_requests_shed_total", "objective", "batch"); got != 2 {
		t.Fatalf("kvrouter_requests_shed_total{objective=batch} %v, want 2", got)
	}
	if got := getObjectives(t, r); got.Objectives["batch"] != 0 {
		t.Fatalf("/debug/objectives %+v after the reload, want batch 0", got)
	}
}

// debugObjectives is GET /debug/objectives.
type debugObjectives struct {
	Source         string         `json:"source"`
	ShedQueueDepth int            `json:"shed_queue_depth"`
	Objectives     map[string]int `json:"objectives"`
}

func getObjectives(t *testing.T, a *runningApp) debugObjectives {
	t.Helper()
	return getJSON[debugObjectives](t, "http://"+a.addrs.Debug+"/debug/objectives")
}

// objectiveStatus sends a chat request naming objective (none when "") and returns the
// status of kvrouter's own answer to it, 0 when the request was routed.
func objectiveStatus(t *testing.T, client extprocv3.ExternalProcessorClient, objective string) int32 {
	t.Helper()
	x, err := fakeenvoy.Start(context.Background(), client, fakeenvoy.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	defer x.Cancel()
	h := fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
		{Key: "content-type", Value: "application/json"}}
	if objective != "" {
		h = append(h, fakeenvoy.Header{Key: epp.HeaderObjective, Value: objective})
	}
	res, err := x.Request(fakeenvoy.Request{Headers: h,
		Body: [][]byte{[]byte(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`)}})
	if err != nil {
		t.Fatal(err)
	}
	return int32(res.Immediate.GetStatus().GetCode())
}

// model_rewrites reloads: a model no endpoint serves is routed as it came until a
// reload adds the rule that aliases it to a served one; from then its body names the
// served model, and the decision is counted with the rule's name.
func TestReloadModelRewrites(t *testing.T) {
	v1 := newFakeVLLM(t)
	v1.up.Store(true)
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	base := plaintext(reloadYAML("127.0.0.1:0", "least-load", 50*time.Millisecond, v1))
	r, reg := startReloadable(t, path, base)
	client := extprocv3.NewExternalProcessorClient(dial(t, r.addrs.ExtProc))
	// upstreamModel sends a chat request for model m and returns the model the upstream
	// would get ("" when kvrouter answered itself).
	upstreamModel := func(m string) string {
		t.Helper()
		x, err := fakeenvoy.Start(context.Background(), client, fakeenvoy.FullDuplex())
		if err != nil {
			t.Fatal(err)
		}
		defer x.Cancel()
		res, err := x.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"},
			{Key: ":path", Value: "/v1/chat/completions"}, {Key: "content-type", Value: "application/json"}},
			Body: [][]byte{[]byte(`{"model":"` + m + `","messages":[{"role":"user","content":"hi"}]}`)}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Immediate != nil {
			return ""
		}
		var body struct{ Model string }
		if err := json.Unmarshal(res.Body, &body); err != nil {
			t.Fatalf("upstream body %q: %v", res.Body, err)
		}
		return body.Model
	}
	testwait.For(t, "a request routed", func() bool { return upstreamModel("small") != "" })
	if got := upstreamModel("small"); got != "small" {
		t.Fatalf("without a rule the upstream gets %q, want small", got)
	}

	writeFile(t, path, base+"model_rewrites:\n  - name: alias\n    rules:\n      - matches: [{model: {value: small}}]\n        targets: [{model_rewrite: "+model+"}]\n")
	rep, err := r.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Applied, []string{"model_rewrites"}) || len(rep.Restart) != 0 {
		t.Fatalf("applied %v restart %v, want [model_rewrites] and none", rep.Applied, rep.Restart)
	}
	if got := upstreamModel("small"); got != model {
		t.Fatalf("after the reload the upstream gets %q, want %q", got, model)
	}
	if got := testmetrics.Must(t, reg, "inference_extension_model_rewrite_decisions_total",
		"model_rewrite_name", "alias", "model_name", "small", "target_model", model); got != 1 {
		t.Fatalf("rewrite decisions %v, want 1", got)
	}
	type debugRewrites struct {
		Source   string
		Rewrites []rewrite.Rewrite
	}
	got := getJSON[debugRewrites](t, "http://"+r.addrs.Debug+"/debug/rewrites")
	if got.Source != "config" || len(got.Rewrites) != 1 || got.Rewrites[0].Name != "alias" ||
		got.Rewrites[0].Rules[0].Targets[0].ModelRewrite != model {
		t.Fatalf("/debug/rewrites %+v, want the configured alias", got)
	}
	// /debug/route explains the request for the target, and says so.
	code, x, raw := postRoute(t, "http://"+r.addrs.Debug, `{"model":"small","prompt":"hi"}`)
	if code != 200 || x.Model != model || x.RewrittenFrom != "small" || x.Rewrite != "alias" || x.FallbackReason != "" {
		t.Fatalf("/debug/route %d: %s", code, raw)
	}
}
