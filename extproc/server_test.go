package extproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

const (
	epA = "10.0.0.1:8000"
	epB = "10.0.0.2:8000"
	epC = "10.0.0.3:8000"
)

type harness struct {
	t      *testing.T
	fleet  *fakeFleet
	policy *recordingPolicy
	srv    *extproc.Server
	reg    *prometheus.Registry
	conn   *fakeenvoy.Conn
}

type harnessOpt func(*extproc.Options)

// newHarness serves an extproc.Server over bufconn. The fleet has A, B, C healthy; model
// "m" is served by all, "only-b" by B alone, "lora-x" by C.
func newHarness(t *testing.T, opts ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, fleet: newFleet(epA, epB, epC).serve("m", epA, epB, epC).serve("only-b", epB).serve("lora-x", epC),
		policy: &recordingPolicy{}, reg: prometheus.NewRegistry()}
	o := extproc.Options{Policy: h.policy, Fleet: h.fleet, Registerer: h.reg}
	for _, f := range opts {
		f(&o)
	}
	h.srv = extproc.New(o)
	conn, err := fakeenvoy.Bufconn(h.srv.Register)
	if err != nil {
		t.Fatal(err)
	}
	h.conn = conn
	t.Cleanup(conn.Close)
	return h
}

func (h *harness) start(cfg fakeenvoy.Config) *fakeenvoy.Exchange {
	h.t.Helper()
	x, err := fakeenvoy.Start(context.Background(), h.conn.Client, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return x
}

// waitIdle waits until the server has no open stream (the server side of a cancelled
// stream ends asynchronously). It is a wait for a condition, not a timing assertion.
func (h *harness) waitIdle() {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.srv.Active() != 0 {
		if time.Now().After(deadline) {
			h.t.Fatalf("server still has %d active streams", h.srv.Active())
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *harness) counter(name string, labels ...string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

func chatBody(model string) []byte {
	return []byte(`{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("hello ", 40) +
		`"}],"stream":true,"stream_options":{"include_usage":true}}`)
}

func split(b []byte, n int) [][]byte {
	var out [][]byte
	size := (len(b) + n - 1) / n
	for len(b) > 0 {
		k := min(size, len(b))
		out = append(out, b[:k])
		b = b[k:]
	}
	return out
}

func postHeaders(extra ...fakeenvoy.Header) fakeenvoy.Headers {
	h := fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"}, {Key: ":authority", Value: "gw"},
		{Key: "content-type", Value: "application/json"}}
	return append(h, extra...)
}

func mode(m filterv3.ProcessingMode_BodySendMode, trailers bool) fakeenvoy.Config {
	return fakeenvoy.Config{RequestBodyMode: m, ResponseBodyMode: m, SendProtocolConfig: true,
		SendRequestTrailers: trailers, SendResponseTrailers: trailers}
}

// checkDecision asserts one destination header, equal to the envoy.lb metadata, naming want.
func checkDecision(t *testing.T, res *fakeenvoy.RequestResult, want string) {
	t.Helper()
	if res.Immediate != nil {
		t.Fatalf("immediate response %v", res.Immediate)
	}
	vals := res.Headers.Values(epp.HeaderDestination)
	if len(vals) != 1 || vals[0] != want {
		t.Fatalf("destination header %q, want [%s]", vals, want)
	}
	if md := fakeenvoy.MetadataString(res.DynamicMetadata, epp.NamespaceLB, epp.HeaderDestination); md != want {
		t.Fatalf("envoy.lb metadata %q, want %q", md, want)
	}
	if !res.ClearRouteCache {
		t.Fatal("clear_route_cache not set")
	}
	for _, kv := range res.Headers {
		if strings.HasPrefix(kv.Key, epp.HeaderPrefix) && kv.Key != epp.HeaderDestination {
			t.Fatalf("client header %s reached upstream", kv.Key)
		}
	}
}

func TestRequestModes(t *testing.T) {
	body := chatBody("only-b")
	type modeCase struct {
		name    string
		cfg     fakeenvoy.Config
		parsed  bool // the body reaches the router before its decision
		replies func(chunks int, trailers bool) []string
	}
	fds := func(chunks int, trailers bool) []string {
		if trailers {
			return []string{"request_headers", "request_body/streamed", "request_trailers"}
		}
		return []string{"request_headers", "request_body/streamed+eos"}
	}
	buffered := func(chunks int, trailers bool) []string {
		r := []string{"request_headers", "request_body"}
		if trailers {
			r = append(r, "request_trailers")
		}
		return r
	}
	streamed := func(chunks int, trailers bool) []string {
		r := []string{"request_headers"}
		for range chunks {
			r = append(r, "request_body")
		}
		if trailers {
			r = append(r, "request_trailers")
		}
		return r
	}
	none := func(chunks int, trailers bool) []string {
		r := []string{"request_headers"}
		if trailers {
			r = append(r, "request_trailers")
		}
		return r
	}
	noPC := mode(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true)
	noPC.SendProtocolConfig = false
	modes := []modeCase{
		{name: "FULL_DUPLEX_STREAMED", cfg: mode(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true), parsed: true, replies: fds},
		{name: "FULL_DUPLEX_STREAMED without protocol_config", cfg: noPC, parsed: true, replies: fds},
		{name: "BUFFERED", cfg: mode(filterv3.ProcessingMode_BUFFERED, true), parsed: true, replies: buffered},
		{name: "BUFFERED_PARTIAL", cfg: mode(filterv3.ProcessingMode_BUFFERED_PARTIAL, true), parsed: true, replies: buffered},
		{name: "STREAMED", cfg: mode(filterv3.ProcessingMode_STREAMED, true), replies: streamed},
		{name: "NONE", cfg: mode(filterv3.ProcessingMode_NONE, true), replies: none},
	}
	for _, m := range modes {
		for _, chunks := range []int{1, 2, 37} {
			for _, trailers := range []bool{false, true} {
				name := fmt.Sprintf("%s/%d chunks/trailers=%v", m.name, chunks, trailers)
				t.Run(name, func(t *testing.T) {
					h := newHarness(t)
					h.fleet.inflight[epA] = 0
					h.fleet.inflight[epB] = 5 // least-load alone would pick A
					x := h.start(m.cfg)
					req := fakeenvoy.Request{Headers: postHeaders(), Body: split(body, chunks)}
					if trailers {
						req.Trailers = fakeenvoy.Headers{{Key: "x-trailer", Value: "t"}}
					}
					res, err := x.Request(req)
					if err != nil {
						t.Fatal(err)
					}
					want := epA
					if m.parsed {
						want = epB // only the parsed model name leads to B
					}
					checkDecision(t, res, want)
					if string(res.Body) != string(body) {
						t.Fatalf("upstream body differs: %d bytes, want %d", len(res.Body), len(body))
					}
					if trailers {
						if v, _ := res.Trailers.Get("x-trailer"); v != "t" {
							t.Fatalf("trailers %v", res.Trailers)
						}
					}
					if got, want := x.Replies(), m.replies(len(req.Body), trailers); !slices.Equal(got, want) {
						t.Fatalf("replies %v, want %v", got, want)
					}
					resp, err := x.Response(200, fakeenvoy.Headers{{Key: "content-type", Value: "text/event-stream"}},
						[][]byte{[]byte("data: {}\n\n"), []byte("data: [DONE]\n\n")}, nil, nil)
					if err != nil {
						t.Fatal(err)
					}
					if v, _ := resp.Headers.Get(epp.HeaderServed); v != want {
						t.Fatalf("served header %q, want %q", v, want)
					}
					if string(resp.Body) != "data: {}\n\ndata: [DONE]\n\n" {
						t.Fatalf("response body %q", resp.Body)
					}
					if err := x.Close(); err != nil {
						t.Fatal(err)
					}
					h.waitIdle()
					if b, e := h.fleet.counts(); b != 1 || e != 1 {
						t.Fatalf("begins/ends = %d/%d", b, e)
					}
					wantFallback := 0.0
					if !m.parsed {
						wantFallback = 1
					}
					if got := h.counter("kvrouter_routing_fallbacks_total", "reason", "no_body"); got != wantFallback {
						t.Fatalf("no_body fallbacks = %v, want %v", got, wantFallback)
					}
				})
			}
		}
	}
}

func TestLargeBodies(t *testing.T) {
	big := []byte(`{"model":"only-b","messages":[{"role":"user","content":"` + strings.Repeat("x", 200000) + `"}]}`)
	tests := []struct {
		name     string
		maxBody  int
		chunks   int
		trailers bool
		want     string
		tooLarge float64
	}{
		{"parsed and re-chunked", 0, 3, false, epB, 0},
		{"parsed with trailers", 0, 5, true, epB, 0},
		{"over the limit streams through", 1000, 50, false, epA, 1},
		{"over the limit in the first chunk", 1000, 1, false, epA, 1},
		{"over the limit with trailers", 1000, 7, true, epA, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) { o.MaxBodyBytes = tc.maxBody })
			x := h.start(fakeenvoy.FullDuplex())
			req := fakeenvoy.Request{Headers: postHeaders(), Body: split(big, tc.chunks)}
			if tc.trailers {
				req.Trailers = fakeenvoy.Headers{}
			}
			res, err := x.Request(req)
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, res, tc.want)
			if string(res.Body) != string(big) {
				t.Fatalf("body differs (%d vs %d bytes)", len(res.Body), len(big))
			}
			if got := h.counter("kvrouter_request_parse_errors_total", "reason", "too_large"); got != tc.tooLarge {
				t.Fatalf("too_large = %v", got)
			}
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPooledBodies: bodies reassembled from several chunks with a content-length go
// into buffers the server reuses; each request, one after the other and many at once,
// is still parsed from its own body and passes it on unchanged.
func TestPooledBodies(t *testing.T) {
	h := newHarness(t)
	run := func(i int) error {
		x, err := fakeenvoy.Start(context.Background(), h.conn.Client, fakeenvoy.FullDuplex())
		if err != nil {
			return err
		}
		defer x.Close()
		body := []byte(fmt.Sprintf(`{"model":"only-b","messages":[{"role":"user","content":"req-%d %s"}]}`, i,
			strings.Repeat(string(rune('a'+i%26)), 20000+i*7919%300000)))
		res, err := x.Request(fakeenvoy.Request{Body: split(body, 2+i%9),
			Headers: postHeaders(fakeenvoy.Header{Key: "content-length", Value: strconv.Itoa(len(body))})})
		switch {
		case err != nil:
			return err
		case res.Immediate != nil:
			return fmt.Errorf("request %d: immediate response %v", i, res.Immediate)
		case !bytes.Equal(res.Body, body):
			return fmt.Errorf("request %d: body passed on differs (%d vs %d bytes)", i, len(res.Body), len(body))
		}
		if dest, _ := res.Headers.Get(epp.HeaderDestination); dest != epB {
			return fmt.Errorf("request %d: routed to %q, not by its parsed model to %s", i, dest, epB)
		}
		return nil
	}
	runSerialThenConcurrent(t, run, 32)
}

func TestRequestWithoutBody(t *testing.T) {
	for _, m := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_NONE} {
		t.Run(m.String(), func(t *testing.T) {
			h := newHarness(t)
			h.fleet.inflight[epA] = 2
			x := h.start(mode(m, false))
			res, err := x.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}})
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, res, epB)
			if got := x.Replies(); !slices.Equal(got, []string{"request_headers"}) {
				t.Fatalf("replies %v", got)
			}
			resp, err := x.Response(200, nil, nil, nil, nil) // response without body
			if err != nil {
				t.Fatal(err)
			}
			if v, _ := resp.Headers.Get(epp.HeaderServed); v != epB {
				t.Fatalf("served %q", v)
			}
			// The response ended with its headers: the endpoint is released before Close.
			if _, e := h.fleet.counts(); e != 1 {
				t.Fatalf("ends = %d", e)
			}
			_, _, first, fin := h.policy.snapshot()
			if len(first) != 1 || len(fin) != 1 {
				t.Fatalf("first/finished %v %v", first, fin)
			}
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestUnsupportedPathStreamsThrough(t *testing.T) {
	h := newHarness(t)
	x := h.start(fakeenvoy.FullDuplex())
	body := []byte(`{"model":"only-b","input":"embed me"}`)
	res, err := x.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/embeddings"}},
		Body: split(body, 3)})
	if err != nil {
		t.Fatal(err)
	}
	checkDecision(t, res, epA)
	if string(res.Body) != string(body) {
		t.Fatalf("body %q", res.Body)
	}
	want := []string{"request_headers", "request_body/streamed", "request_body/streamed", "request_body/streamed+eos"}
	if got := x.Replies(); !slices.Equal(got, want) {
		t.Fatalf("replies %v, want %v", got, want)
	}
	if got := h.counter("kvrouter_request_parse_errors_total", "reason", "unsupported_path"); got != 1 {
		t.Fatalf("unsupported_path = %v", got)
	}
	x.Close()
}

func TestSpoofedDestinationHeaders(t *testing.T) {
	spoof := []fakeenvoy.Header{
		{Key: "x-gateway-destination-endpoint", Value: "6.6.6.6:80"},
		{Key: "x-gateway-destination-endpoint", Value: "7.7.7.7:80"},
		{Key: "x-gateway-destination-endpoint-subset", Value: "6.6.6.6:80"},
		{Key: "x-gateway-destination-endpoint-served", Value: "6.6.6.6:80"},
		{Key: "X-Gateway-Destination-Other", Value: "x"},
	}
	for _, m := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_NONE} {
		for _, withBody := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/body=%v", m, withBody), func(t *testing.T) {
				h := newHarness(t)
				x := h.start(mode(m, false))
				req := fakeenvoy.Request{Headers: postHeaders(spoof...)}
				if withBody {
					req.Body = [][]byte{chatBody("m")}
				}
				res, err := x.Request(req)
				if err != nil {
					t.Fatal(err)
				}
				checkDecision(t, res, epA) // never the spoofed address; the subset header is no hint
				x.Close()
			})
		}
	}
}

