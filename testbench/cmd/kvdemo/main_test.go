package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// -h and --help print the usage and exit 0, for kvdemo and each subcommand; an error exits
// 1 with its message. The usage names the default --tokenizer: qwen3 under
// $KVROUTER_MODELS_DIR, where `make models` put it, so that kvdemo run directly (not
// through make demo) uses the same files.
func TestExitCodeAndDefaultTokenizer(t *testing.T) {
	models := t.TempDir()
	t.Setenv(testmodels.EnvDir, models)
	tok := `(default "` + filepath.Join(models, "qwen3") + `")`
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // substring
	}{
		{"-h", []string{"-h"}, 0, tok},
		{"--help", []string{"--help"}, 0, "-policies"},
		{"latency -h", []string{"latency", "-h"}, 0, tok},
		{"faults -h", []string{"faults", "-h"}, 0, tok},
		{"replicas -h", []string{"replicas", "--help"}, 0, tok},
		{"unknown flag", []string{"--nope"}, 1, "flag provided but not defined: -nope"},
		{"extra argument", []string{"extra"}, 1, `kvdemo: unexpected arguments ["extra"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut strings.Builder
			if code := exitCode(run(context.Background(), tt.args, &out, &errOut), &errOut); code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, errOut.String())
			}
			if !strings.Contains(errOut.String(), tt.stderr) {
				t.Errorf("stderr %q lacks %q", errOut.String(), tt.stderr)
			}
		})
	}
}
