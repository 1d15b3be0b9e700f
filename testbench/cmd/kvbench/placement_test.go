package main

import (
	"context"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/testbench/kvbench"
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
	rs, err := newRouters()
	if err != nil {
		t.Fatal(err)
	}
	sc.Policies = rs.router
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

func TestParsePlacement(t *testing.T) {
	for _, tc := range []struct {
		name, spec, wantErr string
	}{
		{"empty keeps defaults", "", ""},
		{"overrides", "balance=1.25,sticky_holders=true,fill=0.4,divert_deadline=false", ""},
		{"not key=value", "balance", "not key=value"},
		{"unknown key", "speed=2", "unknown knob"},
		{"integer knob given a fraction", "prefix_depth=4.9", "prefix_depth"},
		{"duration knob", "hold_max=80ms", ""},
		{"bad number", "fill=lots", "fill"},
		{"invalid value", "fill=2", "fill: must be in (0, 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := placement.DefaultConfig()
			err := parsePlacement(tc.spec, &c)
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("parsePlacement(%q) = %v, want error containing %q", tc.spec, err, tc.wantErr)
			}
		})
	}
	c := placement.DefaultConfig()
	if err := parsePlacement("balance=1.25,sticky_holders=false", &c); err != nil || c.Balance != 1.25 || c.StickyHolders {
		t.Fatalf("overrides not applied: %+v, %v", c, err)
	}
}

func FuzzParsePlacement(f *testing.F) {
	f.Add("balance=1.25,sticky_holders=true")
	f.Add("fill=0.5,,=")
	f.Fuzz(func(t *testing.T, spec string) {
		c := placement.DefaultConfig()
		if err := parsePlacement(spec, &c); err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("accepted %q into an invalid config: %v", spec, verr)
			}
		}
	})
}
