package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/testbench/kvbench"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// TestRunChatWithRealTokenizer routes chat requests rendered with Qwen3's chat template and
// tokenized with the real tokenizer, as kvrouter does.
func TestRunChatWithRealTokenizer(t *testing.T) {
	dir := testmodels.Dir(t, "qwen3")
	var out, errOut strings.Builder
	args := []string{"--sim", "--api", "chat", "--tokenizer", dir, "--policy", "kv", "--requests", "24",
		"--output-tokens", "10", "--progress", "never"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "kv W=6 N=7 C=8") || strings.Contains(errOut.String(), "no tokenizer") {
		t.Errorf("output:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
}

// --gen-trace writes the committed test trace.
func TestGenTraceWritesTheCommittedTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"--gen-trace", path, "--trace-requests", "200"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../kvbench/testdata/trace-small.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("--gen-trace does not reproduce kvbench/testdata/trace-small.jsonl")
	}
}

// --gen-trace-shape picks the generator's shape: toolagent's trace differs from the
// default's and ends its conversations at --max-model-len; a bad shape, or the flag
// without --gen-trace, is an error.
func TestGenTraceShape(t *testing.T) {
	dir := t.TempDir()
	gen := func(args ...string) ([]kvbench.TraceRecord, error) {
		path := filepath.Join(dir, "t.jsonl")
		var out, errOut strings.Builder
		if err := run(context.Background(), append([]string{"--gen-trace", path, "--trace-requests", "300"}, args...), &out, &errOut); err != nil {
			return nil, err
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return kvbench.DecodeTrace(f, 0)
	}
	def, err := gen()
	if err != nil {
		t.Fatal(err)
	}
	tool, err := gen("--gen-trace-shape", "toolagent")
	if err != nil {
		t.Fatal(err)
	}
	if len(tool) != 300 || slices.EqualFunc(def, tool, func(a, b kvbench.TraceRecord) bool { return a.InputLength == b.InputLength }) {
		t.Errorf("toolagent wrote %d records, the same lengths as the default's", len(tool))
	}
	limited, err := gen("--gen-trace-shape", "conversation", "--max-model-len", "20000")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range limited {
		if r.InputLength+r.OutputLength > 20000 {
			t.Fatalf("request %d: %d + %d tokens, over --max-model-len 20000", i, r.InputLength, r.OutputLength)
		}
	}
	if _, err := gen("--gen-trace-shape", "agents"); err == nil || !strings.Contains(err.Error(), "unknown trace shape") {
		t.Errorf("bad shape: %v", err)
	}
	var out, errOut strings.Builder
	if err := run(context.Background(), []string{"--sim", "--gen-trace-shape", "toolagent"}, &out, &errOut); err == nil {
		t.Error("--gen-trace-shape without --gen-trace: no error")
	}
}

// The multi-turn chat workload through the router's real chat template and tokenizer.
func TestRunChatWorkload(t *testing.T) {
	dir := testmodels.Dir(t, "qwen3")
	var out, errOut strings.Builder
	args := []string{"--sim", "--workload", "chat", "--tokenizer", dir, "--policy", "kv", "--progress", "never"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "workload chat (sim mode, 6 servers") {
		t.Errorf("output:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
}

// --conversations sets how many conversations the chat workload starts: 6 conversations of 4
// to 8 turns are 24 to 48 requests (the default's 48 conversations are about 280).
func TestRunChatConversations(t *testing.T) {
	dir := testmodels.Dir(t, "qwen3")
	var out, errOut strings.Builder
	args := []string{"--sim", "--workload", "chat", "--conversations", "6", "--tokenizer", dir, "--policy", "kv", "--progress", "never"}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var n int
	if _, err := fmt.Sscanf(out.String(), "workload chat (sim mode, 6 servers, %d requests", &n); err != nil {
		t.Fatalf("no request count in the output (%v):\n%s", err, out.String())
	}
	if n < 6*4 || n > 6*8 {
		t.Errorf("6 conversations of 4 to 8 turns made %d requests", n)
	}
}

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantOut string
		wantErr string
	}{
		{"one sim cell", []string{"--sim", "--tokenizer", "none", "--policy", "random", "--requests", "24", "--output-tokens", "10", "--progress", "never"},
			"random W=6 N=7 C=8", ""},
		{"chat needs the template", []string{"--sim", "--tokenizer", "none", "--api", "chat", "--requests", "4", "--progress", "never"},
			"", "needs the chat template"},
		{"homogeneous fleet of another size", []string{"--sim", "--tokenizer", "none", "--workers", "3", "--policy", "round-robin", "--requests", "12", "--progress", "never"},
			"round-robin W=3 N=7 C=8", ""},
		{"default policy is placement", []string{"--sim", "--tokenizer", "none", "--requests", "24", "--output-tokens", "10", "--progress", "never"},
			"placement W=6 N=7 C=8", ""},
		{"no target", nil, "", "choose --url URL or --sim"},
		{"both targets", []string{"--sim", "--url", "http://x"}, "", "choose one"},
		{"unknown policy", []string{"--sim", "--policy", "nope"}, "", "unknown policy"},
		{"bad list", []string{"--sim", "--prefixes", "2,x"}, "", "not an integer"},
		{"speeds for another fleet", []string{"--sim", "--workers", "2", "--speed-factors", "1,1,1"}, "", "3 values for 2 workers"},
		{"bad churn", []string{"--sim", "--churn", "soon"}, "", "churn"},
		{"bad progress", []string{"--sim", "--tokenizer", "none", "--progress", "maybe"}, "", "--progress"},
		{"missing tokenizer", []string{"--sim", "--tokenizer", "/nonexistent"}, "", "loading the tokenizer"},
		{"trace replay", []string{"--sim", "--tokenizer", "none", "--policy", "kv,least-load", "--trace", "../../kvbench/testdata/trace-small.jsonl",
			"--trace-requests", "30", "--speedup", "4", "--kv-bytes", "4GiB", "--progress", "never"}, "workload trace (sim mode, 6 servers, 30 requests", ""},
		{"bad trace", []string{"--sim", "--tokenizer", "none", "--trace", "main.go"}, "", "trace line 1"},
		{"trace and workload", []string{"--sim", "--trace", "x", "--workload", "chat"}, "", "one of --trace and --workload"},
		{"zipf on a scripted workload", []string{"--sim", "--tokenizer", "none", "--workload", "chat", "--zipf", "1"}, "", "--zipf shapes the reference workload only"},
		{"output tokens on a trace", []string{"--sim", "--tokenizer", "none", "--trace", "x", "--output-tokens", "20"}, "", "--output-tokens shapes the reference workload only"},
		{"unknown workload", []string{"--sim", "--tokenizer", "none", "--workload", "poker"}, "", "--workload must be"},
		{"negative conversations", []string{"--sim", "--tokenizer", "none", "--workload", "chat", "--conversations", "-1"}, "", "invalid chat config"},
		{"chat workload needs the template", []string{"--sim", "--tokenizer", "none", "--workload", "chat"}, "", "need the model's tokenizer"},
		{"route log needs sim", []string{"--url", "http://127.0.0.1:1", "--tokenizer", "none", "--route-log", "x.jsonl"}, "", "--route-log needs --sim"},
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

// TestRunWritesRouteLog: --route-log gets a route, a first-token and a finish line per request.
func TestRunWritesRouteLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "routes.jsonl")
	var out, errOut strings.Builder
	args := []string{"--sim", "--tokenizer", "none", "--policy", "placement", "--requests", "12", "--output-tokens", "10",
		"--progress", "never", "--route-log", path}
	if err := run(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r, f := bytes.Count(raw, []byte(`"event":"route"`)), bytes.Count(raw, []byte(`"event":"first_token"`))
	if fin := bytes.Count(raw, []byte(`"event":"finish"`)); r != 12 || f != 12 || fin != 12 {
		t.Fatalf("route log has %d route, %d first_token and %d finish lines, want 12 each", r, f, fin)
	}
}

// The default --tokenizer is qwen3 in $KVROUTER_MODELS_DIR when set, as `make models`
// and the Makefile's demo targets decide.
func TestDefaultTokenizerFollowsModelsDir(t *testing.T) {
	// --progress maybe fails the run right after the tokenizer is loaded, before any sim.
	args := []string{"--sim", "--progress", "maybe"}
	t.Run("empty models dir", func(t *testing.T) {
		models := t.TempDir()
		t.Setenv(testmodels.EnvDir, models)
		var out, errOut strings.Builder
		if err := run(context.Background(), args, &out, &errOut); err == nil || !strings.Contains(err.Error(), "--progress") {
			t.Fatalf("err %v, want the --progress error", err)
		}
		if want := "no tokenizer in " + filepath.Join(models, "qwen3") + " "; !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q lacks %q", errOut.String(), want)
		}
	})
	t.Run("models dir with qwen3", func(t *testing.T) {
		models := filepath.Dir(testmodels.Dir(t, "qwen3"))
		t.Setenv(testmodels.EnvDir, models)
		var out, errOut strings.Builder
		if err := run(context.Background(), args, &out, &errOut); err == nil || !strings.Contains(err.Error(), "--progress") {
			t.Fatalf("err %v, want the --progress error", err)
		}
		if strings.Contains(errOut.String(), "no tokenizer") {
			t.Errorf("the tokenizer in %s was not loaded: %s", models, errOut.String())
		}
	})
}

// -h and --help print the usage and exit 0; an error exits 2 with its message.
func TestExitCode(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // substring
	}{
		{"-h", []string{"-h"}, 0, "usage: kvbench (--sim | --url URL) [flags]"},
		{"--help", []string{"--help"}, 0, "usage: kvbench (--sim | --url URL) [flags]"},
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined: -nope"},
		{"no target", nil, 2, "kvbench: choose --url URL or --sim"},
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
