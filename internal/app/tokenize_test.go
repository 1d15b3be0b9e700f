package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

func TestTokenizeCommand(t *testing.T) {
	dir := testmodels.Dir(t, "qwen3")
	tests := []struct {
		name   string
		args   []string
		stdin  string
		code   int
		stdout string // exact
		stderr string // substring
	}{
		{"chat and completions", []string{"tokenize", "--model-dir", dir},
			`{"model":"m","messages":[{"role":"user","content":"hello there"}]}` + "\n\n" + `{"prompt":"hello there"}` + "\n" + `{"prompt":1}`,
			0, `{"ids":[151644,872,198,14990,1052,151645,198,151644,77091,198]}` + "\n" + `{"ids":[14990,1052]}` + "\n" +
				`{"error":"prompt: bad request: prompt must be a string or a list"}` + "\n", ""},
		{"no model dir", []string{"tokenize"}, "", 2, "", "usage: kvrouter tokenize"},
		{"missing dir", []string{"tokenize", "--model-dir", t.TempDir()}, "", 1, "", "kvrouter tokenize:"},
		{"bad kwargs", []string{"tokenize", "--model-dir", dir, "--default-chat-template-kwargs", "[1]"}, "", 2, "", "must be a JSON object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := app.MainIO(tc.args, strings.NewReader(tc.stdin), &out, &errOut)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errOut.String())
			}
			if tc.code == 0 && out.String() != tc.stdout {
				t.Errorf("stdout\n%s\nwant\n%s", out.String(), tc.stdout)
			}
			if !strings.Contains(errOut.String(), tc.stderr) {
				t.Errorf("stderr %q lacks %q", errOut.String(), tc.stderr)
			}
		})
	}
}

// TestUnsupportedTokenizerRoutesByLoad: a model whose tokenizer kind is not implemented
// does not stop the router; it is marked not ready and its requests carry no tokens.
func TestUnsupportedTokenizerRoutesByLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tokenizer.json", `{"model":{"type":"WordPiece","vocab":{"a":0}},"added_tokens":[]}`)
	write("tokenizer_config.json", `{}`)
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	cfg := testConfig(t, vllm)
	cfg.Models = map[string]config.ModelConfig{model: {Tokenizer: dir, BlockSize: 16}}
	cfg.Policy.Name = "kv"
	reg := prometheus.NewRegistry()
	a, err := app.New(cfg, app.Options{Registry: reg})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	testwait.For(t, "the endpoint scraped eligible", func() bool {
		a.Fleet().ScrapeAll(context.Background())
		return a.Fleet().Ready()
	})
	x, err := a.ExplainRoute("", []byte(`{"model":"`+model+`","prompt":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	if x.Tokens != 0 || !strings.Contains(x.TokenizeError, "unsupported") || x.Policy.Scores == nil || x.Policy.Scores.Tokenized ||
		x.Kind != scoring.KindUntokenized {
		b, _ := json.Marshal(x)
		t.Errorf("explanation %s: want no tokens, an unsupported-tokenizer error and a load-only score (untokenized)", b)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kvrouter_model_tokenizer_ready" {
			found = true
			if v := mf.GetMetric()[0].GetGauge().GetValue(); v != 0 {
				t.Errorf("kvrouter_model_tokenizer_ready = %v, want 0", v)
			}
		}
	}
	if !found {
		t.Error("kvrouter_model_tokenizer_ready not registered")
	}
}

// TestChatTemplateRefusalCounted: a model whose chat template uses a construct
// kvrouter's Jinja engine does not implement loads (its completions are still
// tokenized) and is counted once in kvrouter_chat_template_refusals_total; a model
// whose template the engine renders (Qwen3's) is not counted.
func TestChatTemplateRefusalCounted(t *testing.T) {
	const native, refusedModel = "Qwen/Qwen3-0.6B", "custom/wordwrap"
	qwen := testmodels.Dir(t, "qwen3")
	dir := t.TempDir()
	tok, err := os.ReadFile(filepath.Join(qwen, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfgJSON := `{"chat_template": "{% for m in messages %}{{ m.content | wordwrap(20) }}{% endfor %}"}`
	for name, data := range map[string][]byte{"tokenizer.json": tok, "tokenizer_config.json": []byte(cfgJSON)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vllm := newFakeVLLM(t)
	cfg := testConfig(t, vllm)
	cfg.Models = map[string]config.ModelConfig{
		native:       {Tokenizer: qwen, BlockSize: 16},
		refusedModel: {Tokenizer: dir, BlockSize: 16},
	}
	reg := prometheus.NewRegistry()
	if _, err := app.New(cfg, app.Options{Registry: reg}); err != nil {
		t.Fatalf("New: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		if mf.GetName() != "kvrouter_chat_template_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				got = append(got, l.GetValue()+":"+strconv.FormatFloat(m.GetCounter().GetValue(), 'g', -1, 64))
			}
		}
	}
	if want := []string{refusedModel + ":1"}; !slices.Equal(got, want) {
		t.Errorf("kvrouter_chat_template_refusals_total: %v, want %v", got, want)
	}
}

// TestReadyOnlyWithEveryTokenizerSettled: by the time readiness (the probe port's
// readiness service, /readyz) first says SERVING, every configured model's tokenizer
// has loaded, so the pod's first requests are routed by cache, or failed for good (an
// unsupported tokenizer), which does not hold readiness: that model is routed by load.
func TestReadyOnlyWithEveryTokenizerSettled(t *testing.T) {
	const wordpiece = "other/wordpiece"
	dir := t.TempDir()
	for name, body := range map[string]string{
		"tokenizer.json":        `{"model":{"type":"WordPiece","vocab":{"a":0}},"added_tokens":[]}`,
		"tokenizer_config.json": `{}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	cfg := testConfig(t, vllm)
	cfg.Endpoints[0].Models = append(cfg.Endpoints[0].Models, wordpiece)
	cfg.Models = map[string]config.ModelConfig{
		model:     {Tokenizer: testmodels.Dir(t, "qwen3"), BlockSize: 16},
		wordpiece: {Tokenizer: dir, BlockSize: 16},
	}
	cfg.Policy.Name = "kv"
	a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry()})
	waitHealth(t, dial(t, a.addrs.Health), app.ReadinessService, healthpb.HealthCheckResponse_SERVING)
	if code, body := httpGet(t, "http://"+a.addrs.Metrics+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d %q once readiness is SERVING", code, body)
	}
	metrics := metricsText(t, "http://"+a.addrs.Metrics)
	for _, want := range []string{
		`kvrouter_model_tokenizer_ready{model="` + model + `"} 1`,
		`kvrouter_model_tokenizer_ready{model="` + wordpiece + `"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("ready, but /metrics lacks %s", want)
		}
	}
	x, err := a.ExplainRoute("", []byte(`{"model":"`+model+`","prompt":"hello world"}`))
	if err != nil || x.Tokens == 0 || x.TokenizeError != "" {
		t.Errorf("ready, but %s's prompt: %+v, %v; want its tokens", model, x, err)
	}
	x, err = a.ExplainRoute("", []byte(`{"model":"`+wordpiece+`","prompt":"hello"}`))
	if err != nil || x.Tokens != 0 || !strings.Contains(x.TokenizeError, "unsupported") || x.Pick == "" {
		t.Errorf("%s's prompt: %+v, %v; want no tokens, an unsupported-tokenizer error and a pick by load", wordpiece, x, err)
	}
}