func TestSubsetHint(t *testing.T) {
	tests := []struct {
		name   string
		hint   []string
		model  string
		want   string // "" = 503
		reason string
	}{
		{"list narrows to C", []string{epC}, "m", epC, ""},
		{"comma string", []string{epC + ", " + epB}, "m", epB, ""},
		{"unknown addresses only", []string{"6.6.6.6:1"}, "m", "", "subset_excludes_all"},
		{"empty hint", []string{}, "m", "", "subset_excludes_all"},
		{"hint outside the model's endpoints", []string{epA}, "only-b", "", "subset_excludes_all"},
		{"an IP without a port names that IP's endpoints", []string{"10.0.0.3"}, "m", epC, ""},
		{"an IP with another port names nothing", []string{"10.0.0.3:9"}, "m", "", "subset_excludes_all"},
		{"a hostname without a port names nothing", []string{"vllm-0"}, "m", "", "subset_excludes_all"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.fleet.inflight[epC] = 1
			x := h.start(fakeenvoy.FullDuplex())
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody(tc.model)},
				Metadata: fakeenvoy.SubsetHint(tc.hint...)})
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != "" {
				checkDecision(t, res, tc.want)
				x.Close()
				return
			}
			check503(t, res)
			if got := h.counter("kvrouter_no_endpoint_total", "reason", tc.reason); got != 1 {
				t.Fatalf("no_endpoint{%s} = %v", tc.reason, got)
			}
			x.Close()
			h.waitIdle()
			if b, _ := h.fleet.counts(); b != 0 {
				t.Fatalf("begins = %d after a 503", b)
			}
		})
	}
}

