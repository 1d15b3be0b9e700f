package envoy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/envoy"
)

// TestRepositoryEnvoyConfigs loads, validates and checks every envoy*.yaml in the
// repository, wherever it is: a configuration Envoy would reject fails CI.
func TestRepositoryEnvoyConfigs(t *testing.T) {
	var files []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		name := d.Name()
		if !d.IsDir() && strings.HasPrefix(name, "envoy") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"envoy.yaml", "envoy-buffered.yaml", "envoy-failopen.yaml"} {
		found := false
		for _, f := range files {
			found = found || f == filepath.Join("..", "envoy", want)
		}
		if !found {
			t.Errorf("envoy/%s not found among %v", want, files)
		}
	}
	for _, file := range files {
		t.Run(strings.TrimPrefix(file, "../"), func(t *testing.T) {
			b, err := envoy.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := envoy.Check(b); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestInvalidConfigs proves each check fails: every fixture breaks one rule and must be
// rejected with the message in its "# want:" line.
func TestInvalidConfigs(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) == 0 {
		t.Fatal("no fixtures")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := strings.Cut(string(data), "\n")
			want, ok := strings.CutPrefix(first, "# want: ")
			if !ok {
				t.Fatal("fixture lacks a \"# want:\" first line")
			}
			b, err := envoy.Parse(data)
			if err == nil {
				err = envoy.Check(b)
			}
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error:\n%v\nwant it to contain %q", err, want)
			}
		})
	}
}
