package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/extproc/envoytest"
	"github.com/kvrouter/kvrouter/gateway"
	"github.com/kvrouter/kvrouter/scoring"
)

// fleet is a hand-written Fleet over real upstream addresses.
type fleet struct {
	mu       sync.Mutex
	addrs    []string
	inflight map[string]int
	begins   int
	ends     int
}

func (f *fleet) Candidates(string) ([]scoring.Endpoint, string, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var eps []scoring.Endpoint
	for _, a := range f.addrs {
		eps = append(eps, scoring.Endpoint{Address: a, InFlight: f.inflight[a]})
	}
	return eps, "", "", true
}

func (f *fleet) Begin(a string) { f.mu.Lock(); f.inflight[a]++; f.begins++; f.mu.Unlock() }
func (f *fleet) End(a string)   { f.mu.Lock(); f.inflight[a]--; f.ends++; f.mu.Unlock() }

func (f *fleet) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.begins, f.ends
}

// upstream is an httptest vLLM stand-in: it records what it received and streams SSE.
type upstream struct {
	srv      *httptest.Server
	mu       sync.Mutex
	headers  []http.Header
	bodies   []string
	block    chan struct{} // when set, the stream waits on it after the first event
	sawFirst chan struct{}
}

const sse = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n" +
	"data: [DONE]\n\n"

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.headers = append(u.headers, r.Header.Clone())
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		if r.URL.Path == "/v1/models" {
			w.Header().Set("content-type", "application/json")
			io.WriteString(w, `{"object":"list","data":[]}`)
			return
		}
		w.Header().Set("content-type", "text/event-stream")
		parts := strings.SplitAfter(sse, "\n\n")
		for i, p := range parts {
			io.WriteString(w, p)
			w.(http.Flusher).Flush()
			if i == 0 && u.block != nil {
				close(u.sawFirst)
				select {
				case <-u.block:
				case <-r.Context().Done():
					return
				}
			}
		}
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

func (u *upstream) requests() ([]http.Header, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.headers), slices.Clone(u.bodies)
}

type setup struct {
	fleet *fleet
	ups   []*upstream
	gw    *httptest.Server
	srv   *extproc.Server
}

func newSetup(t *testing.T, allow func(addrs []string) []string) *setup {
	return newSetupExpose(t, allow, false)
}

// newSetupExpose is newSetup with gateway.Config.ExposeServed set to expose.
func newSetupExpose(t *testing.T, allow func(addrs []string) []string, expose bool) *setup {
	s := &setup{ups: []*upstream{newUpstream(t), newUpstream(t)}}
	var addrs []string
	for _, u := range s.ups {
		addrs = append(addrs, u.addr())
	}
	s.fleet = &fleet{addrs: addrs, inflight: map[string]int{}}
	s.srv = extproc.New(extproc.Options{Policy: scoring.NewRoundRobin(), Fleet: s.fleet})
	conn, err := envoytest.Bufconn(s.srv.Register)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if allow != nil {
		addrs = allow(addrs)
	}
	s.gw = httptest.NewServer(gateway.New(conn.Client, gateway.Config{Upstreams: addrs, ExposeServed: expose}, nil, nil))
	t.Cleanup(s.gw.Close)
	return s
}

