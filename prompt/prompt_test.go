package prompt_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

var (
	buildersMu sync.Mutex
	builders   = map[string]*prompt.Builder{}
	tokenizers = map[string]*tokenizer.Tokenizer{}
)

// builder returns a model's Builder for the given server default kwargs, loading each
// model's tokenizer once (loading is the slow part of these tests).
func builder(t testing.TB, model string, defaults json.RawMessage) *prompt.Builder {
	t.Helper()
	dir := testmodels.Dir(t, model)
	key := model + "|" + string(defaults)
	buildersMu.Lock()
	defer buildersMu.Unlock()
	if b, ok := builders[key]; ok {
		return b
	}
	tok, ok := tokenizers[model]
	if !ok {
		var err error
		if tok, err = tokenizer.LoadDir(dir); err != nil {
			t.Fatalf("load %s: %v", model, err)
		}
		tokenizers[model] = tok
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := chattemplate.ParseTokenizerConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chattemplate.CompileConfig(cfg, chattemplate.Options{DefaultKwargs: defaults})
	if err != nil {
		t.Fatal(err)
	}
	b := prompt.New(tok, tmpl, nil)
	builders[key] = b
	return b
}

type namedIDs struct {
	Name string   `json:"name"`
	IDs  []uint32 `json:"ids"`
}

type bodyCase struct {
	Name           string          `json:"name"`
	Models         []string        `json:"models"`
	ServerDefaults json.RawMessage `json:"server_defaults"`
	Body           json.RawMessage `json:"body"`
}

// TestGoldenChatIDs checks chat requests end to end (body -> request -> render ->
// tokenize) against HuggingFace tokenizers' ids for the renders Python's Jinja2
// produced (testdata/gen/gen_ids.mjs over chattemplate's golden renders, generated
// conversations included), for the byte-level BPE models whose templates chattemplate
// proves: Qwen3, Llama 3 and Llama 3.1. The builders share one tokenizer per model with
// the prefix cache on, so later cases reuse the prefixes of earlier ones (same system
// prompts) and checkAppend encodes each request again from its longest cached prefix:
// both must give the golden ids.
func TestGoldenChatIDs(t *testing.T) {
	cases := testtext.ReadJSONL[bodyCase](t, filepath.Join("..", "chattemplate", "testdata", "cases.jsonl"))
	cases = append(cases, testtext.ReadJSONL[bodyCase](t, filepath.Join("..", "chattemplate", "testdata", "fuzz_cases.jsonl"))...)
	for _, model := range []string{"qwen3", "llama3", "llama3_1"} {
		t.Run(model, func(t *testing.T) { goldenChatIDs(t, cases, model) })
	}
}

// goldenChatIDs is TestGoldenChatIDs for one model; it skips (fails under CI=true) when
// the model's files are missing.
func goldenChatIDs(t *testing.T, cases []bodyCase, model string) {
	testmodels.Dir(t, model)
	want := map[string][]uint32{}
	for _, r := range testtext.ReadJSONL[namedIDs](t, filepath.Join("testdata", "golden_ids", model+".jsonl")) {
		want[r.Name] = r.IDs
	}
	matched := 0
	for _, c := range cases {
		ids, ok := want[c.Name]
		if !ok {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			req, err := prompt.RequestFromBody(c.Body)
			if err != nil {
				t.Fatal(err)
			}
			got, err := builder(t, model, c.ServerDefaults).PromptTokens(req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, ids) {
				t.Fatalf("ids differ\n got %v\nwant %v", got, ids)
			}
			checkAppend(t, builder(t, model, c.ServerDefaults), req, ids)
			matched++
		})
	}
	if matched != len(want) {
		t.Errorf("%s: %d of %d golden id lists matched", model, matched, len(want))
	}
	t.Logf("%s: %d chat requests with identical ids", model, matched)
}

