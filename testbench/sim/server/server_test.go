package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/testbench/sim/server"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fakeTokenizer maps each byte of the text to a token id (offset by 1000); special
// tokens add a leading 1.
type fakeTokenizer struct{}

func (fakeTokenizer) Encode(text string, addSpecial bool) ([]uint32, error) {
	if strings.Contains(text, "\x00") {
		return nil, errors.New("NUL in text")
	}
	var ids []uint32
	if addSpecial {
		ids = append(ids, 1)
	}
	for _, c := range []byte(text) {
		ids = append(ids, 1000+uint32(c))
	}
	return ids, nil
}

// fakeChat renders messages as their raw JSON bytes and tokenizes them.
type fakeChat struct{}

func (fakeChat) ChatTokens(req *openai.Request) ([]uint32, error) {
	return fakeTokenizer{}.Encode(string(req.Messages), false)
}

var fixed = time.Date(2026, 11, 13, 12, 0, 0, 0, time.UTC)

func start(t *testing.T, mod func(*server.Config)) (*server.Server, *httptest.Server) {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.TimeScale = 1e6
	cfg.Engine.HashSeed = 7
	cfg.EnablePromptTokensDetails = true
	if mod != nil {
		mod(&cfg)
	}
	return startWith(t, cfg, server.Options{Registry: prometheus.NewRegistry(), Tokenizer: fakeTokenizer{},
		Chat: fakeChat{}, Now: func() time.Time { return fixed }})
}

// startWith runs a server of cfg and opts behind an httptest server until the test ends;
// Run must then return nil.
func startWith(t *testing.T, cfg server.Config, opts server.Options) (*server.Server, *httptest.Server) {
	t.Helper()
	s, err := server.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		hs.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s, hs
}