func check503(t *testing.T, res *fakeenvoy.RequestResult) {
	t.Helper()
	if res.Immediate == nil {
		t.Fatalf("want an immediate response, got headers %v", res.Headers)
	}
	if res.Immediate.GetStatus().GetCode() != 503 {
		t.Fatalf("status %v", res.Immediate.GetStatus())
	}
	checkErrorHeaders(t, res.Immediate, "1")
	if !strings.HasPrefix(string(res.Immediate.GetBody()), `{"error":{"message":"kvrouter: `) {
		t.Fatalf("body %s", res.Immediate.GetBody())
	}
}

// checkErrorHeaders checks an immediate error's headers: JSON, and Retry-After retry.
func checkErrorHeaders(t *testing.T, imm *extprocv3.ImmediateResponse, retry string) {
	t.Helper()
	got := map[string]string{}
	for _, h := range imm.GetHeaders().GetSetHeaders() {
		got[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	if len(got) != 2 || got["content-type"] != "application/json" || got["retry-after"] != retry {
		t.Fatalf("headers %v, want content-type application/json and retry-after %s", got, retry)
	}
}

func TestNoHealthyEndpoint(t *testing.T) {
	for _, m := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_NONE} {
		t.Run(m.String(), func(t *testing.T) {
			h := newHarness(t)
			h.fleet.order = nil
			x := h.start(mode(m, false))
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: split(chatBody("m"), 3)})
			if err != nil {
				t.Fatal(err)
			}
			check503(t, res)
			golden(t, "testdata/no_endpoint_body.golden", res.Immediate.GetBody())
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(got) {
		t.Fatalf("%s differs:\n got %s\nwant %s", path, got, want)
	}
}

func TestBadInputIsRoutedByLoad(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		opts     harnessOpt
		want     string
		metric   string
		labels   []string
		policyID string // policy label of the decision
		kind     string // the decision's kind, in the kvrouter metadata and kvrouter_routing_decision_kinds_total
	}{
		{name: "malformed json", body: `{"model":"only-b",`, want: epA,
			metric: "kvrouter_request_parse_errors_total", labels: []string{"reason", "malformed_json"}, policyID: "least-load", kind: scoring.KindFallback},
		{name: "non utf8", body: "{\"model\":\"only-b\xff\",\"messages\":[]}", want: epA,
			metric: "kvrouter_request_parse_errors_total", labels: []string{"reason", "non_utf8"}, policyID: "least-load", kind: scoring.KindFallback},
		{name: "missing model", body: `{"messages":[]}`, want: epA,
			metric: "kvrouter_request_parse_errors_total", labels: []string{"reason", "missing_model"}, policyID: "least-load", kind: scoring.KindFallback},
		{name: "unknown model", body: `{"model":"nope","messages":[]}`, want: epA,
			metric: "kvrouter_routing_fallbacks_total", labels: []string{"reason", "unknown_model"}, policyID: "least-load", kind: scoring.KindFallback},
		{name: "policy error", body: string(chatBody("m")), want: epA,
			opts:   func(o *extproc.Options) { o.Policy = fixedPolicy{err: errors.New("index down")} },
			metric: "kvrouter_routing_fallbacks_total", labels: []string{"reason", "policy_error"}, policyID: "least-load", kind: scoring.KindFallback},
		{name: "policy names an endpoint it was not offered", body: string(chatBody("only-b")), want: epB,
			opts:   func(o *extproc.Options) { o.Policy = fixedPolicy{endpoint: "6.6.6.6:1"} },
			metric: "kvrouter_routing_fallbacks_total", labels: []string{"reason", "policy_error"}, policyID: "least-load", kind: scoring.KindFallback},
		{name: "tokenizer error keeps the policy", body: string(chatBody("m")), want: epA,
			opts:   func(o *extproc.Options) { o.Tokenizer = fakeTokenizer{fail: true} },
			metric: "kvrouter_tokenize_errors_total", policyID: "recording", kind: scoring.KindLoad}, // the policy wrapped, least-load, names its kind
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var opts []harnessOpt
			if tc.opts != nil {
				opts = append(opts, tc.opts)
			}
			h := newHarness(t, opts...)
			x := h.start(fakeenvoy.FullDuplex())
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: split([]byte(tc.body), 2)})
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, res, tc.want)
			if string(res.Body) != tc.body {
				t.Fatalf("body changed: %q", res.Body)
			}
			if got := h.counter(tc.metric, tc.labels...); got != 1 {
				t.Fatalf("%s%v = %v", tc.metric, tc.labels, got)
			}
			if got := h.counter("kvrouter_routing_decisions_total", "policy", tc.policyID, "endpoint", tc.want); got != 1 {
				t.Fatalf("decisions{policy=%s} = %v", tc.policyID, got)
			}
			if got := fakeenvoy.MetadataString(res.DynamicMetadata, epp.NamespaceKVRouter, epp.KeyDecision); got != tc.kind {
				t.Errorf("%s:%s metadata %q, want %q", epp.NamespaceKVRouter, epp.KeyDecision, got, tc.kind)
			}
			if got := h.counter("kvrouter_routing_decision_kinds_total", "policy", tc.policyID, "kind", tc.kind); got != 1 {
				t.Errorf("decision_kinds{policy=%s,kind=%q} = %v", tc.policyID, tc.kind, got)
			}
			x.Close()
		})
	}
}

