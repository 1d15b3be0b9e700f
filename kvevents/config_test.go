package kvevents_test

import (
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

func TestConfigValidate(t *testing.T) {
	ok := kvevents.EndpointConfig{Name: "a", Address: "tcp://10.0.0.1:5557"}
	cases := []struct {
		name    string
		cfg     kvevents.Config
		wantErr string
	}{
		{"empty", kvevents.Config{}, ""},
		{"one endpoint", kvevents.Config{Endpoints: []kvevents.EndpointConfig{ok}}, ""},
		{"replay and ranks", kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Name: "a",
			Address: "tcp://h:5557", ReplayAddress: "tcp://h:5600", DPRanks: 4}}}, ""},
		{"no name", kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Address: "tcp://h:1"}}}, "without a name"},
		{"duplicate", kvevents.Config{Endpoints: []kvevents.EndpointConfig{ok, ok}}, "listed twice"},
		{"no port", kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Name: "a", Address: "tcp://h"}}}, "tcp://host:port"},
		{"not tcp", kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Name: "a", Address: "h:1"}}}, "tcp://host:port"},
		{"ranks past port 65535", kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Name: "a",
			Address: "tcp://h:65535", DPRanks: 2}}}, "tcp://host:port"},
		{"bad replay", kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Name: "a",
			Address: "tcp://h:1", ReplayAddress: "udp://h:2"}}}, "replay"},
		{"negative ranks", kvevents.Config{Endpoints: []kvevents.EndpointConfig{{Name: "a",
			Address: "tcp://h:1", DPRanks: -1}}}, "dp_ranks"},
		{"backoff inverted", kvevents.Config{BackoffMin: 2, BackoffMax: 1}, "backoff"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
			if _, nerr := kvevents.NewSubscriber(tc.cfg, newRefSink(), nil, nil, nil); (nerr == nil) != (err == nil) {
				t.Fatalf("NewSubscriber error %v disagrees with Validate %v", nerr, err)
			}
		})
	}
}
