package extproc_test

import (
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/extproc/envoytest"
	"github.com/kvrouter/kvrouter/scoring"
)

// Overload: with ShedWaiting set, a request is answered 429 with Retry-After when every
// eligible endpoint's queue is over the bound; otherwise it is routed as usual.
func TestShedWhenEverythingIsSaturated(t *testing.T) {
	waiting := func(n int) scoring.Metrics { return scoring.Metrics{Valid: true, Waiting: n} }
	tests := []struct {
		name       string
		shed       int
		retryAfter time.Duration
		metrics    map[string]scoring.Metrics
		subset     []string // the proxy's subset hint, when set
		get        bool     // a GET without body
		wantShed   bool
		wantRetry  string
	}{
		{name: "off by default", metrics: map[string]scoring.Metrics{epA: waiting(100), epB: waiting(100), epC: waiting(100)}},
		{name: "all saturated", shed: 8, metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(20), epC: waiting(100)},
			wantShed: true, wantRetry: "1"},
		{name: "retry after rounds up", shed: 8, retryAfter: 1500 * time.Millisecond,
			metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9), epC: waiting(9)}, wantShed: true, wantRetry: "2"},
		{name: "one at the bound is not saturated", shed: 8, metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(8), epC: waiting(9)}},
		{name: "unknown figures are not saturated", shed: 8, metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9)}},
		{name: "only the subset counts", shed: 8, metrics: map[string]scoring.Metrics{epA: waiting(0), epB: waiting(9), epC: waiting(9)},
			subset: []string{epB, epC}, wantShed: true, wantRetry: "1"},
		{name: "a GET is never shed", shed: 8, metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9), epC: waiting(9)}, get: true},
	}
	for _, tc := range tests {
		for _, m := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED} {
			t.Run(tc.name+"/"+m.String(), func(t *testing.T) {
				h := newHarness(t, func(o *extproc.Options) { o.ShedWaiting, o.RetryAfter = tc.shed, tc.retryAfter })
				h.fleet.metrics = tc.metrics
				x := h.start(mode(m, false))
				defer x.Cancel()
				req := envoytest.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}
				if tc.get {
					req = envoytest.Request{Headers: envoytest.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}}
				}
				if tc.subset != nil {
					req.Metadata = envoytest.SubsetHint(tc.subset...)
				}
				res, err := x.Request(req)
				if err != nil {
					t.Fatal(err)
				}
				if !tc.wantShed {
					if res.Immediate != nil {
						t.Fatalf("answered %v, want the request routed", res.Immediate.GetStatus())
					}
					if h.counter("kvrouter_requests_shed_total") != 0 {
						t.Fatal("counted as shed")
					}
					return
				}
				if res.Immediate == nil || res.Immediate.GetStatus().GetCode() != 429 {
					t.Fatalf("got %v, want a 429", res.Immediate)
				}
				checkErrorHeaders(t, res.Immediate, tc.wantRetry)
				if !strings.Contains(string(res.Immediate.GetBody()), `"code":429`) {
					t.Fatalf("body %s", res.Immediate.GetBody())
				}
				if got := h.counter("kvrouter_requests_shed_total"); got != 1 {
					t.Fatalf("shed_total %v, want 1", got)
				}
				if h.counter("kvrouter_no_endpoint_total") != 0 {
					t.Fatal("a shed request counted as no endpoint")
				}
				h.waitIdle()
				if b, _ := h.fleet.counts(); b != 0 {
					t.Fatalf("begins = %d after a 429", b)
				}
			})
		}
	}
}
