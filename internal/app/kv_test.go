package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/sim/server"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// simServer is a simulated vLLM server on loopback publishing real ZeroMQ KV events.
type simServer struct {
	addr, events, replay string
	// stopEngine stops the engine and its KV-event publisher; HTTP (and /metrics) stays up.
	stopEngine context.CancelFunc
}

func startSim(t *testing.T, ctx context.Context, b *prompt.Builder) simServer {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.Model = model
	cfg.TimeScale = 20
	cfg.EnablePromptTokensDetails = true
	cfg.Engine.NumGPUBlocks = 585
	cfg.KVEvents.EnableKVCacheEvents = true
	cfg.KVEvents.Endpoint = "tcp://127.0.0.1:0"
	cfg.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
	cfg.KVEvents.Bind = true
	srv, err := server.New(cfg, server.Options{Tokenizer: b, Chat: b})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	ctx, stop := context.WithCancel(ctx)
	go func() { defer close(done); _ = srv.Run(ctx) }()
	pub, replay, err := srv.PublisherAddr(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { hs.Close(); <-done })
	tcp := func(a string) string { return "tcp://" + strings.TrimPrefix(a, "tcp://") }
	return simServer{addr: ln.Addr().String(), events: tcp(pub), replay: tcp(replay), stopEngine: stop}
}

func (s simServer) endpoint() fleet.EndpointConfig {
	return fleet.EndpointConfig{Address: s.addr, Models: []string{model}, MetricsURL: "http://" + s.addr + "/metrics",
		KVEvents: fleet.KVEventsConfig{Endpoints: []string{s.events}, ReplayEndpoints: []string{s.replay}}}
}

// loadQwen3 returns the directory of the Qwen3 test model's tokenizer files and a
// prompt builder loaded from them.
func loadQwen3(t *testing.T) (string, *prompt.Builder) {
	t.Helper()
	dir := testmodels.Dir(t, "qwen3")
	b, err := prompt.LoadDir(dir, prompt.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return dir, b
}

// simFleetConfig is a configuration for the simulated vLLM servers at endpoints, serving
// model with the tokenizer in dir under the kv policy. Scrapes are frequent so the test
// sees capacity soon, but a slow answer on a loaded CI machine (-race) must not make an
// endpoint ineligible mid-test.
func simFleetConfig(dir string, endpoints ...fleet.EndpointConfig) *config.Config {
	cfg := loopbackConfig()
	cfg.Endpoints = endpoints
	cfg.Models = map[string]config.ModelConfig{model: {Tokenizer: dir, BlockSize: 16}}
	cfg.Policy.Name, cfg.Policy.Fallback = "kv", "least-load"
	cfg.Limits.Scrape.Interval = 50 * time.Millisecond
	cfg.Limits.Scrape.Timeout = 50 * time.Millisecond
	cfg.Limits.Scrape.StalenessLimit = 10 * time.Second
	cfg.Limits.Scrape.FailuresBeforeIneligible = 1000
	cfg.KV.HealthRefresh = 10 * time.Millisecond
	return &cfg
}

func getJSON[T any](t *testing.T, url string) T {
	t.Helper()
	code, body := httpGet(t, url)
	if code != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, code, body)
	}
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, body)
	}
	return v
}

func postRoute(t *testing.T, base, body string) (int, app.RouteExplanation, string) {
	t.Helper()
	resp, err := http.Post(base+"/debug/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var x app.RouteExplanation
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &x); err != nil {
			t.Fatalf("decode: %v in %s", err, raw)
		}
	}
	return resp.StatusCode, x, string(raw)
}

func byAddr(kv []app.KVEndpoint, addr string) *app.KVEndpoint {
	for i := range kv {
		if kv[i].Endpoint == addr {
			return &kv[i]
		}
	}
	return nil
}

