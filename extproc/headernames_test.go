package extproc_test

import (
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// llm-d-router renamed the objective and model-rewrite headers to x-llm-d-* and keeps the
// Inference Extension's x-gateway-* names as aliases: kvrouter reads both, and when a
// request carries both, llm-d-router's name wins, as it does there. A name's first
// non-empty value counts, so an empty x-llm-d-* header leaves the x-gateway-* one in force.
func TestHeaderNamesOfLLMDRouter(t *testing.T) {
	waiting := func(n int) scoring.Metrics { return scoring.Metrics{Valid: true, Waiting: n} }
	saturated := map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9), epC: waiting(9)}
	tests := []struct {
		name      string
		headers   fakeenvoy.Headers
		wantModel string // the model the upstream gets; the request's is "lora-x" (on C)
		wantDest  string
		wantShed  bool // the request was sheddable ("batch")
	}{
		{name: "none", wantModel: "lora-x", wantDest: epC},
		{name: "rewrite, Inference Extension's name",
			headers:   fakeenvoy.Headers{{Key: epp.HeaderModelRewrite, Value: "only-b"}},
			wantModel: "only-b", wantDest: epB},
		{name: "rewrite, llm-d-router's name",
			headers:   fakeenvoy.Headers{{Key: epp.HeaderModelRewriteLLMD, Value: "only-b"}},
			wantModel: "only-b", wantDest: epB},
		{name: "rewrite, both: llm-d-router's wins, sent first",
			headers:   fakeenvoy.Headers{{Key: epp.HeaderModelRewriteLLMD, Value: "only-b"}, {Key: epp.HeaderModelRewrite, Value: "m"}},
			wantModel: "only-b", wantDest: epB},
		{name: "rewrite, both: llm-d-router's wins, sent last",
			headers:   fakeenvoy.Headers{{Key: epp.HeaderModelRewrite, Value: "m"}, {Key: "X-LLM-D-Model-Name-Rewrite", Value: "only-b"}},
			wantModel: "only-b", wantDest: epB},
		{name: "rewrite, an empty llm-d-router header leaves the other",
			headers:   fakeenvoy.Headers{{Key: epp.HeaderModelRewriteLLMD, Value: ""}, {Key: epp.HeaderModelRewrite, Value: "only-b"}},
			wantModel: "only-b", wantDest: epB},
		{name: "objective, Inference Extension's name",
			headers:  fakeenvoy.Headers{{Key: epp.HeaderObjective, Value: "batch"}},
			wantShed: true},
		{name: "objective, llm-d-router's name",
			headers:  fakeenvoy.Headers{{Key: epp.HeaderObjectiveLLMD, Value: "batch"}},
			wantShed: true},
		{name: "objective, both: llm-d-router's critical one wins",
			headers:   fakeenvoy.Headers{{Key: epp.HeaderObjective, Value: "batch"}, {Key: epp.HeaderObjectiveLLMD, Value: "chat"}},
			wantModel: "lora-x", wantDest: epC},
		{name: "objective, both: llm-d-router's sheddable one wins",
			headers:  fakeenvoy.Headers{{Key: epp.HeaderObjectiveLLMD, Value: "batch"}, {Key: epp.HeaderObjective, Value: "chat"}},
			wantShed: true},
	}
	for _, tc := range tests {
		for _, m := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED} {
			t.Run(tc.name+"/"+m.String(), func(t *testing.T) {
				h := newHarness(t, func(o *extproc.Options) { o.ShedWaiting, o.Objectives = 8, testObjectives })
				h.fleet.metrics = saturated
				x := h.start(mode(m, false))
				defer x.Cancel()
				res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(tc.headers...), Body: [][]byte{chatBody("lora-x")}})
				if err != nil {
					t.Fatal(err)
				}
				if tc.wantShed {
					if res.Immediate == nil || res.Immediate.GetStatus().GetCode() != 429 {
						t.Fatalf("got %v, want a 429", res.Immediate)
					}
					if n := h.counter("kvrouter_requests_shed_total", "objective", "batch"); n != 1 {
						t.Fatalf("shed_total{objective=batch} %v, want 1", n)
					}
					return
				}
				checkDecision(t, res, tc.wantDest)
				checkUpstreamModel(t, res.Body, tc.wantModel)
			})
		}
	}
}
