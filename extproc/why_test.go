package extproc_test

import (
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/internal/testindex"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// TestDecisionKindInMetadata: the proxy sees each decision's kind in kvrouter's own
// dynamic-metadata namespace, beside the envoy.lb destination, never as a header: a new
// prefix's request says home, a request of a prefix its endpoint holds says holder, to
// the same endpoint (the cached reply is keyed by kind too), with or without client-sent
// x-gateway-destination-* headers (an uncached reply) and in every body mode; a policy
// that names no kind adds no kvrouter namespace.
func TestDecisionKindInMetadata(t *testing.T) {
	spoof := fakeenvoy.Header{Key: epp.HeaderPrefix + "spoofed", Value: "x"}
	for _, tc := range []struct {
		name  string
		mode  filterv3.ProcessingMode_BodySendMode
		extra []fakeenvoy.Header
	}{
		{"buffered", filterv3.ProcessingMode_BUFFERED, nil},
		{"full-duplex", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, nil},
		{"buffered-spoofed", filterv3.ProcessingMode_BUFFERED, []fakeenvoy.Header{spoof}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := testindex.New()
			pol, err := placement.New(placement.DefaultConfig(), ix, nil, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			fleet := newFleet(epA).serve("m", epA)
			fleet.metrics = map[string]scoring.Metrics{epA: {Valid: true, NumGPUBlocks: 1000, BlockSize: 16}}
			h := newHarness(t, func(o *extproc.Options) { o.Policy, o.Tokenizer, o.Fleet = pol, prefixTokenizer{}, fleet })
			route := func(p, tail int) *fakeenvoy.RequestResult {
				t.Helper()
				x := h.start(mode(tc.mode, false))
				defer x.Close()
				req := completion(p, tail)
				req.Headers = append(req.Headers, tc.extra...)
				res, err := x.Request(req)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := x.Response(200, nil, [][]byte{[]byte(`{}`)}, nil, nil); err != nil {
					t.Fatal(err)
				}
				return res
			}
			check := func(res *fakeenvoy.RequestResult, want string) {
				t.Helper()
				checkDecision(t, res, epA)
				if got := fakeenvoy.MetadataString(res.DynamicMetadata, epp.NamespaceKVRouter, epp.KeyDecision); got != want {
					t.Errorf("%s:%s metadata %q, want %q", epp.NamespaceKVRouter, epp.KeyDecision, got, want)
				}
				for _, kv := range res.Headers {
					if strings.Contains(kv.Key, "kvrouter") || kv.Value == want {
						t.Errorf("the decision's kind reached upstream as header %s: %s", kv.Key, kv.Value)
					}
				}
			}
			check(route(0, 0), "home")
			ix.Hold(epA, index.Keys(index.Root("m", "", ""), prefixTokens(0, 0), 16, nil)[:64])
			check(route(0, 1), "holder")
			check(route(1, 0), "home")
		})
	}
	t.Run("policy-says-nothing", func(t *testing.T) {
		h := newHarness(t, func(o *extproc.Options) { o.Policy = scoring.NewRoundRobin() })
		x := h.start(mode(filterv3.ProcessingMode_BUFFERED, false))
		defer x.Close()
		res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("only-b")}})
		if err != nil {
			t.Fatal(err)
		}
		checkDecision(t, res, epB)
		if _, ok := res.DynamicMetadata.GetFields()[epp.NamespaceKVRouter]; ok {
			t.Errorf("a policy naming no kind sent %s metadata %v", epp.NamespaceKVRouter, res.DynamicMetadata)
		}
	})
}
