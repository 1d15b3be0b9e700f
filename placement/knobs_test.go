package placement_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/placement"
)

// TestParseKnob: each kind of field parses by its type, a value of the wrong type and
// an unknown or internal name are refused.
func TestParseKnob(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		check      func(c placement.Config) bool
		wantErr    string
	}{
		{"prefix_depth", "3", func(c placement.Config) bool { return c.PrefixDepth == 3 }, ""},
		{"fill", "0.25", func(c placement.Config) bool { return c.Fill == 0.25 }, ""},
		{"scraped_load", "true", func(c placement.Config) bool { return c.ScrapedLoad }, ""},
		{"hold_max", "80ms", func(c placement.Config) bool { return c.HoldMax == 80*time.Millisecond }, ""},
		{"prefix_depth", "4.9", nil, "prefix_depth"},
		{"sticky_holders", "0.2", nil, "sticky_holders"},
		{"hold_max", "120", nil, "hold_max"},
		{"block_size", "32", nil, "unknown knob"},
		{"nope", "1", nil, "unknown knob"},
	} {
		t.Run(tc.name+"="+tc.text, func(t *testing.T) {
			c := placement.DefaultConfig()
			err := c.ParseKnob(tc.name, tc.text)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseKnob = %v, want an error naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("ParseKnob = %v, config %+v", err, c)
			}
		})
	}
}

// TestKnobNames lists every user-facing field once and hides the runner-set block size.
func TestKnobNames(t *testing.T) {
	names := placement.KnobNames()
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("%q listed twice", n)
		}
		seen[n] = true
		if err := (&placement.Config{}).ParseKnob(n, "x"); err == nil || strings.Contains(err.Error(), "unknown knob") {
			t.Errorf("ParseKnob(%q, x) = %v, want a parse error", n, err)
		}
	}
	if seen["block_size"] || !seen["holder_share"] || !seen["hold_max"] {
		t.Errorf("KnobNames() = %v", names)
	}
}