// TestKVPath runs the runner with the kv policy over three simulated vLLM servers that
// publish real KV events: the index fills from the events, /debug/route explains that the
// server holding a prompt's blocks wins and changes nothing, and the subscriptions follow
// endpoints leaving and joining the fleet.
func TestKVPath(t *testing.T) {
	dir, b := loadQwen3(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sims := []simServer{startSim(t, ctx, b), startSim(t, ctx, b), startSim(t, ctx, b)}

	cfg := simFleetConfig(dir, sims[0].endpoint(), sims[1].endpoint())
	cfg.Policy.KV.DecodeActiveRequestWeight = 0.5
	cfg.KV.EventsStaleAfter = 300 * time.Millisecond
	cfg.KV.Events.BackoffMin = 20 * time.Millisecond
	a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry()})
	base := "http://" + a.addrs.Debug

	testwait.For(t, "both servers' events connected and capacity scraped", func() bool {
		kv := getJSON[[]app.KVEndpoint](t, base+"/debug/kv")
		n := 0
		for _, e := range kv {
			if e.Connected && e.EventsHealthy && e.NumGPUBlocks == 585 {
				n++
			}
		}
		return n == 2
	})

	// Fill the second server's cache by sending it a request directly.
	words := strings.Repeat("router cache block prefix ", 120)
	chat := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":2}`, model, words)
	resp, err := http.Post("http://"+sims[1].addr+"/v1/chat/completions", "application/json", strings.NewReader(chat))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("direct request: HTTP %d", resp.StatusCode)
	}
	ids, err := b.PromptTokens(mustParse(t, chat))
	if err != nil {
		t.Fatal(err)
	}
	blocks := len(ids) / 16
	testwait.For(t, "the server's blocks in the index", func() bool {
		e := byAddr(getJSON[[]app.KVEndpoint](t, base+"/debug/kv"), sims[1].addr)
		return e != nil && e.IndexedBlocks >= blocks
	})

	t.Run("debug kv reports the streams", func(t *testing.T) {
		kv := getJSON[[]app.KVEndpoint](t, base+"/debug/kv")
		e := byAddr(kv, sims[1].addr)
		if e == nil || !e.EventsConfigured || len(e.Ranks) != 1 || len(e.LastSeq) != 1 || !e.Ranks[0].HasSeq ||
			e.Ranks[0].Capacity < 585 || e.Gaps != 0 || e.Drops != 0 {
			t.Errorf("endpoint view = %+v", e)
		}
		if other := byAddr(kv, sims[0].addr); other == nil || other.IndexedBlocks != 0 {
			t.Errorf("idle server = %+v, want no blocks", other)
		}
	})

	t.Run("debug route explains the pick and changes nothing", func(t *testing.T) {
		code, x, raw := postRoute(t, base, chat)
		if code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", code, raw)
		}
		if x.Tokens != len(ids) || x.Used != "kv" || x.Pick != sims[1].addr || x.Policy.Scores == nil {
			t.Fatalf("explanation = %s", raw)
		}
		if x.Kind != scoring.KindHit || x.Policy.Kind != scoring.KindHit || x.Fallback.Kind != scoring.KindLoad {
			t.Errorf("kinds: decision %q, policy %q, fallback %q; want hit, hit and load", x.Kind, x.Policy.Kind, x.Fallback.Kind)
		}
		for _, e := range x.Endpoints {
			want := 0
			if e.Address == sims[1].addr {
				want = blocks
			}
			if e.IndexedLeadingBlocks != want || e.RequestBlocks != blocks || !e.EventsHealthy {
				t.Errorf("%s: %+v, want %d matched of %d", e.Address, e, want, blocks)
			}
		}
		for _, c := range x.Policy.Scores.Candidates {
			if c.Address == sims[1].addr && (c.OverlapBlocks != blocks || c.Predicted) {
				t.Errorf("kv candidate %+v: want %d indexed overlap", c, blocks)
			}
		}
		if x.Fallback.Policy != "least-load" || x.Fallback.Pick == "" {
			t.Errorf("fallback view = %+v", x.Fallback)
		}
		_, again, _ := postRoute(t, base, chat)
		if again.Pick != x.Pick || again.Policy.Scores.Candidates[0].ActiveRequests != 0 {
			t.Errorf("a second explanation differs or shows load: %+v", again.Policy)
		}
		for _, st := range a.Fleet().Status() {
			if st.InFlight != 0 {
				t.Errorf("%s has %d in flight after debug calls", st.Config.Address, st.InFlight)
			}
		}
	})

	t.Run("debug route rejects bad bodies", func(t *testing.T) {
		for name, body := range map[string]string{
			"empty":       "",
			"not json":    "{",
			"no messages": `{"model":"m","messages":"x"}`,
		} {
			t.Run(name, func(t *testing.T) {
				if code, _, raw := postRoute(t, base, body); code != http.StatusBadRequest || !strings.Contains(raw, "error") {
					t.Errorf("HTTP %d %s, want 400 with an error", code, raw)
				}
			})
		}
	})

	t.Run("unknown model is explained as the fallback", func(t *testing.T) {
		code, x, raw := postRoute(t, base, `{"model":"other","prompt":"hello"}`)
		if code != http.StatusOK || x.Used != "least-load" || x.FallbackReason != "unknown_model" || x.Pick == "" || x.Kind != scoring.KindFallback {
			t.Errorf("HTTP %d %s", code, raw)
		}
	})

	t.Run("removed endpoint is unsubscribed and purged", func(t *testing.T) {
		a.Fleet().Remove(sims[1].addr)
		testwait.For(t, "the endpoint gone from the debug view", func() bool {
			return byAddr(getJSON[[]app.KVEndpoint](t, base+"/debug/kv"), sims[1].addr) == nil
		})
	})

	t.Run("added endpoint is subscribed", func(t *testing.T) {
		if err := a.Fleet().Upsert(sims[2].endpoint()); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "the new endpoint's events connected", func() bool {
			e := byAddr(getJSON[[]app.KVEndpoint](t, base+"/debug/kv"), sims[2].addr)
			return e != nil && e.Connected && e.EventsHealthy
		})
	})

	t.Run("endpoint whose event stream is down is scored by prediction", func(t *testing.T) {
		// The publisher goes away: its connection closes, so the stream is no longer
		// connected (a busy endpoint, a request in flight from this router, whose
		// stream says nothing would be caught too).
		sims[0].stopEngine()
		a.Fleet().Begin(sims[0].addr)
		defer a.Fleet().End(sims[0].addr)
		testwait.For(t, "the stream seen down", func() bool {
			e := byAddr(getJSON[[]app.KVEndpoint](t, base+"/debug/kv"), sims[0].addr)
			return e != nil && !e.EventsHealthy
		})
		code, x, raw := postRoute(t, base, chat)
		if code != http.StatusOK || x.Policy.Scores == nil {
			t.Fatalf("HTTP %d %s", code, raw)
		}
		for _, c := range x.Policy.Scores.Candidates {
			if want := c.Address == sims[0].addr; c.Predicted != want {
				t.Errorf("%s: predicted = %v, want %v", c.Address, c.Predicted, want)
			}
		}
	})
}

func mustParse(t *testing.T, body string) *openai.Request {
	t.Helper()
	r, err := prompt.RequestFromBody([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r
}