func post(t *testing.T, hs *httptest.Server, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

func get(t *testing.T, hs *httptest.Server, path string) string {
	t.Helper()
	resp, err := http.Get(hs.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return string(raw)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s mismatch:\n got: %s\nwant: %s", name, got, want)
	}
}

func ids(start, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprint(start + i)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// TestResponses runs one sequence against one server: the ids and cached tokens depend on
// what came before, as they do on vLLM.
func TestResponses(t *testing.T) {
	_, hs := start(t, nil)
	steps := []struct {
		name, path, body string
		status           int
	}{
		{"completion_miss", "/v1/completions", `{"model":"Qwen/Qwen3-0.6B","prompt":` + ids(100, 40) + `,"max_tokens":4}`, 200},
		{"completion_hit", "/v1/completions", `{"prompt":[` + ids(100, 40) + `],"max_tokens":2}`, 200},
		{"completion_stream_usage", "/v1/completions", `{"prompt":` + ids(100, 40) + `,"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`, 200},
		{"completion_stream", "/v1/completions", `{"prompt":` + ids(500, 5) + `,"max_tokens":2,"stream":true}`, 200},
		{"completion_text", "/v1/completions", `{"prompt":"hello world","max_tokens":1}`, 200},
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":2}`, 200},
		{"chat_stream", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`, 200},
		{"tokenize", "/tokenize", `{"prompt":"abc"}`, 200},
		{"tokenize_chat", "/tokenize", `{"messages":[{"role":"user","content":"x"}]}`, 200},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			status, body := post(t, hs, st.path, st.body)
			if status != st.status {
				t.Errorf("status = %d, want %d: %s", status, st.status, body)
			}
			golden(t, st.name+".golden", body)
		})
	}
	t.Run("models", func(t *testing.T) { golden(t, "models.golden", get(t, hs, "/v1/models")) })
	t.Run("metrics", func(t *testing.T) { golden(t, "metrics.golden", get(t, hs, "/metrics")) })
}

// TestCompletionsMaxTokensDefault: a completions body without max_tokens generates vLLM's
// default, 16 tokens (the bound the router reads, openai.DefaultCompletionMaxTokens); an
// explicit null is vLLM's None, up to max_model_len less the prompt, as an absent
// max_tokens on chat.
func TestCompletionsMaxTokensDefault(t *testing.T) {
	_, hs := start(t, func(c *server.Config) { c.Engine.MaxModelLen = 64 })
	for _, tc := range []struct {
		name, path, body string
		want             int
	}{
		{"absent", "/v1/completions", `{"prompt":` + ids(100, 40) + `}`, openai.DefaultCompletionMaxTokens},
		{"null", "/v1/completions", `{"prompt":` + ids(200, 40) + `,"max_tokens":null}`, 64 - 40},
		{"set", "/v1/completions", `{"prompt":` + ids(300, 40) + `,"max_tokens":3}`, 3},
		{"chat absent", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := post(t, hs, tc.path, tc.body)
			if status != 200 {
				t.Fatalf("status %d: %s", status, body)
			}
			var r struct {
				Usage struct {
					PromptTokens     int `json:"prompt_tokens"`
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(body), &r); err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want < 0 {
				want = 64 - r.Usage.PromptTokens
			}
			if r.Usage.CompletionTokens != want {
				t.Errorf("completion_tokens %d, want %d: %s", r.Usage.CompletionTokens, want, body)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	_, hs := start(t, nil)
	tests := []struct {
		name, path, body string
		status           int
		msg              string
	}{
		{"invalid json", "/v1/completions", `{"prompt":`, 400, "invalid JSON body"},
		{"unknown model", "/v1/completions", `{"model":"other","prompt":[1]}`, 404, "The model `other` does not exist."},
		{"no prompt", "/v1/completions", `{"max_tokens":1}`, 400, "prompt is required"},
		{"bad prompt type", "/v1/completions", `{"prompt":{"a":1}}`, 400, "prompt must be"},
		{"two prompts", "/v1/completions", `{"prompt":[[1,2],[3]]}`, 400, "one prompt per request"},
		{"zero max tokens", "/v1/completions", `{"prompt":[1,2],"max_tokens":0}`, 400, "max_tokens must be at least 1"},
		{"too long", "/v1/completions", `{"prompt":[1,2],"max_tokens":50000}`, 400, "maximum context length is 40960"},
		{"huge max_tokens", "/v1/completions", `{"prompt":[1,2],"max_tokens":1000000000000}`, 400, "maximum context length"},
		{"n=2", "/v1/completions", `{"prompt":[1,2],"n":2}`, 400, "n=1"},
		{"empty token list", "/v1/completions", `{"prompt":[]}`, 400, "prompt is empty"},
		{"tokenizer error", "/v1/completions", `{"prompt":"a\u0000b"}`, 400, "tokenizing the prompt"},
		{"chat without messages", "/v1/chat/completions", `{"max_tokens":1}`, 400, "messages is required"},
		{"tokenize non-string", "/tokenize", `{"prompt":[1]}`, 400, "prompt must be a string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := post(t, hs, tc.path, tc.body)
			if status != tc.status {
				t.Errorf("status = %d, want %d", status, tc.status)
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != tc.status ||
				!strings.Contains(e.Error.Message, tc.msg) {
				t.Errorf("body = %s, want code %d and message containing %q", body, tc.status, tc.msg)
			}
		})
	}
	t.Run("golden nested", func(t *testing.T) {
		_, body := post(t, hs, "/v1/completions", `{"prompt":[1,2],"max_tokens":0}`)
		golden(t, "error.golden", body)
	})
}

func TestLegacyErrorShape(t *testing.T) {
	_, hs := start(t, func(c *server.Config) { c.LegacyErrors = true })
	_, body := post(t, hs, "/v1/completions", `{"prompt":[1,2],"max_tokens":0}`)
	golden(t, "error_legacy.golden", body)
}

func TestNoTokenizer(t *testing.T) {
	cfg := server.DefaultConfig()
	s, err := server.New(cfg, server.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	for _, path := range []string{"/v1/chat/completions", "/tokenize"} {
		status, body := post(t, hs, path, `{"prompt":"x","messages":[{"role":"user","content":"x"}]}`)
		if status != 400 || !strings.Contains(body, "--tokenizer") {
			t.Errorf("%s: %d %s", path, status, body)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name, json string
	}{
		{"unknown key", `{"enable_kv_cache_events":true,"bogus":1}`},
		{"bad publisher", `{"enable_kv_cache_events":true,"publisher":"kafka"}`},
		{"bad endpoint", `{"enable_kv_cache_events":true,"endpoint":"localhost:5557"}`},
		{"bad encoding", `{"enable_kv_cache_events":true,"encoding":"cbor"}`},
		{"bad framing", `{"enable_kv_cache_events":true,"replay_framing":"x"}`},
		{"not json", `{`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := server.ParseKVEventsConfig(tc.json); err == nil {
				t.Error("accepted")
			}
		})
	}
	if c, err := server.ParseKVEventsConfig(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","topic":"kv"}`); err != nil || c.Topic != "kv" || c.BufferSteps != 10000 {
		t.Errorf("valid config: %+v %v", c, err)
	}
}

// TestKVEventsOverZMQ subscribes to two data-parallel ranks' publishers and replays one.
func TestKVEventsOverZMQ(t *testing.T) {
	for _, tc := range []struct{ encoding, framing string }{{"map", "topic"}, {"array", "legacy"}} {
		t.Run(tc.encoding, func(t *testing.T) {
			s, hs := start(t, func(c *server.Config) {
				c.DataParallelSize = 2
				c.KVEvents.EnableKVCacheEvents = true
				c.KVEvents.Endpoint = "tcp://*:0"
				c.KVEvents.ReplayEndpoint = "tcp://*:0"
				c.KVEvents.Topic = "kv"
				c.KVEvents.Encoding = tc.encoding
				c.KVEvents.ReplayFraming = tc.framing
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pubAddr, repAddr, err := s.PublisherAddr(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			local := func(addr string) string {
				_, port, err := net.SplitHostPort(addr)
				if err != nil {
					t.Fatal(err)
				}
				return "tcp://127.0.0.1:" + port
			}
			sub := zmq4.NewSub(ctx)
			defer sub.Close()
			if err := sub.Dial(local(pubAddr)); err != nil {
				t.Fatal(err)
			}
			if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // slow joiner
			// Rank 0 is idle, so the DP balancer sends the first request there.
			if status, body := post(t, hs, "/v1/completions", `{"prompt":`+ids(100, 40)+`,"max_tokens":1}`); status != 200 {
				t.Fatal(body)
			}
			msg, err := sub.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(msg.Frames) != 3 || string(msg.Frames[0]) != "kv" || binary.BigEndian.Uint64(msg.Frames[1]) != 0 {
				t.Fatalf("frames = %q", msg.Frames)
			}
			var b kvevents.Batch
			if err := kvevents.Decode(msg.Frames[2], &b); err != nil {
				t.Fatal(err)
			}
			st, ok := b.Events[0].(*kvevents.BlockStored)
			if !b.HasDPRank || b.DPRank != 0 || len(b.Events) != 1 || !ok || len(st.BlockHashes) != 2 || st.BlockSize != 16 {
				t.Fatalf("batch = %+v", b)
			}

			dealer := zmq4.NewDealer(ctx)
			defer dealer.Close()
			if err := dealer.Dial(local(repAddr)); err != nil {
				t.Fatal(err)
			}
			if err := dealer.Send(zmq4.NewMsgFrom(nil, make([]byte, 8))); err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for {
				m, err := dealer.Recv()
				if err != nil {
					t.Fatal(err)
				}
				want := 4
				if tc.framing == "legacy" {
					want = 3
				}
				if len(m.Frames) != want {
					t.Fatalf("replay frames = %q", m.Frames)
				}
				seq := m.Frames[want-2]
				if bytes.Equal(seq, bytes.Repeat([]byte{0xff}, 8)) {
					break
				}
				seqs = append(seqs, binary.BigEndian.Uint64(seq))
			}
			if len(seqs) != 1 || seqs[0] != 0 {
				t.Errorf("replayed seqs = %v, want [0]", seqs)
			}
			pub1, _, err := s.PublisherAddr(ctx, 1)
			if err != nil || pub1 == pubAddr {
				t.Errorf("rank 1 publisher %q (%v) must differ from rank 0's %q", pub1, err, pubAddr)
			}
		})
	}
}

// FuzzRequestBody feeds arbitrary bodies to every POST endpoint: the server must answer
// 200, 400 or 404 and never panic.
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{`{"prompt":[1,2,3],"max_tokens":2}`, `{"prompt":"hi","stream":true}`,
		`{"messages":[{"role":"user","content":"x"}]}`, `{"prompt":[[1]]}`, `{`, `null`, `{"prompt":[-1]}`} {
		f.Add(s)
	}
	cfg := server.DefaultConfig()
	cfg.TimeScale = 1e6
	cfg.Engine.MaxModelLen = 4096
	s, err := server.New(cfg, server.Options{Tokenizer: fakeTokenizer{}, Chat: fakeChat{}})
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Run(ctx) }()
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/tokenize"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
			if c := rec.Code; c != 200 && c != 400 && c != 404 {
				t.Errorf("%s %q: status %d", path, body, c)
			}
		}
	})
}

func FuzzParseKVEventsConfig(f *testing.F) {
	f.Add(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557"}`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, s string) {
		c, err := server.ParseKVEventsConfig(s)
		if err == nil && c.Validate() != nil {
			t.Errorf("accepted an invalid config %q", s)
		}
	})
}

// TestConcurrentAndCancelled runs many streaming and plain requests at once across two
// ranks, cancelling some mid-flight: every survivor completes, and the engines end idle
// with their KV cache free.
func TestConcurrentAndCancelled(t *testing.T) {
	_, hs := start(t, func(c *server.Config) {
		c.DataParallelSize = 2
		c.TimeScale = 200 // a 2-token step lasts about 25 us of wall time
		c.Engine.NumGPUBlocks = 40
	})
	const n = 24
	errs := make(chan error, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stream := i%2 == 0
			body := fmt.Sprintf(`{"prompt":%s,"max_tokens":40,"stream":%v}`, ids(100+i%3*50, 100), stream)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions", strings.NewReader(body))
			if i%4 == 1 {
				time.AfterFunc(time.Millisecond, cancel)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if i%4 == 1 {
					errs <- nil
					return
				}
				errs <- err
				return
			}
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case i%4 == 1:
				errs <- nil
			case err != nil:
				errs <- err
			case resp.StatusCode != 200:
				errs <- fmt.Errorf("status %d: %s", resp.StatusCode, raw)
			case stream && !strings.HasSuffix(string(raw), "data: [DONE]\n\n"):
				errs <- fmt.Errorf("stream did not end with [DONE]: %q", raw[max(0, len(raw)-80):])
			case !stream && !strings.Contains(string(raw), `"completion_tokens":40`):
				errs <- fmt.Errorf("body: %s", raw)
			default:
				errs <- nil
			}
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		m := get(t, hs, "/metrics")
		idle := strings.Count(m, "vllm:num_requests_running{") == 2 &&
			!strings.Contains(m, `vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.`) &&
			!strings.Contains(m, `vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-0.6B"} 0.`) &&
			strings.Contains(m, `vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 0`) &&
			strings.Contains(m, `vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-0.6B"} 0`) &&
			strings.Contains(m, `vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 0`) &&
			strings.Contains(m, `vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-0.6B"} 0`)
		if idle {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engines not idle:\n%s", m)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOffsetEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name, ep string
		n        int
		want     string
	}{
		{"loopback", "tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560"},
		{"wildcard", "tcp://*:5557", 1, "tcp://*:5558"},
		{"zero offset", "tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557"},
		{"ephemeral", "tcp://127.0.0.1:0", 2, "tcp://127.0.0.1:0"},
		{"empty", "", 2, ""},
		{"no port", "ipc:///tmp/kv", 2, "ipc:///tmp/kv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := server.OffsetEndpoint(tc.ep, tc.n); got != tc.want {
				t.Errorf("OffsetEndpoint(%q, %d) = %q, want %q", tc.ep, tc.n, got, tc.want)
			}
		})
	}
}