func TestFallbacksAppended(t *testing.T) {
	h := newHarness(t, func(o *extproc.Options) {
		o.Policy = fixedPolicy{endpoint: epA}
		o.MaxFallbacks = 1
	})
	x := h.start(fakeenvoy.FullDuplex())
	res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
	if err != nil {
		t.Fatal(err)
	}
	checkDecision(t, res, epA+","+epC)
	x.Close()
	h.waitIdle()
	if h.fleet.inflight[epA] != 0 || h.fleet.begins != 1 {
		t.Fatalf("only the chosen endpoint is begun: %v", h.fleet.inflight)
	}
}

func TestPolicySeesParsedRequest(t *testing.T) {
	h := newHarness(t, func(o *extproc.Options) { o.Tokenizer = fakeTokenizer{} })
	x := h.start(fakeenvoy.FullDuplex())
	body := []byte(`{"model":"lora-x","messages":[{"role":"user","content":"hi"}],"cache_salt":"s","max_completion_tokens":300}`)
	if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{body}}); err != nil {
		t.Fatal(err)
	}
	x.Close()
	picks, routed, _, _ := h.policy.snapshot()
	if len(picks) != 1 {
		t.Fatalf("picks %v", picks)
	}
	p := picks[0]
	if p.Model != "lora-x" || p.BaseModel != "base" || p.LoRA != "lora-x" || p.CacheSalt != "s" || p.MaxTokens != 300 || len(p.TokenIDs) == 0 || p.ID == "" {
		t.Fatalf("policy saw %+v", p)
	}
	if len(routed) != 1 || routed[0] != p.ID+"@"+epC {
		t.Fatalf("routed %v", routed)
	}
}

