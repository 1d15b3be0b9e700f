package app_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// TestPlacementKeepsPrefixesHome runs the runner with the placement policy over two
// endpoints (no KV events: the policy's own placements are all it knows). Requests that
// share a long system prompt all go to one endpoint, one at a time; requests with another
// system prompt are placed on the other endpoint, which holds fewer prefixes.
func TestPlacementKeepsPrefixesHome(t *testing.T) {
	dir := testmodels.Dir(t, "qwen3")
	v1, v2 := newFakeVLLM(t), newFakeVLLM(t)
	v1.up.Store(true)
	v2.up.Store(true)
	cfg := testConfig(t, v1, v2)
	cfg.Models = map[string]config.ModelConfig{model: {Tokenizer: dir, BlockSize: 16}}
	// The exchanges below end at once, so the decode times the policy measures are
	// microseconds of scheduling noise; its speed-based diverts (tested in scoring) would
	// act on that noise on a busy machine. This test is about homes, so they are off,
	// which also shows policy.placement reaching the policy.
	cfg.Policy.Name, cfg.Policy.Fallback = "placement", "least-load"
	cfg.Policy.Placement.DivertDeadline, cfg.Policy.Placement.DivertMisses = false, false
	a := startApp(t, cfg, app.Options{Registry: prometheus.NewRegistry()})
	ext := dial(t, a.addrs.ExtProc)
	waitHealth(t, ext, app.ExtProcService, healthpb.HealthCheckResponse_SERVING)
	testwait.For(t, "both endpoints scraped", func() bool {
		n := 0
		for _, st := range a.Fleet().Status() {
			if st.State == fleet.StateHealthy {
				n++
			}
		}
		return n == 2
	})
	// The requests below must be tokenized, or they are placed by load.
	probe := fmt.Sprintf(`{"model":%q,"prompt":"hello"}`, model)
	if x, err := a.ExplainRoute("", []byte(probe)); err != nil || x.Tokens == 0 {
		t.Fatalf("the model's prompts are not tokenized: %+v, %v", x, err)
	} else if x.Kind != "" || !strings.Contains(x.Policy.Note, "without routing") {
		// Placement's pick changes its state: the debug view does not guess its kind.
		t.Errorf("placement explained as kind %q, note %q", x.Kind, x.Policy.Note)
	}
	client := extprocv3.NewExternalProcessorClient(ext)

	route := func(system string, i int) string {
		t.Helper()
		x, err := fakeenvoy.Start(context.Background(), client, fakeenvoy.FullDuplex())
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
			model, strings.Repeat(system+" ", 200), i)
		res, err := x.Request(fakeenvoy.Request{
			Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
				{Key: ":authority", Value: "gw"}, {Key: "content-type", Value: "application/json"}},
			Body: [][]byte{[]byte(body)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := x.ResponseHeaders(fakeenvoy.Headers{{Key: ":status", Value: "200"}}, true, nil); err != nil {
			t.Fatal(err)
		}
		got := res.Headers.Values("x-gateway-destination-endpoint")
		if len(got) != 1 {
			t.Fatalf("destination = %q", got)
		}
		return got[0]
	}

	home := route("alpha beta gamma", 0)
	for i := 1; i < 6; i++ {
		if got := route("alpha beta gamma", i); got != home {
			t.Fatalf("request %d of the same prefix went to %s, its home is %s", i, got, home)
		}
	}
	other := route("delta epsilon zeta", 0)
	if other == home {
		t.Fatalf("a second prefix was placed on %s, the first prefix's home, while the other endpoint held none", other)
	}
	for i := 1; i < 4; i++ {
		if got := route("delta epsilon zeta", i); got != other {
			t.Fatalf("request %d of the second prefix went to %s, its home is %s", i, got, other)
		}
	}
}
