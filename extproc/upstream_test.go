package extproc_test

import (
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/epp"
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