// TestPolicySeesCompletionsMaxTokens: the policy's output bound is what the server will
// apply: a completions body's max_tokens, vLLM's default (16) without one, unknown (0) on
// chat without either.
func TestPolicySeesCompletionsMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		want             int
	}{
		{"completions absent", "/v1/completions", `{"model":"m","prompt":"hi"}`, openai.DefaultCompletionMaxTokens},
		{"completions set", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":40}`, 40},
		{"chat absent", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) { o.Tokenizer = fakeTokenizer{} })
			x := h.start(fakeenvoy.FullDuplex())
			headers := fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: tc.path},
				{Key: ":authority", Value: "gw"}, {Key: "content-type", Value: "application/json"}}
			if _, err := x.Request(fakeenvoy.Request{Headers: headers, Body: [][]byte{[]byte(tc.body)}}); err != nil {
				t.Fatal(err)
			}
			x.Close()
			picks, _, _, _ := h.policy.snapshot()
			if len(picks) != 1 || picks[0].MaxTokens != tc.want {
				t.Fatalf("policy saw %+v, want MaxTokens %d", picks, tc.want)
			}
		})
	}
}

func TestResponsePath(t *testing.T) {
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\ndata: [DONE]\n\n"
	big := strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"aaaaaaaa\"}}]}\n\n", 3000) + sse // > 62,000 bytes
	tests := []struct {
		name     string
		cfg      fakeenvoy.Config
		body     string
		chunks   int
		trailers bool
		served   string // metadata-provided served endpoint
	}{
		{"FDS split usage", fakeenvoy.FullDuplex(), sse, 29, false, ""},
		{"FDS with trailers", fakeenvoy.FullDuplex(), sse, 3, true, ""},
		{"FDS large chunk re-split", fakeenvoy.FullDuplex(), big, 1, false, ""},
		{"FDS served from metadata", fakeenvoy.FullDuplex(), sse, 2, false, epB},
		{"STREAMED", mode(filterv3.ProcessingMode_STREAMED, false), sse, 4, false, ""},
		{"BUFFERED", mode(filterv3.ProcessingMode_BUFFERED, false), sse, 4, false, ""},
		{"BUFFERED with trailers", mode(filterv3.ProcessingMode_BUFFERED, true), sse, 4, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			x := h.start(tc.cfg)
			if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
				t.Fatal(err)
			}
			var trailers fakeenvoy.Headers
			if tc.trailers {
				trailers = fakeenvoy.Headers{{Key: "grpc-status", Value: "0"}}
			}
			mdc := fakeenvoy.ServedMetadata(tc.served)
			resp, err := x.Response(200, fakeenvoy.Headers{{Key: "content-type", Value: "text/event-stream"}, {Key: epp.HeaderServed, Value: "spoof"}},
				split([]byte(tc.body), tc.chunks), trailers, mdc)
			if err != nil {
				t.Fatal(err)
			}
			if string(resp.Body) != tc.body {
				t.Fatalf("response body differs (%d vs %d bytes)", len(resp.Body), len(tc.body))
			}
			wantServed := epA
			if tc.served != "" {
				wantServed = tc.served
			}
			if v := resp.Headers.Values(epp.HeaderServed); len(v) != 1 || v[0] != wantServed {
				t.Fatalf("served header %v, want %s", v, wantServed)
			}
			if tc.trailers {
				if v, _ := resp.Trailers.Get("grpc-status"); v != "0" {
					t.Fatalf("trailers %v", resp.Trailers)
				}
			}
			// The response ended: released before Envoy closes the stream.
			if b, e := h.fleet.counts(); b != 1 || e != 1 {
				t.Fatalf("begins/ends %d/%d", b, e)
			}
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
			h.waitIdle()
			_, _, first, fin := h.policy.snapshot()
			if len(first) != 1 || len(fin) != 1 || first[0] != fin[0] {
				t.Fatalf("first %v finished %v", first, fin)
			}
			if got := h.counter("kvrouter_cached_prompt_tokens_total", "endpoint", epA); got != 256 {
				t.Fatalf("cached tokens %v", got)
			}
			if got := h.counter("kvrouter_prompt_tokens_total", "endpoint", epA); got != 300 {
				t.Fatalf("prompt tokens %v", got)
			}
			if got := h.counter("kvrouter_responses_total", "endpoint", epA, "code", "2xx"); got != 1 {
				t.Fatalf("responses %v", got)
			}
		})
	}
}

