package kvbench

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
)

// fakeEngine is a hand-written stand-in for a vLLM server behind a gateway: one token per
// word, an unbounded prefix cache of 16-token blocks, vLLM's prefix-cache counters.
type fakeEngine struct {
	name          string
	mu            sync.Mutex
	blocks        map[string]bool
	hits, queries int
}

func (e *fakeEngine) serve(prompt []string) (cached int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for n := 16; n <= len(prompt); n += 16 {
		key := strings.Join(prompt[:n], " ")
		if !e.blocks[key] {
			break
		}
		cached = n
	}
	for n := 16; n <= len(prompt); n += 16 {
		e.blocks[strings.Join(prompt[:n], " ")] = true
	}
	e.hits += cached
	e.queries += len(prompt)
	return cached
}

func (e *fakeEngine) metrics(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.Method == http.MethodPost && r.URL.Path == "/reset_prefix_cache" {
		e.blocks = map[string]bool{}
		return
	}
	fmt.Fprintf(w, "# HELP vllm:prefix_cache_hits_total Prefix cache hits.\n# TYPE vllm:prefix_cache_hits_total counter\n")
	fmt.Fprintf(w, "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} %d\n", e.hits)
	fmt.Fprintf(w, "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} %d\n", e.queries)
	fmt.Fprintf(w, "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\",model_name=\"m\"} 1\n")
}

