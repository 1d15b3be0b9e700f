package main

import (
	"context"
	"testing"

	"github.com/kvrouter/kvrouter/kvbench"
)

// cachedRatio runs one small sim cell and returns its measured cached-token ratio.
func cachedRatio(t *testing.T, policy string, prefixes, concurrency int) float64 {
	t.Helper()
	wl := kvbench.DefaultWorkloadConfig()
	wl.Prefixes, wl.Warmup, wl.Requests = prefixes, 60, 180
	w, err := kvbench.NewWorkload(wl, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := kvbench.DefaultSimConfig()
	sc.Policies = newRouter
	out, err := kvbench.RunSim(context.Background(), sc, w, policy, concurrency, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cached, prompt int
	for _, r := range out.Results {
		if r.Err != "" {
			t.Fatalf("%s: request %d failed: %s", policy, r.Seq, r.Err)
		}
		if !r.Warmup {
			cached += r.CachedTokens
			prompt += r.PromptTokens
		}
	}
	return float64(cached) / float64(prompt)
}

func TestPlacementBeatsKVInSim(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		prefixes, concurrency int
		margin                float64
	}{
		{"N=12 C=8", 12, 8, 0.1},
		{"N=7 C=16", 7, 16, 0.03},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := cachedRatio(t, "kv", tc.prefixes, tc.concurrency)
			pl := cachedRatio(t, "placement", tc.prefixes, tc.concurrency)
			t.Logf("cached-token ratio: kv %.3f, placement %.3f", kv, pl)
			if pl < kv+tc.margin {
				t.Fatalf("placement %.3f, want at least kv's %.3f + %.2f", pl, kv, tc.margin)
			}
		})
	}
}