func TestReleaseOnEarlyEnd(t *testing.T) {
	tests := []struct {
		name string
		end  func(t *testing.T, x *fakeenvoy.Exchange)
	}{
		{"client cancels after routing", func(t *testing.T, x *fakeenvoy.Exchange) { x.Cancel() }},
		{"client cancels mid-response", func(t *testing.T, x *fakeenvoy.Exchange) {
			if _, err := x.ResponseHeaders(fakeenvoy.Headers{{Key: ":status", Value: "200"}}, false, nil); err != nil {
				t.Fatal(err)
			}
			if err := x.ResponseBody([]byte("data: {}\n\n"), false); err != nil {
				t.Fatal(err)
			}
			if _, _, err := x.ReadResponseBody(); err != nil {
				t.Fatal(err)
			}
			x.Cancel()
		}},
		{"envoy closes without a response", func(t *testing.T, x *fakeenvoy.Exchange) {
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"protocol violation after routing", func(t *testing.T, x *fakeenvoy.Exchange) {
			// A second response_headers is out of order: the server fails the stream.
			if _, err := x.ResponseHeaders(fakeenvoy.Headers{{Key: ":status", Value: "200"}}, false, nil); err != nil {
				t.Fatal(err)
			}
			_, err := x.ResponseHeaders(fakeenvoy.Headers{{Key: ":status", Value: "200"}}, false, nil)
			if status.Code(errors.Unwrap(err)) != codes.FailedPrecondition {
				t.Fatalf("err = %v, want FailedPrecondition", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			x := h.start(fakeenvoy.FullDuplex())
			if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
				t.Fatal(err)
			}
			tc.end(t, x)
			h.waitIdle()
			if b, e := h.fleet.counts(); b != 1 || e != 1 {
				t.Fatalf("begins/ends %d/%d", b, e)
			}
			_, _, _, fin := h.policy.snapshot()
			if len(fin) != 1 {
				t.Fatalf("finished %v", fin)
			}
			if h.counter("kvrouter_extproc_streams_in_flight") != 0 {
				t.Fatal("stream gauge not back to 0")
			}
		})
	}
}

func TestProtocolViolations(t *testing.T) {
	tests := []struct {
		name string
		msgs []*extprocv3.ProcessingRequest
	}{
		{"response before request", []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
			ResponseHeaders: &extprocv3.HttpHeaders{}}}}},
		{"body before headers", []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{}}}}},
		{"headers twice", []*extprocv3.ProcessingRequest{
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}},
			{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}}}},
		{"empty message", []*extprocv3.ProcessingRequest{{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			st, err := h.conn.Client.Process(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.msgs {
				if err := st.Send(m); err != nil {
					break
				}
			}
			for {
				if _, err = st.Recv(); err != nil {
					break
				}
			}
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("err = %v", err)
			}
			if got := h.counter("kvrouter_extproc_stream_errors_total", "reason", "protocol"); got != 1 {
				t.Fatalf("protocol errors %v", got)
			}
		})
	}
}

func TestDrain(t *testing.T) {
	h := newHarness(t)
	open := h.start(fakeenvoy.FullDuplex())
	if _, err := open.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
		t.Fatal(err)
	}
	h.srv.Drain()
	if h.srv.Active() != 1 {
		t.Fatalf("active %d", h.srv.Active())
	}
	refused := h.start(fakeenvoy.FullDuplex())
	_, err := refused.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
	if status.Code(errors.Unwrap(err)) != codes.Unavailable {
		t.Fatalf("new stream while draining: %v", err)
	}
	refused.Cancel()
	// The open stream finishes normally.
	if _, err := open.Response(200, nil, [][]byte{[]byte("{}")}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := open.Close(); err != nil {
		t.Fatal(err)
	}
	h.waitIdle()
	if got := h.counter("kvrouter_extproc_streams_refused_total"); got != 1 {
		t.Fatalf("refused %v", got)
	}
}

func TestMetricsGolden(t *testing.T) {
	h := newHarness(t, func(o *extproc.Options) { o.Policy = scoring.NewRoundRobin() })
	run := func(body string, md bool) {
		x := h.start(fakeenvoy.FullDuplex())
		req := fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{[]byte(body)}}
		if md {
			req.Metadata = fakeenvoy.SubsetHint()
		}
		res, err := x.Request(req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Immediate == nil {
			usage := "data: {\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n"
			if _, err := x.Response(200, nil, [][]byte{[]byte(usage)}, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
		x.Close()
		h.waitIdle()
	}
	run(string(chatBody("m")), false)
	run(string(chatBody("m")), false)
	run(`{"model":`, false)
	run(string(chatBody("m")), true)
	f, err := os.Open("testdata/metrics.golden")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(h.reg, f,
		"kvrouter_routing_decisions_total", "kvrouter_request_parse_errors_total", "kvrouter_routing_fallbacks_total",
		"kvrouter_no_endpoint_total", "kvrouter_extproc_streams_in_flight", "kvrouter_responses_total",
		"kvrouter_prompt_tokens_total", "kvrouter_cached_prompt_tokens_total"); err != nil {
		t.Fatal(err)
	}
}

// An upstream may answer before the request body ends; in FULL_DUPLEX_STREAMED the rest
// of the body still passes through.
func TestResponseBeforeRequestBodyEnds(t *testing.T) {
	fl := newFleet(epA).serve("m", epA)
	srv := extproc.New(extproc.Options{Policy: &recordingPolicy{}, Fleet: fl, MaxBodyBytes: 8})
	hdrs := func(kv ...string) *corev3.HeaderMap {
		m := &corev3.HeaderMap{}
		for i := 0; i < len(kv); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
		}
		return m
	}
	st := &memStream{msgs: []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":path", "/v1/completions")}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m","prompt":"`)}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "413"), EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`x"}`), EndOfStream: true}}},
	}}
	if err := srv.Process(st); err != nil {
		t.Fatal(err)
	}
	if st.replies != 4 {
		t.Fatalf("replies %d, want 4", st.replies)
	}
	if b, e := fl.counts(); b != 1 || e != 1 {
		t.Fatalf("begins/ends %d/%d", b, e)
	}
}