// fakeGateway routes by a hash of the prompt's first word, so each prefix always lands on
// the same engine, and streams an OpenAI response.
type fakeGateway struct {
	engines []*fakeEngine
	fail    func(r *http.Request) (status int, noUsage bool)
}

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Prompt    string `json:"prompt"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
		Messages  []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !body.Stream {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	noUsage := false
	if g.fail != nil {
		var status int
		if status, noUsage = g.fail(r); status != 0 {
			http.Error(w, "injected failure", status)
			return
		}
	}
	chat := r.URL.Path == "/v1/chat/completions"
	text := body.Prompt
	if chat {
		text = body.Messages[0].Content
	}
	words := strings.Fields(text)
	h := fnv.New32a()
	h.Write([]byte(words[0]))
	e := g.engines[int(h.Sum32())%len(g.engines)]
	cached := e.serve(words)
	w.Header().Set(ServedHeader, e.name)
	w.Header().Set("Content-Type", "text/event-stream")
	if chat {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	}
	for i := 0; i < body.MaxTokens; i++ {
		if chat {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		} else {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
		}
	}
	if !noUsage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			len(words), body.MaxTokens, cached)
	}
	fmt.Fprintf(w, "data: [DONE]\n\n")
}

func newFakeFleet(t *testing.T, n int) (*fakeGateway, string, []string) {
	t.Helper()
	g := &fakeGateway{}
	var metrics []string
	for i := 0; i < n; i++ {
		e := &fakeEngine{name: fmt.Sprintf("10.9.0.%d:8000", i+1), blocks: map[string]bool{}}
		g.engines = append(g.engines, e)
		srv := httptest.NewServer(http.HandlerFunc(e.metrics))
		t.Cleanup(srv.Close)
		metrics = append(metrics, srv.URL+"/metrics")
	}
	gw := httptest.NewServer(g)
	t.Cleanup(gw.Close)
	return g, gw.URL, metrics
}

func TestHTTPTargetAgainstFakeFleet(t *testing.T) {
	for _, api := range []API{APICompletions, APIChat} {
		t.Run(string(api), func(t *testing.T) {
			_, url, metrics := newFakeFleet(t, 2)
			cfg := smallConfig()
			cfg.API, cfg.Prefixes, cfg.Requests, cfg.Warmup, cfg.OutputTokens = api, 3, 30, 6, 4
			w, err := NewWorkload(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			target, err := NewHTTPTarget(HTTPConfig{URL: url, Model: "m", MetricsURLs: metrics, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			out, err := target.Run(context.Background(), w, 4, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Expected from the workload alone: with sticky routing and unbounded caches,
			// only a prefix's first request misses; a tail's blocks are never reused.
			seen := map[int]bool{}
			wantHits, measured := 0, 0
			for _, r := range w.Requests() {
				if !r.Warmup {
					measured++
					if seen[r.Prefix] {
						wantHits++
					}
				}
				seen[r.Prefix] = true
			}
			if len(out.Blocks) != 2 || out.Blocks[0] != 100 || out.BlockSize != 16 {
				t.Errorf("capacity from metrics: %v blocks of %d", out.Blocks, out.BlockSize)
			}
			s := Summarize(out.Results, SummaryInput{PrefixTokens: cfg.PrefixTokens, BlockSize: 16})
			prompt := float64(measured * (cfg.PrefixTokens + cfg.TailTokens))
			wantRatio := float64(wantHits*cfg.PrefixTokens) / prompt
			if s.Errors != 0 || s.Requests != measured {
				t.Fatalf("requests %d errors %d", s.Requests, s.Errors)
			}
			if math.Abs(s.HitAny-float64(wantHits)/float64(measured)) > 1e-9 || s.HitFull != s.HitAny {
				t.Errorf("hit_any %v hit_full %v, want %v", s.HitAny, s.HitFull, float64(wantHits)/float64(measured))
			}
			if math.Abs(s.CachedRatio-wantRatio) > 1e-9 {
				t.Errorf("cached ratio %v, want %v", s.CachedRatio, wantRatio)
			}
			if out.EngineHitRate == nil || math.Abs(*out.EngineHitRate-wantRatio) > 1e-9 {
				t.Errorf("engine hit rate %v, want %v (measured window only)", out.EngineHitRate, wantRatio)
			}
			if s.ServersPerPrefix == nil || *s.ServersPerPrefix != 1 {
				t.Errorf("servers per prefix %v, want 1", s.ServersPerPrefix)
			}
			for _, r := range out.Results {
				if r.TTFT <= 0 || r.End <= r.Start || r.OutputTokens != cfg.OutputTokens {
					t.Fatalf("result %+v", r)
				}
			}
		})
	}
}

func TestHTTPTargetErrors(t *testing.T) {
	tests := []struct {
		name    string
		fail    func(n int) (int, bool)
		wantErr string
	}{
		{"server error", func(n int) (int, bool) {
			if n%3 == 0 {
				return http.StatusServiceUnavailable, false
			}
			return 0, false
		}, "HTTP 503"},
		{"no usage", func(n int) (int, bool) { return 0, n%3 == 0 }, "without usage"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, url, _ := newFakeFleet(t, 1)
			var mu sync.Mutex
			n := 0
			g.fail = func(*http.Request) (int, bool) {
				mu.Lock()
				defer mu.Unlock()
				n++
				return tt.fail(n)
			}
			cfg := smallConfig()
			cfg.Requests, cfg.Warmup = 9, 0
			w, _ := NewWorkload(cfg, nil)
			target, _ := NewHTTPTarget(HTTPConfig{URL: url, Model: "m"})
			out, err := target.Run(context.Background(), w, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := Summarize(out.Results, SummaryInput{PrefixTokens: 64, BlockSize: 16})
			if s.Errors != 3 {
				t.Errorf("errors %d, want 3", s.Errors)
			}
			for _, r := range out.Results {
				if r.Err != "" && !strings.Contains(r.Err, tt.wantErr) {
					t.Errorf("error %q, want it to mention %q", r.Err, tt.wantErr)
				}
			}
		})
	}
}

func TestNewHTTPTargetRejects(t *testing.T) {
	for _, c := range []HTTPConfig{{URL: "localhost:8000", Model: "m"}, {URL: "http://x"}} {
		if _, err := NewHTTPTarget(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestReadStream(t *testing.T) {
	usage := `data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}` + "\n\n"
	tests := []struct {
		name      string
		in        string
		want      StreamUsage
		wantErr   string
		wantFirst bool
	}{
		{"completions", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n" + usage + "data: [DONE]\n\n",
			StreamUsage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 4, Chunks: 3, Tokens: 2, Text: "ab"}, "", true},
		{"chat text", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\" the\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\" cache\"}}]}\n\n" + usage + "data: [DONE]\n\n",
			StreamUsage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 4, Chunks: 4, Tokens: 2, Text: " the cache"}, "", true},
		{"chat role chunk is not a token", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" + usage + "data: [DONE]\n\n",
			StreamUsage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 4, Chunks: 2}, "", false},
		{"reasoning counts", "data:{\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n" + usage + "data: [DONE]\n\n",
			StreamUsage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 4, Chunks: 2, Tokens: 1}, "", true},
		{"no cached details", "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":null}}\n\ndata: [DONE]\n",
			StreamUsage{PromptTokens: 3, CompletionTokens: 1, Chunks: 1, Tokens: 1, Text: "a"}, "", true},
		{"comments ignored", ": keep-alive\nevent: x\n" + usage + "data: [DONE]\n", StreamUsage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 4, Chunks: 1}, "", false},
		{"no usage", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n", StreamUsage{}, "without usage", true},
		{"no done", usage, StreamUsage{}, "before [DONE]", false},
		{"error event", "data: {\"error\":{\"message\":\"overloaded\"}}\n\n", StreamUsage{}, "overloaded", false},
		{"bad json", "data: {\"choices\":\n\n", StreamUsage{}, "bad stream chunk", false},
		{"impossible usage", "data: {\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":5}}}\n\ndata: [DONE]\n", StreamUsage{}, "cached of", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := 0
			got, err := ReadStream(strings.NewReader(tt.in), func() { first++ })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if (first == 1) != tt.wantFirst || first > 1 {
				t.Errorf("first-token callback ran %d times", first)
			}
		})
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n"))
	f.Add([]byte("data: {\"error\":{}}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ReadStream(strings.NewReader(string(b)), nil)
		if err == nil && (u.CachedTokens < 0 || u.CachedTokens > u.PromptTokens) {
			t.Fatalf("accepted impossible usage %+v", u)
		}
	})
}

func TestParseEngineMetrics(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    EngineMetrics
		wantErr bool
	}{
		{"current names summed over engines", `# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 40 1700000000000
