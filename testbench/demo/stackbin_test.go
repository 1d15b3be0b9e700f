package demo_test

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// buildStack builds, from this tree, the binaries a fault suite's stack runs (kvrouter,
// vllm-sim, the dev gateway) into a directory of the test's and returns it.
func buildStack(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./cmd/kvrouter", "./testbench/cmd/vllm-sim", "./testbench/cmd/devgateway")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
