package config_test

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc"
)

// wantProblems reads the "# want: LINE: path: message" lines of a fixture; {DIR} stands
// for the absolute path of testdata.
func wantProblems(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := filepath.Abs(filepath.Join(filepath.Dir(path), ".."))
	var want []string
	for _, line := range strings.Split(string(data), "\n") {
		if w, ok := strings.CutPrefix(line, "# want: "); ok {
			want = append(want, strings.ReplaceAll(w, "{DIR}", dir))
		}
	}
	if len(want) == 0 {
		t.Fatalf("%s has no \"# want:\" line", path)
	}
	return want
}

func TestLoadInvalid(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			abs, _ := filepath.Abs(file)
			want := wantProblems(t, abs)
			cfg, err := config.Load(abs)
			if err == nil {
				t.Fatalf("Load accepted the file: %+v", cfg)
			}
			var cerr *config.Error
			if !errors.As(err, &cerr) {
				t.Fatalf("error is %T (%v), want *config.Error", err, err)
			}
			var got []string
			for _, p := range cerr.Problems {
				s := fmt.Sprintf("%d: ", p.Line)
				if p.Path != "" {
					s += p.Path + ": "
				}
				got = append(got, s+p.Msg)
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			// The error text is what check-config prints: FILE:LINE: path: message.
			first := strings.SplitN(err.Error(), "\n", 2)[0]
			if wantFirst := abs + ":" + want[0]; first != wantFirst {
				t.Errorf("Error() first line = %q, want %q", first, wantFirst)
			}
		})
	}
}