// TestGoldenCompletionIDs checks completions prompts against HuggingFace ids.
func TestGoldenCompletionIDs(t *testing.T) {
	cases := testtext.ReadJSONL[bodyCase](t, filepath.Join("testdata", "completions.jsonl"))
	for _, model := range []string{"qwen3", "llama3"} {
		want := map[string][]uint32{}
		for _, r := range testtext.ReadJSONL[namedIDs](t, filepath.Join("testdata", "golden_ids", model+"-completions.jsonl")) {
			want[r.Name] = r.IDs
		}
		for _, c := range cases {
			t.Run(model+"/"+c.Name, func(t *testing.T) {
				req, err := prompt.RequestFromBody(c.Body)
				if err != nil {
					t.Fatal(err)
				}
				got, err := builder(t, model, nil).PromptTokens(req)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want[c.Name]) {
					t.Fatalf("ids differ\n got %v\nwant %v", got, want[c.Name])
				}
				checkAppend(t, builder(t, model, nil), req, want[c.Name])
			})
		}
	}
}

// checkAppend checks that AppendPromptTokens appends exactly want to a buffer that
// already holds ids and has spare capacity, as the router's pooled buffers do.
func checkAppend(t *testing.T, b *prompt.Builder, req *openai.Request, want []uint32) {
	t.Helper()
	dst := append(make([]uint32, 0, 64), 7, 7, 7)
	got, err := b.AppendPromptTokens(dst, req, 0)
	if err != nil {
		t.Fatalf("AppendPromptTokens: %v", err)
	}
	if !slices.Equal(got[:3], []uint32{7, 7, 7}) || !slices.Equal(got[3:], want) {
		t.Fatalf("AppendPromptTokens differs\n got %v\nwant [7 7 7] + %v", got, want)
	}
}