// In BUFFERED mode Envoy sends no body message for an empty body: the headers reply
// already names an endpoint, committed when the trailers or the response come.
func TestBufferedEmptyBody(t *testing.T) {
	tests := []struct {
		name        string
		sendTrailer bool
		replies     []string
	}{
		{"trailers sent", true, []string{"request_headers", "request_trailers"}},
		{"trailers skipped", false, []string{"request_headers"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.fleet.inflight[epA] = 3
			x := h.start(mode(filterv3.ProcessingMode_BUFFERED, tc.sendTrailer))
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Trailers: fakeenvoy.Headers{{Key: "x-t", Value: "1"}}})
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, res, epB)
			if got := x.Replies(); !slices.Equal(got, tc.replies) {
				t.Fatalf("replies %v, want %v", got, tc.replies)
			}
			if _, err := x.Response(200, nil, [][]byte{[]byte("{}")}, nil, nil); err != nil {
				t.Fatal(err)
			}
			x.Close()
			h.waitIdle()
			if b, e := h.fleet.counts(); b != 1 || e != 1 {
				t.Fatalf("begins/ends %d/%d", b, e)
			}
			if got := h.counter("kvrouter_routing_decisions_total"); got != 1 {
				t.Fatalf("decisions %v", got)
			}
		})
	}
}

// In BUFFERED mode the body decision overrides the endpoint named in the headers reply,
// and only the final one is begun.
func TestBufferedBodyOverridesHeadersReply(t *testing.T) {
	h := newHarness(t)
	h.fleet.inflight[epB] = 3 // the headers reply names A (load); the body needs B
	x := h.start(mode(filterv3.ProcessingMode_BUFFERED, false))
	res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("only-b")}})
	if err != nil {
		t.Fatal(err)
	}
	checkDecision(t, res, epB)
	x.Close()
	h.waitIdle()
	if b, e := h.fleet.counts(); b != 1 || e != 1 {
		t.Fatalf("begins/ends %d/%d", b, e)
	}
	if got := h.counter("kvrouter_routing_decisions_total", "endpoint", epA); got != 0 {
		t.Fatalf("tentative endpoint counted as a decision")
	}
}

