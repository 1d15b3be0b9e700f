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
	centralReplay := central
	centralReplay.ReplayPort = 5600
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
		{name: "central mode: ranks connect to kvrouter", ev: central, target: with(func(t *discovery.Target) {
			t.Annotations = map[string]string{discovery.AnnotationDataParallelSize: "2"}
		}), want: fleet.EndpointConfig{
			Address: "10.1.2.3:8000", Models: []string{qwen}, MetricsURL: "http://10.1.2.3:8000/metrics",
			KVEvents: fleet.KVEventsConfig{CentralRanks: []int{0, 1}}}},
		{name: "central mode, one rank per HTTP port, replay on the pod", ev: centralReplay,
			target: with(func(t *discovery.Target) { t.Rank = 3; t.Port = 8003 }), want: fleet.EndpointConfig{
				Address: "10.1.2.3:8003", Models: []string{qwen}, MetricsURL: "http://10.1.2.3:8003/metrics",
				KVEvents: fleet.KVEventsConfig{CentralRanks: []int{3}, ReplayEndpoints: []string{"tcp://10.1.2.3:5603"}}}},
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
