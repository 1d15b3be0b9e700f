package discovery_test

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/fleet"
)

func TestEndpointFor(t *testing.T) {
	ev := discovery.DefaultKVEventsConfig()
	evReplay := ev
	evReplay.ReplayPort = 5600
	evReplay.Topic = "kv"
	central := ev
	central.Mode = discovery.ModeCentral
	central.Bind = "tcp://*:5557"
	noEvents := ev
	noEvents.Port = 0
	tc := discovery.TargetConfig{Port: 8000, Models: []string{qwen}, MetricsPath: "/metrics"}
	base := discovery.Target{ID: "ns/a", IP: netip.MustParseAddr("10.1.2.3"), Port: 8000, Ready: true, Rank: -1}
	with := func(mod func(*discovery.Target)) discovery.Target { t := base; mod(&t); return t }
	tests := []struct {
		name    string
		ev      discovery.KVEventsConfig
		target  discovery.Target
		want    fleet.EndpointConfig
		wantErr string
	}{
		{name: "defaults", ev: ev, target: base, want: fleet.EndpointConfig{
			Address: "10.1.2.3:8000", Models: []string{qwen}, MetricsURL: "http://10.1.2.3:8000/metrics",
			KVEvents: fleet.KVEventsConfig{Endpoints: []string{"tcp://10.1.2.3:5557"}}}},
		{name: "annotations and replay", ev: evReplay, target: with(func(t *discovery.Target) {
			t.Annotations = map[string]string{
				discovery.AnnotationModels:           "m, " + qwen,
				discovery.AnnotationLoRAAdapters:     "sql-lora=m",
				discovery.AnnotationDataParallelSize: "2",
			}
		}), want: fleet.EndpointConfig{
			Address: "10.1.2.3:8000", Models: []string{"m", qwen}, MetricsURL: "http://10.1.2.3:8000/metrics",
			LoRAAdapters: []fleet.LoRAAdapter{{Name: "sql-lora", BaseModel: "m"}},
			KVEvents: fleet.KVEventsConfig{Topic: "kv",
				Endpoints:       []string{"tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558"},
				ReplayEndpoints: []string{"tcp://10.1.2.3:5600", "tcp://10.1.2.3:5601"}}}},
		{name: "one rank per HTTP port", ev: ev, target: with(func(t *discovery.Target) { t.Rank = 3; t.Port = 8003 }),
			want: fleet.EndpointConfig{Address: "10.1.2.3:8003", Models: []string{qwen}, MetricsURL: "http://10.1.2.3:8003/metrics",
				KVEvents: fleet.KVEventsConfig{Endpoints: []string{"tcp://10.1.2.3:5560"}}}},
		{name: "ipv6", ev: ev, target: with(func(t *discovery.Target) { t.IP = netip.MustParseAddr("fd00::5") }),
			want: fleet.EndpointConfig{Address: "[fd00::5]:8000", Models: []string{qwen}, MetricsURL: "http://[fd00::5]:8000/metrics",
				KVEvents: fleet.KVEventsConfig{Endpoints: []string{"tcp://[fd00::5]:5557"}}}},
		{name: "central mode: no per-pod events", ev: central, target: base, want: fleet.EndpointConfig{
			Address: "10.1.2.3:8000", Models: []string{qwen}, MetricsURL: "http://10.1.2.3:8000/metrics"}},
		{name: "no events port", ev: noEvents, target: base, want: fleet.EndpointConfig{
			Address: "10.1.2.3:8000", Models: []string{qwen}, MetricsURL: "http://10.1.2.3:8000/metrics"}},
		{name: "empty models annotation", ev: ev, target: with(func(t *discovery.Target) {
			t.Annotations = map[string]string{discovery.AnnotationModels: " , "}
		}), wantErr: "annotation kvrouter.io/models is empty"},
		{name: "bad adapter annotation", ev: ev, target: with(func(t *discovery.Target) {
			t.Annotations = map[string]string{discovery.AnnotationLoRAAdapters: "sql-lora"}
		}), wantErr: `"sql-lora" is not name=base_model`},
		{name: "adapter of a model not served", ev: ev, target: with(func(t *discovery.Target) {
			t.Annotations = map[string]string{discovery.AnnotationLoRAAdapters: "sql-lora=other"}
		}), wantErr: `"other" is not one of this endpoint's models`},
		{name: "bad dp size", ev: ev, target: with(func(t *discovery.Target) {
			t.Annotations = map[string]string{discovery.AnnotationDataParallelSize: "0"}
		}), wantErr: `annotation kvrouter.io/data-parallel-size: "0" is not in [1, 256]`},
		{name: "events port overflow", ev: ev, target: with(func(t *discovery.Target) { t.Rank = 65000 }),
			wantErr: "events port 5557+65000 is over 65535"},
		{name: "no address", ev: ev, target: with(func(t *discovery.Target) { t.IP = netip.Addr{} }),
			wantErr: "has no address"},
	}
	for _, tc2 := range tests {
		t.Run(tc2.name, func(t *testing.T) {
			got, err := discovery.EndpointFor(&tc, &tc2.ev, tc2.target)
			if tc2.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc2.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc2.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc2.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc2.want)
			}
		})
	}
}

func TestCentralTopic(t *testing.T) {
	topic := discovery.CentralTopic("10.0.0.1:8000", qwen)
	if topic != "kv@10.0.0.1:8000@Qwen/Qwen3-0.6B" {
		t.Fatalf("topic %q", topic)
	}
	tests := []struct {
		name, topic, addr, model, err string
	}{
		{"round trip", topic, "10.0.0.1:8000", qwen, ""},
		{"model with @", "kv@[fd00::1]:8000@a@b", "[fd00::1]:8000", "a@b", ""},
		{"no prefix", "x@10.0.0.1:8000@m", "", "", "does not start"},
		{"no model", "kv@10.0.0.1:8000", "", "", "is not kv@"},
		{"host name", "kv@vllm:8000@m", "", "", "must be an IP"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, m, err := discovery.ParseCentralTopic(tc.topic)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || a != tc.addr || m != tc.model {
				t.Errorf("got %q %q %v", a, m, err)
			}
		})
	}
}

func FuzzParseCentralTopic(f *testing.F) {
	f.Add("kv@10.0.0.1:8000@m")
	f.Add("kv@[::1]:1@")
	f.Fuzz(func(t *testing.T, topic string) {
		a, m, err := discovery.ParseCentralTopic(topic)
		if err != nil {
			return
		}
		if got := discovery.CentralTopic(a, m); got != topic {
			t.Errorf("round trip %q -> %q", topic, got)
		}
	})
}

func FuzzEndpointForAnnotations(f *testing.F) {
	f.Add("a,b", "x=a", "2")
	f.Add("", "=", "-1")
	tc := discovery.TargetConfig{Port: 8000, Models: []string{qwen}, MetricsPath: "/metrics"}
	ev := discovery.DefaultKVEventsConfig()
	f.Fuzz(func(t *testing.T, models, loras, dp string) {
		tgt := discovery.Target{ID: "x", IP: netip.MustParseAddr("10.0.0.1"), Port: 8000, Ready: true, Rank: -1,
			Annotations: map[string]string{
				discovery.AnnotationModels: models, discovery.AnnotationLoRAAdapters: loras, discovery.AnnotationDataParallelSize: dp,
			}}
		ep, err := discovery.EndpointFor(&tc, &ev, tgt)
		if err == nil {
			if verr := ep.Validate(); verr != nil {
				t.Errorf("EndpointFor returned an invalid endpoint: %v", verr)
			}
		}
	})
}
