package extproc_test

import (
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// TestUpstreamFailureSignal: the response headers tell the fleet when the chosen
// endpoint did not answer: a 503 the proxy made itself (no upstream service time), or a
// response served by another endpoint (the proxy retried on a fallback). A 503 from the
// upstream itself, and an ordinary response, say nothing.
func TestUpstreamFailureSignal(t *testing.T) {
	upstream := fakeenvoy.Headers{{Key: epp.HeaderUpstreamServiceTime, Value: "12"}}
	tests := []struct {
		name    string
		status  int
		headers fakeenvoy.Headers
		served  string
		want    []string
		kind    string
	}{
		{"local reply 503", 503, fakeenvoy.Headers{{Key: "content-type", Value: "text/plain"}}, "", []string{epA}, "local_reply"},
		{"503 from the upstream", 503, upstream, "", nil, ""},
		{"200 from the upstream", 200, upstream, "", nil, ""},
		{"served by a fallback", 200, upstream, epB, []string{epA}, "fallback_served"},
		{"served by the chosen endpoint", 200, upstream, epA, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			x := h.start(fakeenvoy.FullDuplex())
			if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
				t.Fatal(err)
			}
			if _, err := x.Response(tc.status, tc.headers, [][]byte{[]byte("x")}, nil, fakeenvoy.ServedMetadata(tc.served)); err != nil {
				t.Fatal(err)
			}
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
			h.waitIdle()
			if got := h.fleet.failures(); !slices.Equal(got, tc.want) {
				t.Errorf("UpstreamFailed calls %v, want %v", got, tc.want)
			}
			for _, kind := range []string{"local_reply", "fallback_served"} {
				want := 0.0
				if kind == tc.kind {
					want = 1
				}
				if got := h.counter("kvrouter_upstream_failures_total", "kind", kind); got != want {
					t.Errorf("kvrouter_upstream_failures_total{kind=%q} = %v, want %v", kind, got, want)
				}
			}
		})
	}
}

// TestFallbackServedMovesTheRequest: when the proxy retried on a fallback the router
// listed, the request is in flight there (not on the chosen endpoint) until its response
// ends, and its response and token usage count under it. An endpoint the router did not
// list leaves the request where it was routed.
func TestFallbackServedMovesTheRequest(t *testing.T) {
	upstream := fakeenvoy.Headers{{Key: ":status", Value: "200"}, {Key: epp.HeaderUpstreamServiceTime, Value: "12"}}
	usage := []byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\ndata: [DONE]\n\n")
	for _, tc := range []struct {
		name, served, counted string
	}{
		{"listed fallback", epC, epC},
		{"endpoint not listed", epB, epA},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			if _, err := x.ResponseHeaders(upstream, false, fakeenvoy.ServedMetadata(tc.served)); err != nil {
				t.Fatal(err)
			}
			for _, ep := range []string{epA, epB, epC} {
				want := 0
				if ep == tc.counted {
					want = 1
				}
				if got := h.fleet.inFlight(ep); got != want {
					t.Errorf("in flight on %s during the response = %d, want %d", ep, got, want)
				}
			}
			if err := x.ResponseBody(usage, true); err != nil {
				t.Fatal(err)
			}
			if _, _, err := x.ReadResponseBody(); err != nil {
				t.Fatal(err)
			}
			x.Close()
			h.waitIdle()
			for _, ep := range []string{epA, epB, epC} {
				if got := h.fleet.inFlight(ep); got != 0 {
					t.Errorf("in flight on %s after the response = %d, want 0", ep, got)
				}
			}
			if got := h.counter("kvrouter_responses_total", "endpoint", tc.counted, "code", "2xx"); got != 1 {
				t.Errorf("kvrouter_responses_total{endpoint=%s} = %v, want 1", tc.counted, got)
			}
			if got := h.counter("kvrouter_cached_prompt_tokens_total", "endpoint", tc.counted); got != 256 {
				t.Errorf("kvrouter_cached_prompt_tokens_total{endpoint=%s} = %v, want 256", tc.counted, got)
			}
			if got := h.fleet.failures(); !slices.Equal(got, []string{epA}) {
				t.Errorf("UpstreamFailed calls %v, want [%s]", got, epA)
			}
		})
	}
}
