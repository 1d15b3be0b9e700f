package gateway_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/testbench/gateway"
)

// listedPolicy picks the first candidate in its order and lists the rest as fallbacks.
type listedPolicy struct{ order []string }

func (p listedPolicy) Name() string { return "listed" }
func (p listedPolicy) Pick(_ *scoring.Request, _ []scoring.Endpoint) (scoring.Decision, error) {
	return scoring.Decision{Endpoint: p.order[0], Fallbacks: p.order[1:]}, nil
}

// reportingFleet is fleet recording the passive signals the server sends it.
type reportingFleet struct {
	*fleet
	mu     sync.Mutex
	failed []string
}

func (f *reportingFleet) UpstreamFailed(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, addr)
}

// deadAddr is a loopback address nothing listens on (connections are refused).
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

// TestGatewayRetriesFallbacks: as Envoy with override_host and a connect-failure retry
// policy, the dev gateway tries the endpoints kvrouter listed in order when a connect
// fails; kvrouter hears that the chosen endpoint failed, from the served endpoint or
// from the gateway's own 503, which goes through ext_proc as Envoy's local reply does.
func TestGatewayRetriesFallbacks(t *testing.T) {
	live := newUpstream(t)
	dead1, dead2 := deadAddr(t), deadAddr(t)
	tests := []struct {
		name   string
		order  []string
		status int
	}{
		{"chosen dead, fallback serves", []string{dead1, live.addr()}, http.StatusOK},
		{"every listed endpoint dead", []string{dead1, dead2}, http.StatusServiceUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &reportingFleet{fleet: &fleet{addrs: tc.order, inflight: map[string]int{}}}
			srv := extproc.New(extproc.Options{Policy: listedPolicy{tc.order}, Fleet: f, MaxFallbacks: 2})
			conn, err := fakeenvoy.Bufconn(srv.Register)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			gw := httptest.NewServer(gateway.New(conn.Client, gateway.Config{Upstreams: tc.order}, nil, nil))
			defer gw.Close()
			resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.status)
			}
			if tc.status == http.StatusOK && string(body) != sse {
				t.Errorf("body %q, want the upstream's stream", body)
			}
			testwait.For(t, "the ext_proc stream to end", func() bool { return srv.Active() == 0 })
			f.mu.Lock()
			failed := slices.Clone(f.failed)
			f.mu.Unlock()
			if !slices.Equal(failed, []string{dead1}) {
				t.Errorf("UpstreamFailed calls %v, want [%s]", failed, dead1)
			}
		})
	}
}

// TestGatewayUpstreamDiesMidBody: an upstream that dies after the first event ends the
// client's response (truncated) at once; the gateway used to wait for the end of a body
// that never came, until the client gave up.
func TestGatewayUpstreamDiesMidBody(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("content-type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer up.Close()
	addr := strings.TrimPrefix(up.URL, "http://")
	f := &fleet{addrs: []string{addr}, inflight: map[string]int{}}
	srv := extproc.New(extproc.Options{Policy: scoring.NewRoundRobin(), Fleet: f})
	conn, err := fakeenvoy.Bufconn(srv.Register)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	gw := httptest.NewServer(gateway.New(conn.Client, gateway.Config{Upstreams: []string{addr}}, nil, nil))
	defer gw.Close()
	resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body) // returns (truncated) instead of hanging
	resp.Body.Close()
	testwait.For(t, "the ext_proc stream to end", func() bool { return srv.Active() == 0 })
}
