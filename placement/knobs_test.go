package placement_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/placement"
)

// TestPlacementKnobs: every knob reads back what was set, by number and by text, and
// an unknown name is refused.
func TestPlacementKnobs(t *testing.T) {
	def := placement.DefaultConfig()
	for name, v := range def.Knobs() {
		t.Run(name, func(t *testing.T) {
			c := placement.DefaultConfig()
			want := v + 1
			if v == 1 && (name == "adopt_all" || name == "divert_on_full" || name == "divert_misses" || name == "sticky_holders" ||
				name == "rehome_lost" || name == "prefer_held" || name == "unplace_diverted") {
				want = 0
			}
			if !c.SetKnob(name, want) {
				t.Fatalf("SetKnob(%q) says unknown", name)
			}
			if got := c.Knobs()[name]; got != want {
				t.Errorf("after SetKnob(%q, %v) the knob reads %v", name, want, got)
			}
			if got := c.Knobs(); len(got) != len(def.Knobs()) {
				t.Errorf("knob count changed: %d", len(got))
			}
		})
	}
	c := placement.DefaultConfig()
	if c.SetKnob("nope", 1) {
		t.Error("SetKnob accepted an unknown name")
	}
	if err := c.ParseKnob("nope", "1"); err == nil {
		t.Error("ParseKnob accepted an unknown name")
	}
	if err := c.ParseKnob("prefix_depth", "1.5"); err == nil {
		t.Error("ParseKnob accepted 1.5 for an integer knob")
	}
	if err := c.ParseKnob("fill", "0.25"); err != nil || c.Fill != 0.25 {
		t.Errorf("ParseKnob(fill, 0.25): %v, fill %v", err, c.Fill)
	}
	if err := c.ParseKnob("scraped_load", "true"); err != nil || !c.ScrapedLoad {
		t.Errorf("ParseKnob(scraped_load, true): %v, %v", err, c.ScrapedLoad)
	}
}
