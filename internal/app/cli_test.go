package app_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/app"
)

func TestMain_CommandLine(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string // substring
		stderrLine string // exact first line of stderr, when set
	}{
		{"check-config ok", []string{"check-config", "../../config/testdata/valid.yaml"}, 0, "valid.yaml: ok", ""},
		{"check-config per-pod", []string{"check-config", "../../config/testdata/valid.yaml"}, 0, "kv events: per-pod mode", ""},
		{"check-config central", []string{"check-config", "../../config/testdata/valid-central.yaml"}, 0,
			"kv events: central mode: pods connect to tcp://*:5557 (rank r to port + r) and publish on kv@<pod-ip:port>@<model>; run ONE kvrouter replica", ""},
		{"check-config problems", []string{"check-config", "../../config/testdata/invalid/address-hostname.yaml"}, 1, "",
			`../../config/testdata/invalid/address-hostname.yaml:3: endpoints[0].address: "vllm-0:8000": host must be an IP address, not a name (Envoy's ORIGINAL_DST cluster needs ip:port)`},
		{"check-config TLS files ok", []string{"check-config", "../../config/testdata/valid-tls.yaml"}, 0, "valid-tls.yaml: ok", ""},
		{"check-config TLS key of another certificate", []string{"check-config", "../../config/testdata/invalid/tls-key-mismatch.yaml"}, 1, "",
			"../../config/testdata/invalid/tls-key-mismatch.yaml:4: listen.tls.cert_file: cannot load the certificate and key_file: tls: private key does not match public key"},
		{"check-config missing file", []string{"check-config", "no-such.yaml"}, 1, "", "config: open no-such.yaml: no such file or directory"},
		{"check-config without file", []string{"check-config"}, 2, "", "usage: kvrouter check-config FILE"},
		{"no config flag", nil, 2, "", "kvrouter: a KV-cache-aware router for vLLM fleets, serving Envoy's ext_proc."},
		{"bad log level", []string{"--config", "x.yaml", "--log-level", "loud"}, 2, "", ""},
		{"invalid config file", []string{"--config", "../../config/testdata/invalid/no-endpoints.yaml"}, 1, "",
			"../../config/testdata/invalid/no-endpoints.yaml:2: endpoints: at least one endpoint is required (or configure discovery)"},
		{"help", []string{"--help"}, 0, "", "kvrouter: a KV-cache-aware router for vLLM fleets, serving Envoy's ext_proc."},
		{"-h", []string{"-h"}, 0, "", "kvrouter: a KV-cache-aware router for vLLM fleets, serving Envoy's ext_proc."},
		{"the Inference Extension picker's flags are refused with the usage", []string{"--pool-name", "vllm-qwen"}, 2, "",
			"flag provided but not defined: -pool-name"},
		{"check-config --help", []string{"check-config", "--help"}, 0, "", "usage: kvrouter check-config FILE"},
		{"check-config -h", []string{"check-config", "-h"}, 0, "", "usage: kvrouter check-config FILE"},
		{"check-config unknown flag", []string{"check-config", "--strict", "x.yaml"}, 2, "", "flag provided but not defined: -strict"},
		{"check-config two files", []string{"check-config", "a.yaml", "b.yaml"}, 2, "", "usage: kvrouter check-config FILE"},
		{"check-config file after --", []string{"check-config", "--", "--help"}, 1, "", "config: open --help: no such file or directory"},
		{"tokenize --help", []string{"tokenize", "--help"}, 0, "",
			"usage: kvrouter tokenize --model-dir DIR [--default-chat-template-kwargs JSON] < bodies.jsonl"},
		{"tokenize -h", []string{"tokenize", "-h"}, 0, "",
			"usage: kvrouter tokenize --model-dir DIR [--default-chat-template-kwargs JSON] < bodies.jsonl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := app.Main(tc.args, &out, &errOut)
			if code != tc.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tc.code, errOut.String())
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q lacks %q", out.String(), tc.stdout)
			}
			if tc.stderrLine != "" {
				if first, _, _ := strings.Cut(errOut.String(), "\n"); first != tc.stderrLine {
					t.Errorf("stderr first line\n%q\nwant\n%q", first, tc.stderrLine)
				}
			}
		})
	}
}

// TestCheckConfig_LoadsModels checks that check-config refuses exactly the model files
// that stop the process at start, with the reason, and accepts a loadable model.
func TestCheckConfig_LoadsModels(t *testing.T) {
	tests := []struct {
		name, file, stderr string
	}{
		{"no tokenizer_config.json", "testdata/check-config/no-config.yaml", "tokenizer_config.json: no such file or directory"},
		{"truncated tokenizer.json", "testdata/check-config/truncated.yaml", "models.m: "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if code := app.Main([]string{"check-config", tc.file}, &out, &errOut); code != 1 {
				t.Errorf("check-config exit %d, want 1 (stdout %q)", code, out.String())
			}
			if !strings.Contains(errOut.String(), tc.stderr) {
				t.Errorf("check-config stderr %q lacks %q", errOut.String(), tc.stderr)
			}
			// Start-up refuses the same file, before listening on anything.
			out.Reset()
			errOut.Reset()
			if code := app.Main([]string{"--config", tc.file}, &out, &errOut); code != 1 {
				t.Errorf("start-up exit %d, want 1", code)
			}
			if !strings.Contains(errOut.String(), "cannot start") {
				t.Errorf("start-up stderr %q lacks \"cannot start\"", errOut.String())
			}
		})
	}
	t.Run("loadable model", func(t *testing.T) {
		var out, errOut bytes.Buffer
		if code := app.Main([]string{"check-config", "../../config/testdata/valid.yaml"}, &out, &errOut); code != 0 {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
		if !strings.Contains(out.String(), "model tokenized for KV-aware routing") {
			t.Errorf("stdout %q lacks the model's load note", out.String())
		}
	})
}

// kvrouter --version prints the build on stdout and exits 0, without a configuration.
func TestMain_Version(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := app.Main([]string{"--version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	if !regexp.MustCompile(`^kvrouter \S+ \(commit \S+\)\n$`).MatchString(out.String()) || errOut.Len() != 0 {
		t.Errorf("stdout %q, stderr %q; want one line: kvrouter VERSION (commit REVISION)", out.String(), errOut.String())
	}
}

// kvrouter --help names the log level's default and, for a user coming from the Inference
// Extension's picker, the configuration fields its flags became; a refused picker flag
// prints the same usage.
func TestMain_HelpText(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"--grpc-port", "9002"}} {
		var out, errOut bytes.Buffer
		app.Main(args, &out, &errOut)
		for _, want := range []string{
			"-log-level LEVEL", "(default info)", "-config FILE",
			"--pool-name, --pool-namespace: discovery.kubernetes.inference_pool, .namespace",
			"--grpc-port: listen.extproc (:9002)", "--grpc-health-port: listen.health (:9003, plaintext)",
			"--metrics-port: listen.metrics (:9090)", "--secure-serving, --cert-path: listen.tls",
		} {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("kvrouter %v: usage lacks %q:\n%s", args, want, errOut.String())
			}
		}
	}
}
