// Package testmodels locates the tokenizer files that `make models` fetches into the
// git-ignored cache, for tests in any package. It only reads the file system.
package testmodels

import (
	"os"
	"path/filepath"
	"testing"
)

// EnvDir names the environment variable that overrides the cache directory.
const EnvDir = "KVROUTER_MODELS_DIR"

// Root returns the models cache directory: $KVROUTER_MODELS_DIR, or .cache/models at
// the repository root (the directory holding go.mod above the working directory).
func Root() string {
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		return filepath.Join(".cache", "models")
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, ".cache", "models")
		}
		if filepath.Dir(d) == d {
			return filepath.Join(wd, ".cache", "models")
		}
	}
}

// Dir returns the directory of model name ("qwen3", "llama3") holding tokenizer.json
// and tokenizer_config.json. When the files are missing it fails the test under CI=true
// and skips it otherwise, telling how to fetch them.
func Dir(tb testing.TB, name string) string {
	tb.Helper()
	return DirWith(tb, name, "tokenizer.json", "tokenizer_config.json")
}

// DirWith is Dir for a model of which `make models` fetches only some files (for
// example tokenizer_config.json alone, for a chat-template-only proof).
func DirWith(tb testing.TB, name string, files ...string) string {
	tb.Helper()
	dir := filepath.Join(Root(), name)
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			msg := "model files missing (" + err.Error() + "): run `make models`"
			if os.Getenv("CI") == "true" {
				tb.Fatal(msg)
			} else {
				tb.Skip(msg)
			}
			return dir
		}
	}
	return dir
}
