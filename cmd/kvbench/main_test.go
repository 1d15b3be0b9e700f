package main

import (
	"context"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantOut string
		wantErr string
	}{
		{"one sim cell", []string{"--sim", "--policy", "random", "--requests", "24", "--output-tokens", "10", "--progress", "never"},
			"random W=6 N=7 C=8", ""},
		{"homogeneous fleet of another size", []string{"--sim", "--workers", "3", "--policy", "round-robin", "--requests", "12", "--progress", "never"},
			"round-robin W=3 N=7 C=8", ""},
		{"default policy is kv", []string{"--sim", "--requests", "24", "--output-tokens", "10", "--progress", "never"},
			"kv W=6 N=7 C=8", ""},
		{"no target", nil, "", "choose --url URL or --sim"},
		{"both targets", []string{"--sim", "--url", "http://x"}, "", "choose one"},
		{"unknown policy", []string{"--sim", "--policy", "nope"}, "", "unknown policy"},
		{"bad list", []string{"--sim", "--prefixes", "2,x"}, "", "not an integer"},
		{"speeds for another fleet", []string{"--sim", "--workers", "2", "--speed-factors", "1,1,1"}, "", "3 values for 2 workers"},
		{"bad churn", []string{"--sim", "--churn", "soon"}, "", "churn"},
		{"bad progress", []string{"--sim", "--progress", "maybe"}, "", "--progress"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut strings.Builder
			err := run(context.Background(), tt.args, &out, &errOut)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, errOut.String())
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("output lacks %q:\n%s", tt.wantOut, out.String())
			}
		})
	}
}
