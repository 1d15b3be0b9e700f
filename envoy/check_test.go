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
		if d.IsDir() || !strings.HasPrefix(name, "envoy") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			return nil
		}
		// Helm templates and Kubernetes objects (an EnvoyFilter, a ConfigMap carrying a
		// bootstrap) are not bootstraps themselves: the examples package renders and
		// decodes them, and checks the bootstraps and patches they carry with this
		// package's Load and Check.
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), "..", "Chart.yaml")); err == nil && filepath.Base(filepath.Dir(path)) == "templates" {
			return nil
		}
		if isKubernetesObject(t, path) {
			return nil
		}
		files = append(files, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"envoy.yaml", "envoy-fallbacks.yaml", "envoy-buffered.yaml", "envoy-failopen.yaml"} {
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

// isKubernetesObject reports whether the YAML file declares apiVersion and kind at the
// top level, as every Kubernetes object does and no Envoy bootstrap can.
func isKubernetesObject(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var api, kind bool
	for _, line := range strings.Split(string(b), "\n") {
		api = api || strings.HasPrefix(line, "apiVersion:")
		kind = kind || strings.HasPrefix(line, "kind:")
	}
	return api && kind
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