// With the model's tokenizer the server generates only one-token words, and an answer
// sent back as text (the next turn of a conversation) tokenizes to the ids the server
// generated: the next request finds the first request's prompt and answer cached, as a
// real model's re-tokenized answers are in vLLM.
func TestGeneratedTextRetokenizesToTheCachedIDs(t *testing.T) {
	b, err := prompt.LoadDir(testmodels.Dir(t, "qwen3"), prompt.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := server.DefaultConfig()
	cfg.TimeScale = 1e6
	cfg.EnablePromptTokensDetails = true
	_, hs := startWith(t, cfg, server.Options{Registry: prometheus.NewRegistry(), Tokenizer: b, Chat: b})

	first := strings.Repeat(" the cache of a prefix", 30) // 150 one-token words
	complete := func(p string) (text string, promptTokens, cached int) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": cfg.Model, "prompt": p, "max_tokens": 40, "ignore_eos": true})
		code, raw := post(t, hs, "/v1/completions", string(body))
		if code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, raw)
		}
		var r struct {
			Choices []struct{ Text string } `json:"choices"`
			Usage   struct {
				PromptTokens  int `json:"prompt_tokens"`
				PromptDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatal(err)
		}
		return r.Choices[0].Text, r.Usage.PromptTokens, r.Usage.PromptDetails.CachedTokens
	}
	answer, p1, _ := complete(first)
	_, _, cached := complete(first + answer + " and then")
	if want := (p1 + 40 - 1) / 16 * 16; cached != want {
		t.Fatalf("the second turn found %d cached tokens, want the %d of the first prompt and its answer", cached, want)
	}
}

