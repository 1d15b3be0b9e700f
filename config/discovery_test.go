package config_test

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/discovery"
)

func TestLoadDiscovery(t *testing.T) {
	cfg, err := config.Load("testdata/valid-discovery.yaml")
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Discovery.Kubernetes
	if k == nil {
		t.Fatal("no kubernetes section")
	}
	tests := []struct {
		name      string
		got, want any
	}{
		{"pool", k.InferencePool, "vllm-qwen"},
		{"grace default", k.UnreadyGrace, 30 * time.Second},
		{"metrics path default", k.MetricsPath, "/metrics"},
		{"dns unset", cfg.Discovery.DNS == nil, true},
		{"events mode default", cfg.Discovery.KVEvents.Mode, discovery.ModePerPod},
		{"events port default", cfg.Discovery.KVEvents.Port, 5557},
		{"replay port", cfg.Discovery.KVEvents.ReplayPort, 5558},
		{"dp default", cfg.Discovery.KVEvents.DataParallelSize, 1},
		{"no static endpoint", len(cfg.Endpoints), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

func TestLoadCentral(t *testing.T) {
	cfg, err := config.Load("testdata/valid-central.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sc := cfg.Subscriber()
	if sc.Bind != "tcp://*:5557" || sc.AnySource {
		t.Errorf("subscriber bind %q any_source %v", sc.Bind, sc.AnySource)
	}
	if sc.MaxMessageBytes != 1<<20 || sc.HandshakeTimeout != 2*time.Second {
		t.Errorf("subscriber max_message_bytes %d handshake_timeout %v, want 1048576 and 2s", sc.MaxMessageBytes, sc.HandshakeTimeout)
	}
	if got := cfg.Endpoints[0].KVEvents.CentralRanks; len(got) != 1 || got[0] != 0 {
		t.Errorf("central ranks %v", got)
	}
	perPod, err := config.Load("testdata/valid-discovery.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if sc := perPod.Subscriber(); sc.Bind != "" {
		t.Errorf("per-pod mode binds %q", sc.Bind)
	}
}
