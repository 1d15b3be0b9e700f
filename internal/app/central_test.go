package app_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/freeport"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/testbench/sim/server"
)

// TestKVPathCentral runs the runner in central mode: a simulated vLLM server connects
// its KV-event PUB socket to kvrouter's bound socket with the topic kv@<its address>@
// <model>, and its blocks land in the index under the topic's model, even though the
// endpoint lists another served name first (per-pod mode would key them under that one).
func TestKVPathCentral(t *testing.T) {
	dir, b := loadQwen3(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	bindPort, err := freeport.Range(1)
	if err != nil {
		t.Fatal(err)
	}
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	simAddr := httpLn.Addr().String()

	cfg := simFleetConfig(dir, fleet.EndpointConfig{Address: simAddr, Models: []string{"an-alias", model},
		MetricsURL: "http://" + simAddr + "/metrics", KVEvents: fleet.KVEventsConfig{CentralRanks: []int{0}}})
	cfg.Discovery.KVEvents.Mode = discovery.ModeCentral
	cfg.Discovery.KVEvents.Bind = "tcp://127.0.0.1:" + strconv.Itoa(bindPort)
	a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry()})
	base := "http://" + a.addrs.Debug
	testwait.For(t, "the central socket", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(bindPort))
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// The simulated vLLM connects to kvrouter, as vLLM does with a connect endpoint.
	sc := server.DefaultConfig()
	sc.Model = model
	sc.TimeScale = 20
	sc.Engine.NumGPUBlocks = 585
	sc.KVEvents.EnableKVCacheEvents = true
	sc.KVEvents.Endpoint = "tcp://127.0.0.1:" + strconv.Itoa(bindPort)
	sc.KVEvents.Topic = kvevents.CentralTopic(simAddr, model)
	srv, err := server.New(sc, server.Options{Tokenizer: b, Chat: b})
	if err != nil {
		t.Fatal(err)
	}
	simDone := make(chan struct{})
	go func() { defer close(simDone); _ = srv.Run(ctx) }()
	hs := &http.Server{Handler: srv.Handler()}
	go func() { _ = hs.Serve(httpLn) }()
	t.Cleanup(func() { hs.Close(); cancel(); <-simDone })

	// zmq4's PUB drops what it publishes before the subscription arrives, and a prompt
	// already cached emits nothing new: until a prompt's blocks are indexed, another
	// prompt (its first block differs, so all its blocks are new) is sent every 25 polls.
	var chat string
	var blocks, polls int
	testwait.For(t, "the server's blocks in the index", func() bool {
		if polls%25 == 0 {
			words := fmt.Sprintf("attempt %d: ", polls/25) + strings.Repeat("central socket block prefix ", 120)
			chat = fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":2}`, model, words)
			ids, err := b.PromptTokens(mustParse(t, chat))
			if err != nil {
				t.Fatal(err)
			}
			blocks = len(ids) / 16
			resp, err := http.Post("http://"+simAddr+"/v1/chat/completions", "application/json", strings.NewReader(chat))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		polls++
		code, x, _ := postRoute(t, base, chat)
		return code == http.StatusOK && len(x.Endpoints) == 1 && x.Endpoints[0].IndexedLeadingBlocks >= blocks
	})
	testwait.For(t, "the central stream healthy", func() bool {
		code, x, _ := postRoute(t, base, chat)
		return code == http.StatusOK && len(x.Endpoints) == 1 && x.Endpoints[0].EventsHealthy
	})
	code, x, raw := postRoute(t, base, chat)
	if code != http.StatusOK || x.Pick != simAddr {
		t.Fatalf("HTTP %d: %s", code, raw)
	}
	if e := x.Endpoints[0]; e.IndexedLeadingBlocks != blocks {
		t.Errorf("%+v: want %d leading blocks matched under the topic's model", e, blocks)
	}
}