vllm:cache_config_info{block_size="16",num_gpu_blocks="585",model_name="a \"q\" b"} 1
vllm:num_requests_running{model_name="m"} 3
`, EngineMetrics{PrefixHits: 15, PrefixQueries: 40, NumGPUBlocks: 585, BlockSize: 16}, false},
		{"old names", "vllm:gpu_prefix_cache_hits_total 2\nvllm:gpu_prefix_cache_queries_total 8\n",
			EngineMetrics{PrefixHits: 2, PrefixQueries: 8}, false},
		{"empty", "", EngineMetrics{}, false},
		{"bad value", "vllm:prefix_cache_hits_total x\n", EngineMetrics{}, true},
		{"unclosed labels", "vllm:prefix_cache_hits_total{a=\"b\" 1\n", EngineMetrics{}, true},
		{"unterminated label", "m{a=\"b} 1\n", EngineMetrics{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEngineMetrics(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseEngineMetrics(f *testing.F) {
	f.Add([]byte("vllm:prefix_cache_hits_total{a=\"b\"} 1\n"))
	f.Add([]byte("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"x\"} 1\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseEngineMetrics(strings.NewReader(string(b)))
	})
}

// TestExecuteURLMode runs a two-cell URL-mode grid against the fake fleet and reads the
// JSON back: the bound comes from the engines' cache_config_info.
func TestExecuteURLMode(t *testing.T) {
	_, url, metrics := newFakeFleet(t, 2)
	wl := smallConfig()
	wl.OutputTokens = 3
	path := t.TempDir() + "/out.json"
	o := Options{
		Workload: wl, Prefixes: []int{2, 5}, Concurrency: []int{2}, Policies: []string{"gateway"},
		Workers: 2, Reps: 1, HTTP: &HTTPConfig{URL: url, Model: "m", MetricsURLs: metrics},
		JSONPath: path, BlockSize: 16, BlocksPerServer: 1,
	}
	var b strings.Builder
	if _, err := Execute(context.Background(), o, &b); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	if err := json.Unmarshal(raw, &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0]["mode"] != "url" || recs[0]["policy"] != "gateway" {
		t.Fatalf("records %v", recs)
	}
	// 2 servers x 100 blocks x 16 tokens / 84-token prompts = 38 prompts: the bound is 1.
	if recs[1]["bound_hit_rate"] != float64(1) || recs[1]["servers_per_prefix"] != float64(1) || recs[1]["errors"] != float64(0) {
		t.Errorf("record %v", recs[1])
	}
	if !strings.Contains(b.String(), "gateway W=2 N=2 C=2") {
		t.Errorf("report %q", b.String())
	}
}

// TestHTTPTargetResetsPrefixCaches: a second run against the same engines starts warm,
// unless the caches are reset first.
func TestHTTPTargetResetsPrefixCaches(t *testing.T) {
	for _, reset := range []bool{false, true} {
		t.Run(fmt.Sprintf("reset=%v", reset), func(t *testing.T) {
			_, url, metrics := newFakeFleet(t, 2)
			cfg := smallConfig()
			cfg.Warmup, cfg.Requests = 0, 6
			w, _ := NewWorkload(cfg, nil)
			target, err := NewHTTPTarget(HTTPConfig{URL: url, Model: "m", MetricsURLs: metrics, ResetPrefixCache: reset})
			if err != nil {
				t.Fatal(err)
			}
			var first []Result
			for range 2 {
				out, err := target.Run(context.Background(), w, 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				first = append(first, out.Results[0])
			}
			if first[0].CachedTokens != 0 {
				t.Fatalf("first run's first request hit: %+v", first[0])
			}
			if warm := first[1].CachedTokens > 0; warm == reset {
				t.Errorf("second run's first request cached %d tokens with reset=%v", first[1].CachedTokens, reset)
			}
		})
	}
	if _, err := NewHTTPTarget(HTTPConfig{URL: "http://x", Model: "m", ResetPrefixCache: true}); err == nil {
		t.Error("reset without metrics URLs accepted")
	}
}
