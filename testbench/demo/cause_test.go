package demo

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/testbench/kvbench"
)

// TestFailureCause: which failed requests the fault table charges to the router.
func TestFailureCause(t *testing.T) {
	kill := time.Unix(100, 0)
	before, after := kill.Add(-time.Second), kill.Add(time.Second)
	router := map[string]stopped{"kvrouter": {at: kill}}
	pod := map[string]stopped{"vllm-sim 0": {at: kill, addr: "127.0.0.1:1"}}
	unavailable := "HTTP 500: devgateway: ext_proc unavailable: connection refused"
	tests := []struct {
		name  string
		res   kvbench.Result
		sent  time.Time
		stops map[string]stopped
		want  string
	}{
		{"kvrouter stopped, gateway cannot reach it", kvbench.Result{Err: unavailable}, after, router, CauseRouterDown},
		{"sent just before the stop, reached it draining", kvbench.Result{Err: unavailable}, before, router, CauseRouterDown},
		{"kvrouter stopped, the request failed otherwise", kvbench.Result{Err: "HTTP 503: upstream connect error"}, after, router, ""},
		{"nothing stopped", kvbench.Result{Err: unavailable}, after, nil, ""},
		{"pod killed while serving it", kvbench.Result{Err: "unexpected EOF", Server: "127.0.0.1:1"}, before, pod, CausePodKilled},
		{"pod killed, serving endpoint unknown", kvbench.Result{Err: "unexpected EOF"}, before, pod, CausePodKilled},
		{"pod killed, another pod served it", kvbench.Result{Err: "unexpected EOF", Server: "127.0.0.1:2"}, before, pod, ""},
		{"sent after the kill: the router picked a dead pod", kvbench.Result{Err: "HTTP 503: connect: connection refused"}, after, pod, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := failureCause(tc.res, tc.sent, tc.stops); got != tc.want {
				t.Errorf("failureCause = %q, want %q", got, tc.want)
			}
		})
	}
}
