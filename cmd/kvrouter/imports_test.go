package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestRouterImportsNoTestbench keeps what ships apart from what tests it: the kvrouter
// binary links no package of the test bench (simulator, benchmark, demo, dev gateway,
// fake Envoy).
func TestRouterImportsNoTestbench(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "/testbench/") || strings.HasSuffix(p, "/testbench") {
			t.Errorf("kvrouter links %s", p)
		}
	}
}
