package main

import (
	"strings"
	"testing"
)

// -h and --help print the usage and exit 0, as `vllm serve --help` does; a bad flag or
// value exits 1 with its message.
func TestExitCode(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // substring
	}{
		{"-h", []string{"-h"}, 0, "Usage of vllm-sim:"},
		{"--help", []string{"--help"}, 0, "-served-model-name"},
		{"unknown flag", []string{"--nope"}, 1, "flag provided but not defined: -nope"},
		{"bad replicas", []string{"--replicas", "0"}, 1, "vllm-sim: --replicas must be at least 1, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errOut strings.Builder
			if code := exitCode(run(tt.args, &errOut), &errOut); code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, errOut.String())
			}
			if !strings.Contains(errOut.String(), tt.stderr) {
				t.Errorf("stderr %q lacks %q", errOut.String(), tt.stderr)
			}
		})
	}
}
