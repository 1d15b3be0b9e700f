package demo_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/testbench/demo"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// TestFaultsShort is the fault suite's short version (make test): the binaries built
// from this tree, one stack of child processes on loopback, each fault in turn under
// load. It checks what is fixed at this commit: no fault fails a request because of the
// router (a killed pod's requests are retried on a fallback endpoint unless the pod was
// answering them; kvrouter's own restart fails requests while it is down; both counted
// apart), every fault ends with routing KV-aware again, the index never holds
// more blocks for a server than the server caches, and exactly as many for the servers
// with a replay socket.
func TestFaultsShort(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs a stack of processes")
	}
	bin := buildStack(t)
	fo := demo.ShortFaultOptions()
	fo.TokenizerDir = testmodels.Dir(t, "qwen3")
	fo.Process.BinDir, fo.Process.WorkDir = bin, t.TempDir()
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
		if r.DivergenceBlocks == nil {
			t.Errorf("%s: index divergence not measured", r.Fault)
			continue
		}
		for i, d := range r.DivergenceByServer {
			// Every fault ends with no entry the server does not cache; with a
			// replay socket, with exactly what it caches (kvrouter restarted
			// included: the rebuild on connect).
			if d > 0 || (d != 0 && i < fo.Workers-fo.Process.WithoutReplay) {
				t.Errorf("%s: server %d: index minus cache %d blocks", r.Fault, i, d)
			}
		}
		if r.FailedRouter > 0 {
			t.Errorf("%s: %d of %d requests failed because of the router", r.Fault, r.FailedRouter, r.Requests)
		}
		if strings.HasPrefix(r.Fault, "SIGHUP") && strings.Contains(r.Note, "exited") {
			t.Errorf("%s: %s", r.Fault, r.Note)
		}
	}
}
