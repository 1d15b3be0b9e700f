package chattemplate_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// python is Debian's interpreter; .ci/run installs python3-jinja2 for it.
const python = "/usr/bin/python3"

// requireJinja2 skips when Debian's python3 lacks Jinja2, except under CI=true, where
// the goldens must be rebuilt.
func requireJinja2(t *testing.T) {
	t.Helper()
	out, err := exec.Command(python, "-c", "import jinja2").CombinedOutput()
	if err == nil {
		return
	}
	msg := fmt.Sprintf("rebuilding the goldens needs %s with Jinja2 (apt-get install python3-jinja2): %v: %s", python, err, out)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// TestGoldensRebuild reruns both golden generators with Python's Jinja2 into a
// temporary directory and requires every committed golden to be what they write: the
// goldens the Go tests compare against are Jinja2's output, not an edited file.
func TestGoldensRebuild(t *testing.T) {
	requireJinja2(t)
	for _, m := range modelTemplates {
		testmodels.DirWith(t, m, "tokenizer_config.json")
	}
	for _, g := range []struct{ script, golden string }{
		{filepath.Join("testdata", "gen_golden.py"), filepath.Join("testdata", "golden")},
		{filepath.Join("internal", "jinja", "testdata", "gen_golden.py"), filepath.Join("internal", "jinja", "testdata")},
	} {
		t.Run(g.script, func(t *testing.T) {
			out := t.TempDir()
			cmd := exec.Command(python, "-B", g.script)
			cmd.Env = append(os.Environ(), "GOLDEN_OUT="+out, testmodels.EnvDir+"="+testmodels.Root())
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", g.script, err, msg)
			}
			files, err := os.ReadDir(out)
			if err != nil {
				t.Fatal(err)
			}
			if len(files) == 0 {
				t.Fatal("the generator wrote nothing")
			}
			for _, f := range files {
				fresh, err := os.ReadFile(filepath.Join(out, f.Name()))
				if err != nil {
					t.Fatal(err)
				}
				committed, err := os.ReadFile(filepath.Join(g.golden, f.Name()))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(fresh, committed) {
					t.Errorf("%s differs from what %s writes: rerun it", filepath.Join(g.golden, f.Name()), g.script)
				}
			}
		})
	}
}
