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
			for kind, want := range map[string]float64{"home": 2, "holder": 1, scoring.KindFallback: 0} {
				if got := h.counter("kvrouter_routing_decision_kinds_total", "policy", "placement", "kind", kind); got != want {
					t.Errorf("kvrouter_routing_decision_kinds_total{policy=placement,kind=%s} = %v, want %v", kind, got, want)
				}
			}
		})
	}
	// A policy naming no kind names none in the proxy's metadata; in BUFFERED mode the body
	// reply says so (an empty kind), overriding the headers reply's tentative pick, the
	// fallback's, so the access log never shows a fallback the request did not take.
	for _, tc := range []struct {
		name      string
		mode      filterv3.ProcessingMode_BodySendMode
		namespace bool // the kvrouter namespace is sent (with an empty kind)
	}{
		{"policy-says-nothing/full-duplex", filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false},
		{"policy-says-nothing/buffered", filterv3.ProcessingMode_BUFFERED, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) { o.Policy = silentPolicy{scoring.NewRoundRobin()} })
			x := h.start(mode(tc.mode, false))
			defer x.Close()
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("only-b")}})
			if err != nil {
				t.Fatal(err)
			}
			checkDecision(t, res, epB)
			if got := fakeenvoy.MetadataString(res.DynamicMetadata, epp.NamespaceKVRouter, epp.KeyDecision); got != "" {
				t.Errorf("a policy naming no kind: %s:%s metadata %q", epp.NamespaceKVRouter, epp.KeyDecision, got)
			}
			if _, ok := res.DynamicMetadata.GetFields()[epp.NamespaceKVRouter]; ok != tc.namespace {
				t.Errorf("%s namespace sent: %v, want %v (%v)", epp.NamespaceKVRouter, ok, tc.namespace, res.DynamicMetadata)
			}
			if got := h.counter("kvrouter_routing_decision_kinds_total", "policy", "round-robin"); got != 1 {
				t.Errorf("kvrouter_routing_decision_kinds_total{policy=round-robin} = %v, want 1", got)
			}
		})
	}
}

// TestFallbackDecisionKind: a request the router cannot score is routed by the fallback
// policy and says so, in the proxy's metadata and in kvrouter_routing_decision_kinds_total,
// whether it has no body at all (a GET), or its body turns out empty after the BUFFERED
// headers reply named the tentative pick; the configured policy is never asked.
func TestFallbackDecisionKind(t *testing.T) {
	get := fakeenvoy.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}, {Key: ":authority", Value: "gw"}}
	for _, tc := range []struct {
		name string
		cfg  fakeenvoy.Config
		req  fakeenvoy.Request
	}{
		{"get", fakeenvoy.FullDuplex(), fakeenvoy.Request{Headers: get}},
		{"buffered-empty-body", mode(filterv3.ProcessingMode_BUFFERED, true),
			fakeenvoy.Request{Headers: postHeaders(), Trailers: fakeenvoy.Headers{{Key: "x-trailer", Value: "t"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := &recordingPolicy{}
			h := newHarness(t, func(o *extproc.Options) { o.Policy = pol })
			x := h.start(tc.cfg)
			defer x.Close()
			res, err := x.Request(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := fakeenvoy.MetadataString(res.DynamicMetadata, epp.NamespaceKVRouter, epp.KeyDecision); got != scoring.KindFallback {
				t.Errorf("%s:%s metadata %q, want %q", epp.NamespaceKVRouter, epp.KeyDecision, got, scoring.KindFallback)
			}
			if got := h.counter("kvrouter_routing_decision_kinds_total", "policy", "least-load", "kind", scoring.KindFallback); got != 1 {
				t.Errorf("kvrouter_routing_decision_kinds_total{policy=least-load,kind=fallback} = %v, want 1", got)
			}
			if got := h.counter("kvrouter_routing_fallbacks_total", "reason", "no_body"); got != 1 {
				t.Errorf("no_body fallbacks = %v, want 1", got)
			}
			if len(pol.picks) != 0 {
				t.Errorf("the configured policy was asked %d times", len(pol.picks))
			}
		})
	}
}

// silentPolicy is a policy naming no decision kind (Decision.Kind ""), as a policy
// outside this repository may: it routes as the policy it wraps.
type silentPolicy struct{ scoring.Policy }

func (p silentPolicy) Pick(req *scoring.Request, cands []scoring.Endpoint) (scoring.Decision, error) {
	d, err := p.Policy.Pick(req, cands)
	d.Kind = ""
	return d, err
}