func TestPromptTokensShapes(t *testing.T) {
	b := builder(t, "qwen3", nil)
	tests := []struct {
		name        string
		body        string
		wantIDs     []uint32
		unsupported string
		badRequest  bool
	}{
		{name: "token ids used as is", body: `{"prompt":[1, 2, 151643]}`, wantIDs: []uint32{1, 2, 151643}},
		{name: "single token id list in a list", body: `{"prompt":[[7, 8]]}`, wantIDs: []uint32{7, 8}},
		{name: "batch of strings", body: `{"prompt":["a","b"]}`, unsupported: prompt.ReasonPromptBatch},
		{name: "batch of id lists", body: `{"prompt":[[1],[2]]}`, unsupported: prompt.ReasonPromptBatch},
		{name: "empty prompt list", body: `{"prompt":[]}`, badRequest: true},
		{name: "negative token id", body: `{"prompt":[-1]}`, badRequest: true},
		{name: "prompt of wrong type", body: `{"prompt":{"a":1}}`, badRequest: true},
		{name: "image part", body: `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, unsupported: "media_content"},
		{name: "request template", body: `{"chat_template":"{{ 1 }}","messages":[{"role":"user","content":"x"}]}`, unsupported: "request_chat_template"},
		{name: "continue final message", body: `{"continue_final_message":true,"messages":[{"role":"user","content":"x"}]}`, unsupported: "continue_final_message"},
		{name: "message without role", body: `{"messages":[{"content":"x"}]}`, badRequest: true},
		{name: "messages not a list", body: `{"messages":{"role":"user"}}`, badRequest: true},
		{name: "lone surrogate", body: `{"messages":[{"role":"user","content":"\ud800"}]}`, badRequest: true},
		{name: "template raises on empty messages", body: `{"messages":[]}`, badRequest: false},
		{name: "truncation cuts the prompt", body: `{"prompt":"Hello world, how are you?","truncate_prompt_tokens":2}`, unsupported: prompt.ReasonTruncated},
		{name: "truncation longer than the prompt", body: `{"prompt":[5, 6],"truncate_prompt_tokens":2}`, wantIDs: []uint32{5, 6}},
		{name: "truncation to the context length", body: `{"prompt":[5, 6, 7],"truncate_prompt_tokens":-1}`, wantIDs: []uint32{5, 6, 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := prompt.RequestFromBody([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			// PromptTokens, then AppendPromptTokens onto a buffer already holding ids.
			for _, dst := range [][]uint32{nil, {9, 9}} {
				ids, err := b.AppendPromptTokens(dst, req, 0)
				if dst == nil {
					ids, err = b.PromptTokens(req)
				} else if err == nil {
					if !slices.Equal(ids[:len(dst)], dst) {
						t.Fatalf("AppendPromptTokens changed the buffer's ids: %v", ids)
					}
					ids = ids[len(dst):]
				}
				var unsupported *prompt.UnsupportedError
				switch {
				case tt.unsupported != "":
					if !errors.As(err, &unsupported) || unsupported.Reason != tt.unsupported {
						t.Fatalf("want unsupported %q, got %v (%v)", tt.unsupported, err, ids)
					}
				case tt.badRequest:
					if !errors.Is(err, prompt.ErrBadRequest) {
						t.Fatalf("want ErrBadRequest, got %v (%v)", err, ids)
					}
				case tt.wantIDs != nil:
					if err != nil || !slices.Equal(ids, tt.wantIDs) {
						t.Fatalf("got %v, %v; want %v", ids, err, tt.wantIDs)
					}
				default:
					if err == nil {
						t.Fatalf("want an error, got %v", ids)
					}
				}
			}
		})
	}
}

func TestRegistry(t *testing.T) {
	dir := testmodels.Dir(t, "qwen3")
	reg := prometheus.NewPedanticRegistry()
	m, err := prompt.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := prompt.NewRegistry(prompt.Config{Models: []prompt.ModelConfig{
		{Name: "Qwen/Qwen3-0.6B", Dir: dir},
		{Name: "missing", Dir: filepath.Join(t.TempDir(), "nothing")},
	}}, prompt.RegistryOptions{Metrics: m, TokenizerMetrics: tokenizer.NewMetrics(reg)})
	if err != nil {
		t.Fatal(err)
	}
	chat, _ := prompt.RequestFromBody([]byte(`{"messages":[{"role":"user","content":"Hello!"}]}`))
	ids, err := r.PromptTokens(chat, "Qwen/Qwen3-0.6B")
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198}; !slices.Equal(ids, want) {
		t.Fatalf("got %v want %v", ids, want)
	}
	b1, _ := r.Load("Qwen/Qwen3-0.6B")
	b2, _ := r.Load("Qwen/Qwen3-0.6B")
	if b1 != b2 {
		t.Fatal("model loaded twice")
	}

	var unknown *prompt.UnknownModelError
	if _, err := r.PromptTokens(chat, "nope"); !errors.As(err, &unknown) || unknown.Model != "nope" {
		t.Fatalf("want UnknownModelError, got %v", err)
	}
	var loadErr *prompt.LoadError
	if _, err := r.PromptTokens(chat, "missing"); !errors.As(err, &loadErr) {
		t.Fatalf("want LoadError, got %v", err)
	}
	if _, err := r.PromptTokens(chat, "missing"); !errors.As(err, &loadErr) {
		t.Fatalf("want the remembered LoadError, got %v", err)
	}
	if _, err := r.PromptTokens(nil, "Qwen/Qwen3-0.6B"); !errors.Is(err, prompt.ErrBadRequest) {
		t.Fatalf("nil request: want ErrBadRequest, got %v", err)
	}
	batch, _ := prompt.RequestFromBody([]byte(`{"prompt":["a","b"]}`))
	if _, err := r.PromptTokens(batch, "Qwen/Qwen3-0.6B"); err == nil {
		t.Fatal("want an error for a batch")
	}
	bad, _ := prompt.RequestFromBody([]byte(`{"messages":[{"content":"no role"}]}`))
	if _, err := r.PromptTokens(bad, "Qwen/Qwen3-0.6B"); !errors.Is(err, prompt.ErrBadRequest) {
		t.Fatalf("want ErrBadRequest, got %v", err)
	}

	want := `
# HELP kvrouter_prompt_failures_total Requests whose prompt token ids could not be computed, by kind: bad_request (vLLM rejects it too), unknown_model, load, render.
# TYPE kvrouter_prompt_failures_total counter
kvrouter_prompt_failures_total{kind="bad_request"} 2
kvrouter_prompt_failures_total{kind="load"} 2
kvrouter_prompt_failures_total{kind="unknown_model"} 1
# HELP kvrouter_prompt_unsupported_total Requests whose prompt token ids cannot be reproduced exactly (routed by load), by reason.
# TYPE kvrouter_prompt_unsupported_total counter
kvrouter_prompt_unsupported_total{reason="prompt_batch"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvrouter_prompt_failures_total", "kvrouter_prompt_unsupported_total"); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg, "kvrouter_tokenizer_prefix_cache_lookups_total"); err != nil || n == 0 {
		t.Fatalf("tokenizer cache metrics not wired: %d series, %v", n, err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  prompt.Config
		ok   bool
	}{
		{"default", prompt.DefaultConfig(), true},
		{"valid", prompt.Config{Models: []prompt.ModelConfig{{Name: "a", Dir: "/x", DefaultChatTemplateKwargs: `{"enable_thinking": false}`}}}, true},
		{"empty name", prompt.Config{Models: []prompt.ModelConfig{{Dir: "/x"}}}, false},
		{"empty dir", prompt.Config{Models: []prompt.ModelConfig{{Name: "a"}}}, false},
		{"duplicate", prompt.Config{Models: []prompt.ModelConfig{{Name: "a", Dir: "/x"}, {Name: "a", Dir: "/y"}}}, false},
		{"kwargs not an object", prompt.Config{Models: []prompt.ModelConfig{{Name: "a", Dir: "/x", DefaultChatTemplateKwargs: `[1]`}}}, false},
		{"prefix cache off", prompt.Config{PrefixCacheBytes: -1}, true},
		{"prefix cache 1 GiB", prompt.Config{PrefixCacheBytes: 1 << 30}, true},
		{"prefix cache above 64 GiB", prompt.Config{PrefixCacheBytes: 65 << 30}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestTokenizeLines(t *testing.T) {
	b := builder(t, "qwen3", nil)
	in := strings.Join([]string{
		`{"model":"m","messages":[{"role":"user","content":"Hello!"}]}`,
		``,
		`{"prompt":"Hello!"}`,
		`{"prompt":[1,2,3]}`,
		`not json`,
		`{"prompt":["a","b"]}`,
		`{"messages":[{"role":"user","content":"Hello!"}],"chat_template_kwargs":{"enable_thinking":false}}`,
	}, "\n")
	var out bytes.Buffer
	if err := prompt.TokenizeLines(strings.NewReader(in), &out, b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	want := []string{
		`{"ids":[151644,872,198,9707,0,151645,198,151644,77091,198]}`,
		`{"ids":[9707,0]}`,
		`{"ids":[1,2,3]}`,
		`{"error":`,
		`{"error":"prompt: unsupported request: prompt_batch"}`,
		`{"ids":[151644,872,198,9707,0,151645,198,151644,77091,198,151667,271,151668,271]}`,
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("line %d: got %s, want prefix %s", i, lines[i], want[i])
		}
		if !json.Valid([]byte(lines[i])) {
			t.Errorf("line %d is not JSON: %s", i, lines[i])
		}
	}
}

func TestConcurrentPromptTokens(t *testing.T) {
	b := builder(t, "qwen3", nil)
	req, _ := prompt.RequestFromBody([]byte(`{"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"number","default":1.0}}}}}],"messages":[{"role":"system","content":"sys"},{"role":"user","content":"call f"},{"role":"assistant","content":"","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"x\": 1e-07}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"}]}`))
	want, err := b.PromptTokens(req)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				got, err := b.PromptTokens(req)
				if err != nil || !slices.Equal(got, want) {
					t.Errorf("concurrent render differs: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

var _ = openai.KindChat
