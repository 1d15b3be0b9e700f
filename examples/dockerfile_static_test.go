//go:build dockerbuild

package examples_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDockerfileBuildsStatic runs the build stage's go build (same flags,
// CGO_ENABLED=0) and checks that every binary is a static ELF: no program interpreter,
// no shared library, no symbol table. -trimpath makes it recompile every dependency
// (minutes with client-go), so it runs only with the dockerbuild tag: make test-docker.
func TestDockerfileBuildsStatic(t *testing.T) {
	b := parseDockerfile(t, "../Dockerfile")
	if len(b.flags) == 0 || len(b.pkgs) == 0 {
		t.Fatalf("no go build command found: %+v", b)
	}
	var pkgs []string
	for _, p := range b.pkgs {
		if _, err := os.Stat(filepath.Join("..", p)); err != nil {
			// vllm-sim lives on the sim branch until it is merged.
			t.Logf("%s is not in this tree: not built", p)
			continue
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 || pkgs[0] != "./cmd/kvrouter" {
		t.Fatalf("./cmd/kvrouter must be built, found %v", pkgs)
	}
	out := t.TempDir()
	// The build arguments, as `docker build --build-arg` would set them.
	flags := make([]string, len(b.flags))
	for i, f := range b.flags {
		flags[i] = strings.NewReplacer("${VERSION}", "v0.0.0-test", "${COMMIT}", "0123abc").Replace(f)
	}
	args := append(append([]string{"build"}, flags...), "-o", out+"/")
	args = append(args, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	for _, p := range pkgs {
		bin := filepath.Join(out, filepath.Base(p))
		t.Run(filepath.Base(p), func(t *testing.T) {
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					t.Errorf("%s has a program interpreter: not static", bin)
				}
			}
			if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
				t.Errorf("%s needs shared libraries %v", bin, libs)
			}
			if f.Section(".symtab") != nil {
				t.Errorf("%s keeps its symbol table: -ldflags -s was not applied", bin)
			}
		})
	}
	// VERSION and COMMIT reach kvrouter --version (and inference_extension_info).
	if v, err := exec.Command(filepath.Join(out, "kvrouter"), "--version").Output(); err != nil || string(v) != "kvrouter v0.0.0-test (commit 0123abc)\n" {
		t.Errorf("kvrouter --version: %q, %v; want the build arguments", v, err)
	}
}
