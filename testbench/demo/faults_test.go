package demo_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/testbench/demo"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// TestFaultsShort is the fault suite's short version (make test): the binaries built
// from this tree, one stack of child processes on loopback, each fault in turn under
// load. It checks what is fixed at this commit: a reload (good or bad) and the floods
// fail no request and leave the index equal to the servers' caches, and every fault ends
// with routing KV-aware again.
func TestFaultsShort(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs a stack of processes")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./cmd/kvrouter", "./testbench/cmd/vllm-sim", "./testbench/cmd/devgateway")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fo := demo.ShortFaultOptions()
	fo.TokenizerDir = testmodels.Dir(t, "qwen3")
	fo.Process = demo.ProcessOptions{BinDir: bin, WorkDir: t.TempDir()}
	if testing.Verbose() {
		fo.Log = os.Stderr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rows, err := demo.RunFaults(ctx, fo)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := demo.WriteFaults(&b, rows); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	for _, r := range rows {
		if r.KVAwareAfterMS < 0 {
			t.Errorf("%s: routing not KV-aware again within the bound", r.Fault)
		}
		fixed := strings.HasPrefix(r.Fault, "SIGHUP") || strings.Contains(r.Fault, "metrics endpoint stalled") || strings.Contains(r.Fault, "idle streams") ||
			strings.Contains(r.Fault, "TCP connections") || strings.Contains(r.Fault, "bodies")
		if !fixed {
			continue
		}
		if r.Failed > 0 {
			t.Errorf("%s: %d of %d requests failed", r.Fault, r.Failed, r.Requests)
		}
		if r.DivergenceBlocks == nil || *r.DivergenceBlocks != 0 {
			t.Errorf("%s: index divergence %v blocks, want 0", r.Fault, r.DivergenceBlocks)
		}
		if strings.HasPrefix(r.Fault, "SIGHUP") && strings.Contains(r.Note, "exited") {
			t.Errorf("%s: %s", r.Fault, r.Note)
		}
	}
}
