package kvbench

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/testbench/sim/server"
)

// URL mode replays the trace against a simulated vLLM server over HTTP (token-id prompts,
// 1000x faster than real time): requests over max_model_len come back 400 and count as
// rejected; the rest are served, and repeated hash ids hit the server's prefix cache.
func TestTraceReplayURLMode(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.TimeScale = 1000
	cfg.EnablePromptTokensDetails = true
	cfg.Engine.MaxModelLen = 4096
	cfg.Engine.NumGPUBlocks = 4096
	s, err := server.New(cfg, server.Options{Registry: prometheus.NewRegistry()})
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
		<-done
	})
	recs := smallTrace(t)[:60]
	sc, err := NewTraceScript(recs, 200, nil)
	if err != nil {
		t.Fatal(err)
	}
	target, err := NewHTTPTarget(HTTPConfig{URL: hs.URL, Model: cfg.Model, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	out, err := target.RunScript(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	over := 0
	for i, r := range recs {
		res := out.Results[i]
		if r.InputLength+r.OutputLength > cfg.Engine.MaxModelLen {
			over++
			if !res.Rejected {
				t.Fatalf("request %d over max_model_len: %+v, want rejected", i, res)
			}
			continue
		}
		if res.Err != "" || res.PromptTokens != r.InputLength || res.OutputTokens != r.OutputLength {
			t.Fatalf("request %d: %+v for %d+%d tokens", i, res, r.InputLength, r.OutputLength)
		}
	}
	sum := SummarizeScript(out)
	if over == 0 || sum.Rejected != over || sum.Errors != 0 {
		t.Fatalf("summary %+v, want %d rejected and no errors", sum, over)
	}
	if want := TraceBound(recs, 16, cfg.Engine.MaxModelLen); sum.BoundCachedRatio < want-1e-9 || sum.BoundCachedRatio > want+1e-9 {
		t.Errorf("bound %v, want the trace's %v", sum.BoundCachedRatio, want)
	}
	if sum.CachedRatio <= 0 || sum.CachedRatio > sum.BoundCachedRatio+1e-9 {
		t.Errorf("cached ratio %v, want in (0, bound %v]", sum.CachedRatio, sum.BoundCachedRatio)
	}
}
