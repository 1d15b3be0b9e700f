package testmodels_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// recorder is a testing.TB that records Fatal and Skip instead of stopping.
type recorder struct {
	testing.TB
	fatal, skip int
}

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.fatal++ }
func (r *recorder) Skip(args ...any)  { r.skip++ }

func TestDir(t *testing.T) {
	empty := t.TempDir()
	full := t.TempDir()
	if err := os.MkdirAll(filepath.Join(full, "m"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if err := os.WriteFile(filepath.Join(full, "m", f), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name, root, ci string
		fatal, skip    bool
	}{
		{"missing under CI fails", empty, "true", true, false},
		{"missing elsewhere skips", empty, "", false, true},
		{"present", full, "true", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(testmodels.EnvDir, c.root)
			t.Setenv("CI", c.ci)
			r := &recorder{TB: t}
			dir := testmodels.Dir(r, "m")
			if (r.fatal > 0) != c.fatal || (r.skip > 0) != c.skip {
				t.Errorf("fatal %d skip %d, want fatal %v skip %v", r.fatal, r.skip, c.fatal, c.skip)
			}
			if want := filepath.Join(c.root, "m"); dir != want {
				t.Errorf("Dir = %q, want %q", dir, want)
			}
		})
	}
	t.Setenv(testmodels.EnvDir, "")
	if root := testmodels.Root(); filepath.Base(root) != "models" || filepath.Base(filepath.Dir(root)) != ".cache" {
		t.Errorf("default Root() = %q, want <repo>/.cache/models", root)
	}
}