// TestRepliesPerEndpoint interleaves requests routed to different endpoints, in the modes
// whose decision goes in the headers reply and in the body reply, with and without
// client-sent x-gateway-destination-* headers and with differing served endpoints: each
// reply must name its own endpoint (the server reuses replies per endpoint).
func TestRepliesPerEndpoint(t *testing.T) {
	h := newHarness(t)
	spoof := fakeenvoy.Header{Key: "x-gateway-destination-other", Value: "x"}
	for round := range 3 {
		for _, cfg := range []fakeenvoy.Config{fakeenvoy.FullDuplex(), mode(filterv3.ProcessingMode_BUFFERED, false)} {
			for _, tc := range []struct{ model, want, served string }{{"only-b", epB, ""}, {"lora-x", epC, epA}, {"only-b", epB, epC}} {
				t.Run(fmt.Sprintf("%d/%s/%s/%s", round, cfg.RequestBodyMode, tc.model, tc.served), func(t *testing.T) {
					hdrs := postHeaders()
					if round == 1 {
						hdrs = postHeaders(spoof)
					}
					x := h.start(cfg)
					res, err := x.Request(fakeenvoy.Request{Headers: hdrs, Body: [][]byte{chatBody(tc.model)}})
					if err != nil {
						t.Fatal(err)
					}
					checkDecision(t, res, tc.want)
					resp, err := x.Response(200, nil, nil, nil, fakeenvoy.ServedMetadata(tc.served))
					if err != nil {
						t.Fatal(err)
					}
					wantServed := tc.want
					if tc.served != "" {
						wantServed = tc.served
					}
					if got := resp.Headers.Values(epp.HeaderServed); len(got) != 1 || got[0] != wantServed {
						t.Fatalf("served header %q, want [%s]", got, wantServed)
					}
					if err := x.Close(); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
}

// TestRegistryFleetConcurrent routes concurrent requests through the real endpoint
// registry, whose candidates the server reads into pooled buffers: every decision names
// an endpoint serving the model (within the subset hint when there is one), and every
// in-flight count returns to zero.
func TestRegistryFleetConcurrent(t *testing.T) {
	f, err := fleet.New(fleet.Config{Scrape: fleet.DefaultScrapeConfig(), Endpoints: []fleet.EndpointConfig{
		{Address: epA, Models: []string{"m"}}, {Address: epB, Models: []string{"m", "only-b"}}, {Address: epC, Models: []string{"other"}}}},
		fleet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := extproc.New(extproc.Options{Policy: scoring.NewLeastLoad(), Fleet: f})
	conn, err := fakeenvoy.Bufconn(srv.Register)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tests := []struct {
		model string
		hint  []string
		want  []string
	}{
		{"m", nil, []string{epA, epB}},
		{"only-b", nil, []string{epB}},
		{"other", nil, []string{epC}},
		{"unknown", nil, []string{epA, epB, epC}},
		{"m", []string{epB}, []string{epB}},
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		tc := tests[i%len(tests)]
		wg.Go(func() {
			x, err := fakeenvoy.Start(context.Background(), conn.Client, fakeenvoy.FullDuplex())
			if err != nil {
				errs <- err
				return
			}
			var md *corev3.Metadata
			if tc.hint != nil {
				md = fakeenvoy.SubsetHint(tc.hint...)
			}
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody(tc.model)}, Metadata: md})
			if err == nil {
				if dest, _ := res.Headers.Get(epp.HeaderDestination); !slices.Contains(tc.want, dest) {
					err = fmt.Errorf("model %s hint %v: routed to %q, want one of %v", tc.model, tc.hint, dest, tc.want)
				}
			}
			if err == nil {
				_, err = x.Response(200, nil, nil, nil, nil)
			}
			if cerr := x.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, st := range f.Status() {
		if st.InFlight != 0 {
			t.Errorf("%s: %d in flight after every response ended", st.Config.Address, st.InFlight)
		}
	}
}

// TestPooledTokenIDs: a tokenizer that appends to the router's buffers gets them back
// for later requests, and concurrent requests never see each other's ids.
func TestPooledTokenIDs(t *testing.T) {
	tok := &appendingTokenizer{}
	pol := &idCheckPolicy{seen: map[string]string{}}
	h := newHarness(t, func(o *extproc.Options) { o.Tokenizer, o.Policy = tok, pol })
	run := func(i int) error {
		x, err := fakeenvoy.Start(context.Background(), h.conn.Client, fakeenvoy.FullDuplex())
		if err != nil {
			return err
		}
		defer x.Close()
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"req-%d %s"}]}`, i, strings.Repeat("x", i*37%500))
		_, err = x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{[]byte(body)}})
		return err
	}
	runSerialThenConcurrent(t, run, 64)
	h.waitIdle()
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if len(pol.problems) > 0 {
		t.Fatalf("ids changed between Pick and Routed:\n%s", strings.Join(pol.problems, "\n"))
	}
	for id, ids := range pol.seen {
		if !strings.HasPrefix(ids, `[{"role":"user","content":"req-`) {
			t.Fatalf("request %s: policy saw ids %q, not its own messages", id, ids)
		}
	}
	tok.mu.Lock()
	defer tok.mu.Unlock()
	if tok.calls != 84 || tok.reused == 0 {
		t.Fatalf("tokenizer calls %d, with a reused buffer %d; want 84 and some reused", tok.calls, tok.reused)
	}
}

// keyCheckPolicy is least-load that checks, at each Pick, that the request carries
// the tokenizer's Prefix and that the block keys the policies compute from it equal
// those computed from scratch.
type keyCheckPolicy struct {
	scoring.LeastLoad
	mu       sync.Mutex
	picks    int
	problems []string
}

func (p *keyCheckPolicy) Pick(r *scoring.Request, c []scoring.Endpoint) (scoring.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.picks++
	switch {
	case r.Prefix == nil || len(r.Prefix.Ends()) == 0:
		p.problems = append(p.problems, r.ID+": no prefix")
	case !slices.Equal(r.Keys(16, nil), index.Keys(r.Root(), r.TokenIDs, 16, nil)):
		p.problems = append(p.problems, r.ID+": keys differ from index.Keys")
	}
	return p.LeastLoad.Pick(r, c)
}

// TestPrefixKeysReachPolicies: with prompt.Registry as the tokenizer, each turn of a
// conversation reaches the policy with the tokenizer's Prefix, whose keys are exact.
func TestPrefixKeysReachPolicies(t *testing.T) {
	reg, err := prompt.NewRegistry(prompt.Config{Models: []prompt.ModelConfig{{Name: "m", Dir: testmodels.Dir(t, "qwen3")}}}, prompt.RegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pol := &keyCheckPolicy{}
	h := newHarness(t, func(o *extproc.Options) { o.Tokenizer, o.Policy = reg, pol })
	msgs := `{"role":"system","content":"` + strings.Repeat("You route requests. ", 40) + `"}`
	for turn := range 4 {
		msgs += fmt.Sprintf(`,{"role":"user","content":"question %d %s"}`, turn, strings.Repeat("why? ", 30))
		x, err := fakeenvoy.Start(context.Background(), h.conn.Client, fakeenvoy.FullDuplex())
		if err != nil {
			t.Fatal(err)
		}
		_, err = x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{[]byte(`{"model":"m","messages":[` + msgs + `]}`)}})
		x.Close()
		if err != nil {
			t.Fatal(err)
		}
		msgs += fmt.Sprintf(`,{"role":"assistant","content":"answer %d %s"}`, turn, strings.Repeat("because. ", 30))
	}
	h.waitIdle()
	pol.mu.Lock()
	defer pol.mu.Unlock()
	if pol.picks != 4 || len(pol.problems) > 0 {
		t.Fatalf("%d picks; problems: %v", pol.picks, pol.problems)
	}
}

// runSerialThenConcurrent calls run for 20 requests one after the other (pooled buffers
// come back between them), then for n at once (no buffer may be shared), and fails t on
// the first error.
func runSerialThenConcurrent(t *testing.T, run func(i int) error, n int) {
	t.Helper()
	for i := range 20 {
		if err := run(i); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if err := run(100 + i); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