// /debug/cache counts the distinct blocks the prefix cache holds: a 40-token prompt
// leaves two full 16-token blocks cached once the request ends.
func TestDebugCache(t *testing.T) {
	_, hs := start(t, nil)
	if got := get(t, hs, "/debug/cache"); got != "{\"cached_blocks\":0}\n" {
		t.Fatalf("before any request: %q", got)
	}
	if code, body := post(t, hs, "/v1/completions", `{"prompt":`+ids(1, 40)+`,"max_tokens":1}`); code != 200 {
		t.Fatalf("completion %d: %s", code, body)
	}
	if got := get(t, hs, "/debug/cache"); got != "{\"cached_blocks\":2}\n" {
		t.Fatalf("after one 40-token prompt: %q", got)
	}
}

// POST /debug/stall-metrics holds /metrics answers for the given time: a client with a
// shorter timeout gets none, and after the stall /metrics answers again.
func TestStallMetrics(t *testing.T) {
	_, hs := start(t, nil)
	if code, _ := post(t, hs, "/debug/stall-metrics?for=1m1s", ""); code != http.StatusBadRequest {
		t.Fatalf("a stall over a minute: %d, want 400", code)
	}
	if code, _ := post(t, hs, "/debug/stall-metrics?for=30s", ""); code != http.StatusNoContent {
		t.Fatalf("stall: %d", code)
	}
	client := &http.Client{Timeout: 100 * time.Millisecond}
	if resp, err := client.Get(hs.URL + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatal("/metrics answered during the stall")
	}
	if code, _ := post(t, hs, "/debug/stall-metrics?for=0s", ""); code != http.StatusNoContent {
		t.Fatalf("end the stall: %d", code)
	}
	if !strings.Contains(get(t, hs, "/metrics"), "vllm:num_requests_running") {
		t.Fatal("/metrics does not answer after the stall")
	}
}