func (s *setup) waitReleased(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, e := s.fleet.counts(); e == want && s.srv.Active() == 0 {
			return
		}
		if time.Now().After(deadline) {
			b, e := s.fleet.counts()
			t.Fatalf("begins/ends %d/%d, active %d; want %d ends", b, e, s.srv.Active(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}],"stream":true,"stream_options":{"include_usage":true}}`

func TestGatewayEndToEnd(t *testing.T) {
	s := newSetup(t, nil)
	for i := range 4 {
		req, _ := http.NewRequest("POST", s.gw.URL+"/v1/chat/completions", strings.NewReader(chat))
		req.Header.Set("content-type", "application/json")
		req.Header.Set("x-gateway-destination-endpoint", "6.6.6.6:80")
		req.Header.Set("x-gateway-destination-endpoint-subset", "6.6.6.6:80")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != sse {
			t.Fatalf("status %d body %q", resp.StatusCode, body)
		}
		// Round-robin over the fleet; the served endpoint is not shown to the client.
		if hs, _ := s.ups[i%2].requests(); len(hs) != i/2+1 {
			t.Fatalf("request %d: upstream %d has %d requests, want %d", i, i%2, len(hs), i/2+1)
		}
		if got := resp.Header.Values(epp.HeaderServed); len(got) != 0 {
			t.Fatalf("the client saw %s %q", epp.HeaderServed, got)
		}
		if ct := resp.Header.Get("content-type"); ct != "text/event-stream" {
			t.Fatalf("content-type %q", ct)
		}
	}
	for _, u := range s.ups {
		hs, bodies := u.requests()
		if len(hs) != 2 {
			t.Fatalf("upstream %s got %d requests", u.addr(), len(hs))
		}
		for i, h := range hs {
			if got := h.Values(epp.HeaderDestination); len(got) != 1 || got[0] != u.addr() {
				t.Fatalf("upstream saw destination %q", got)
			}
			if h.Get("x-gateway-destination-endpoint-subset") != "" {
				t.Fatal("client subset header reached the upstream")
			}
			if bodies[i] != chat {
				t.Fatalf("upstream body %q", bodies[i])
			}
		}
	}
	s.waitReleased(t, 4)
}

func TestGatewayGETWithoutBody(t *testing.T) {
	s := newSetup(t, nil)
	resp, err := http.Get(s.gw.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != `{"object":"list","data":[]}` {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	s.waitReleased(t, 1)
}

func TestGatewayRefusals(t *testing.T) {
	tests := []struct {
		name  string
		allow func([]string) []string
		empty bool
		want  string
	}{
		{"destination not in allowlist", func([]string) []string { return nil }, false, "is not an allowed upstream"},
		{"no endpoint: immediate 503", nil, true, "no healthy endpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSetup(t, tc.allow)
			if tc.empty {
				s.fleet.addrs = nil
			}
			resp, err := http.Post(s.gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 || !strings.Contains(string(body), tc.want) ||
				resp.Header.Get("content-type") != "application/json" {
				t.Fatalf("%d %s %q", resp.StatusCode, resp.Header.Get("content-type"), body)
			}
			for _, u := range s.ups {
				if hs, _ := u.requests(); len(hs) != 0 {
					t.Fatal("an upstream was called")
				}
			}
			b, _ := s.fleet.counts()
			s.waitReleased(t, b)
		})
	}
}

func TestGatewayClientDisconnect(t *testing.T) {
	s := newSetup(t, nil)
	for _, u := range s.ups {
		u.block, u.sawFirst = make(chan struct{}), make(chan struct{})
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.gw.URL+"/v1/chat/completions", strings.NewReader(chat))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel() // the client goes away mid-stream
	resp.Body.Close()
	s.waitReleased(t, 1)
	for _, u := range s.ups {
		close(u.block)
	}
}

func Example() {
	// A gateway in front of kvrouter (reached over gRPC) and two vLLM pods:
	//   conn, _ := grpc.NewClient("127.0.0.1:9002", grpc.WithTransportCredentials(insecure.NewCredentials()))
	//   gw := gateway.New(extprocv3.NewExternalProcessorClient(conn),
	//       gateway.Config{Upstreams: []string{"10.0.0.1:8000", "10.0.0.2:8000"}}, nil, logger)
	//   http.ListenAndServe(":8080", gw)
	fmt.Println("see cmd/devgateway")
	// Output: see cmd/devgateway
}

// TestGatewayExposeServed: with ExposeServed (benchmarks counting servers per prefix) the
// client sees which endpoint served each request.
func TestGatewayExposeServed(t *testing.T) {
	s := newSetupExpose(t, nil, true)
	for i := range 2 {
		resp, err := http.Post(s.gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chat))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got, want := resp.Header.Get(epp.HeaderServed), s.ups[i%2].addr(); got != want {
			t.Errorf("served %q, want %q", got, want)
		}
	}
}
