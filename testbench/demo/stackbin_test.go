package demo_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// stackBin is the directory buildStack builds into, once for all the tests of a run
// (TestFaultsShort and TestReplicaFaultsShort run the same binaries); TestMain removes it.
var stackBin struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if stackBin.dir != "" {
		_ = os.RemoveAll(stackBin.dir)
	}
	os.Exit(code)
}

// buildStack builds, from this tree, the binaries a fault suite's stack runs (kvrouter,
// vllm-sim, the dev gateway) into a directory of the run's and returns it. They are
// linked once per run, without the symbol table and DWARF (-s -w, which a stack trace
// does not need): linking them is most of what the suites cost beyond their faults.
func buildStack(t *testing.T) string {
	t.Helper()
	stackBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "kvrouter-stack-")
		if err != nil {
			stackBin.err = err
			return
		}
		stackBin.dir = dir
		build := exec.Command("go", "build", "-ldflags=-s -w", "-o", dir+string(filepath.Separator),
			"./cmd/kvrouter", "./testbench/cmd/vllm-sim", "./testbench/cmd/devgateway")
		build.Dir = filepath.Join("..", "..")
		if out, err := build.CombinedOutput(); err != nil {
			stackBin.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if stackBin.err != nil {
		t.Fatal(stackBin.err)
	}
	return stackBin.dir
}