func TestLoadValid(t *testing.T) {
	cfg, err := config.Load("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := filepath.Abs("testdata")
	tests := []struct {
		name      string
		got, want any
	}{
		{"listen defaults", cfg.Listen, config.DefaultListenConfig()},
		{"policy defaults", cfg.Policy, config.DefaultPolicyConfig()},
		{"limits defaults", cfg.Limits, config.DefaultLimitsConfig()},
		{"tokenizer dir resolved", cfg.Models["m"].Tokenizer, filepath.Join(dir, "tokenizer")},
		{"block size default", cfg.Models["m"].BlockSize, 16},
		{"block size set", cfg.Models["n"].BlockSize, 32},
		{"tokenizer file resolved", cfg.Models["n"].TokenizerJSON, filepath.Join(dir, "tokenizer/tokenizer.json")},
		{"endpoint", cfg.Endpoints[0].Address, "127.0.0.1:8000"},
		{"fleet scrape settings", cfg.Fleet().Scrape, config.DefaultLimitsConfig().Scrape},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if fmt.Sprint(tc.got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

func TestExamplesParse(t *testing.T) {
	files, _ := filepath.Glob("../examples/*.yaml")
	n := 0
	for _, file := range files {
		if strings.HasPrefix(filepath.Base(file), "envoy") {
			continue
		}
		n++
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			// Parse, not Load: the example names tokenizer directories of a deployment.
			cfg, err := config.Parse(data, file)
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Endpoints) == 0 {
				t.Error("example has no endpoints")
			}
		})
	}
	if n == 0 {
		t.Fatal("no example configuration found")
	}
}

func TestDefaultsOverridden(t *testing.T) {
	doc := `
endpoints: [{address: "127.0.0.1:1", models: [m]}]
listen: {metrics: "127.0.0.1:0"}
limits: {drain_timeout: 2s, metrics_scrape_interval: 250ms, metrics_scrape_timeout: 100ms, metrics_staleness_limit: 1s}
policy: {name: kv, kv: {prefill_load_scale: 0.5}, placement: {prefix_depth: 3, sticky_holders: false, hold_max: 80ms}}
`
	cfg, err := config.Parse([]byte(doc), "inline")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		got, want any
	}{
		{"listen.metrics", cfg.Listen.Metrics, "127.0.0.1:0"},
		{"listen.extproc default", cfg.Listen.ExtProc, ":9002"},
		{"drain_timeout", cfg.Limits.DrainTimeout, 2 * time.Second},
		{"scrape interval", cfg.Limits.Scrape.Interval, 250 * time.Millisecond},
		{"failures default", cfg.Limits.Scrape.FailuresBeforeIneligible, 3},
		{"max body default", cfg.Limits.MaxBodyBytes, 16 << 20},
		{"policy name", cfg.Policy.Name, "kv"},
		{"policy fallback default", cfg.Policy.Fallback, "least-load"},
		{"kv weight", cfg.Policy.KV.PrefillLoadScale, 0.5},
		{"overlap credit default", cfg.Policy.KV.OverlapCredit, 1.0},
		{"placement int", cfg.Policy.Placement.PrefixDepth, 3},
		{"placement bool", cfg.Policy.Placement.StickyHolders, false},
		{"placement duration", cfg.Policy.Placement.HoldMax, 80 * time.Millisecond},
		{"placement default", cfg.Policy.Placement.Fill, 0.5},
		{"index headroom default", cfg.KV.Index.Headroom, 1.1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

// The objectives map decodes onto names and priorities; shedding is on by default and
// an explicit 0 turns it off.
func TestObjectivesAndShedDefault(t *testing.T) {
	tests := []struct {
		name     string
		doc      string
		want     map[string]int
		wantShed int
	}{
		{name: "none: shed sheddable past the default", doc: "", want: nil, wantShed: extproc.DefaultShedWaiting},
		{name: "objectives", doc: "objectives: {batch: -1, chat: 10, default: 0}\n",
			want: map[string]int{"batch": -1, "chat": 10, "default": 0}, wantShed: extproc.DefaultShedWaiting},
		{name: "explicit 0 never sheds", doc: "limits: {shed_queue_depth: 0}\n", wantShed: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte("endpoints: [{address: \"127.0.0.1:1\", models: [m]}]\n"+tc.doc), "inline")
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(cfg.Objectives, tc.want) {
				t.Errorf("objectives %v, want %v", cfg.Objectives, tc.want)
			}
			for name, p := range tc.want {
				if got, ok := cfg.Objectives.Priority(name); !ok || got != p {
					t.Errorf("Priority(%q) = %d, %v", name, got, ok)
				}
			}
			if _, ok := cfg.Objectives.Priority("unknown"); ok {
				t.Error("an unknown objective is known")
			}
			if cfg.Limits.ShedQueueDepth != tc.wantShed {
				t.Errorf("shed_queue_depth %d, want %d", cfg.Limits.ShedQueueDepth, tc.wantShed)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := config.Load("testdata/no-such-file.yaml")
	var cerr *config.Error
	if err == nil || errors.As(err, &cerr) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want a wrapped os.ErrNotExist", err)
	}
}

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	files = append(files, "testdata/valid.yaml", "../examples/kvrouter.yaml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data, "fuzz")
		if err == nil {
			if cfg == nil {
				t.Fatal("nil config without error")
			}
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("Parse accepted a config that fails Validate: %v", verr)
			}
			// A rewrite rule accepted at load is one a request can use.
			if _, terr := cfg.ModelRewrites.Table(); terr != nil {
				t.Fatalf("Parse accepted model_rewrites the table refuses: %v", terr)
			}
			return
		}
		var cerr *config.Error
		if errors.As(err, &cerr) && len(cerr.Problems) == 0 {
			t.Fatal("*config.Error without problems")
		}
	})
}

func TestLoadValidTLS(t *testing.T) {
	cfg, err := config.Load("testdata/valid-tls.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := filepath.Abs("testdata/tls")
	tests := []struct {
		name      string
		got, want any
	}{
		{"tls enabled", cfg.Listen.TLS.Enabled(), true},
		{"not self-signed", cfg.Listen.TLS.SelfSigned(), false},
		{"cert file resolved", cfg.Listen.TLS.CertFile, filepath.Join(dir, "server.crt")},
		{"key file resolved", cfg.Listen.TLS.KeyFile, filepath.Join(dir, "server.key")},
		{"client CA resolved", cfg.Listen.TLS.ClientCAFile, filepath.Join(dir, "ca.crt")},
		{"debug off", cfg.Listen.Debug, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	d := config.DefaultListenConfig()
	if !d.TLS.SelfSigned() || d.Debug != "127.0.0.1:9091" {
		t.Errorf("defaults: TLS %+v, debug %q; want self-signed TLS and a loopback debug port", d.TLS, d.Debug)
	}
}
