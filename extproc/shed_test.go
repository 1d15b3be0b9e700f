package extproc_test

import (
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// objectives is a fixed name -> priority table, as the configuration's objectives map
// or the InferenceObjectives watched in Kubernetes give.
type objectives map[string]int

func (o objectives) Priority(name string) (int, bool) {
	p, ok := o[name]
	return p, ok
}

// testObjectives: "batch" is sheddable, "chat" critical, "default" explicitly 0.
var testObjectives = objectives{"batch": -1, "chat": 10, "default": 0}

// Overload: with ShedWaiting set, a sheddable request (its InferenceObjective's priority
// < 0, named in x-gateway-inference-objective) is answered 429 with Retry-After when
// every eligible endpoint's queue is over the bound; every other request is routed as
// usual, saturated or not.
func TestShedSheddableWhenEverythingIsSaturated(t *testing.T) {
	waiting := func(n int) scoring.Metrics { return scoring.Metrics{Valid: true, Waiting: n} }
	full := map[string]scoring.Metrics{epA: waiting(9), epB: waiting(20), epC: waiting(100)}
	tests := []struct {
		name       string
		shed       int
		retryAfter time.Duration
		objectives extproc.Objectives // nil: none known
		objective  []string           // x-gateway-inference-objective header values sent
		metrics    map[string]scoring.Metrics
		subset     []string // the proxy's subset hint, when set
		get        bool     // a GET without body
		wantShed   bool
		wantRetry  string
	}{
		{name: "off by default", objectives: testObjectives, objective: []string{"batch"},
			metrics: map[string]scoring.Metrics{epA: waiting(100), epB: waiting(100), epC: waiting(100)}},
		{name: "sheddable and all saturated", shed: 8, objectives: testObjectives, objective: []string{"batch"}, metrics: full,
			wantShed: true, wantRetry: "1"},
		{name: "no header is priority 0: routed", shed: 8, objectives: testObjectives, metrics: full},
		{name: "unknown objective is priority 0: routed", shed: 8, objectives: testObjectives, objective: []string{"batch-x"}, metrics: full},
		{name: "objective names are case-sensitive", shed: 8, objectives: testObjectives, objective: []string{"Batch"}, metrics: full},
		{name: "priority 0 objective: routed", shed: 8, objectives: testObjectives, objective: []string{"default"}, metrics: full},
		{name: "critical objective: routed", shed: 8, objectives: testObjectives, objective: []string{"chat"}, metrics: full},
		{name: "no objectives known: routed", shed: 8, objective: []string{"batch"}, metrics: full},
		{name: "an empty header is no objective", shed: 8, objectives: testObjectives, objective: []string{""}, metrics: full},
		{name: "the first header counts: critical first", shed: 8, objectives: testObjectives, objective: []string{"chat", "batch"}, metrics: full},
		{name: "the first header counts: sheddable first", shed: 8, objectives: testObjectives, objective: []string{"batch", "chat"}, metrics: full,
			wantShed: true, wantRetry: "1"},
		{name: "an overlong name is no objective", shed: 8, objectives: objectives{strings.Repeat("b", 300): -1},
			objective: []string{strings.Repeat("b", 300)}, metrics: full},
		{name: "retry after rounds up", shed: 8, retryAfter: 1500 * time.Millisecond, objectives: testObjectives, objective: []string{"batch"},
			metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9), epC: waiting(9)}, wantShed: true, wantRetry: "2"},
		{name: "one at the bound is not saturated", shed: 8, objectives: testObjectives, objective: []string{"batch"},
			metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(8), epC: waiting(9)}},
		{name: "unknown figures are not saturated", shed: 8, objectives: testObjectives, objective: []string{"batch"},
			metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9)}},
		{name: "only the subset counts", shed: 8, objectives: testObjectives, objective: []string{"batch"},
			metrics: map[string]scoring.Metrics{epA: waiting(0), epB: waiting(9), epC: waiting(9)},
			subset:  []string{epB, epC}, wantShed: true, wantRetry: "1"},
		{name: "a GET is never shed", shed: 8, objectives: testObjectives, objective: []string{"batch"},
			metrics: map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9), epC: waiting(9)}, get: true},
	}
	for _, tc := range tests {
		for _, m := range []filterv3.ProcessingMode_BodySendMode{filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_BUFFERED} {
			t.Run(tc.name+"/"+m.String(), func(t *testing.T) {
				h := newHarness(t, func(o *extproc.Options) {
					o.ShedWaiting, o.RetryAfter, o.Objectives = tc.shed, tc.retryAfter, tc.objectives
				})
				h.fleet.metrics = tc.metrics
				x := h.start(mode(m, false))
				defer x.Cancel()
				var objective fakeenvoy.Headers
				for _, v := range tc.objective {
					objective = append(objective, fakeenvoy.Header{Key: epp.HeaderObjective, Value: v})
				}
				req := fakeenvoy.Request{Headers: postHeaders(objective...), Body: [][]byte{chatBody("m")}}
				if tc.get {
					req = fakeenvoy.Request{Headers: append(fakeenvoy.Headers{{Key: ":method", Value: "GET"}, {Key: ":path", Value: "/v1/models"}}, objective...)}
				}
				if tc.subset != nil {
					req.Metadata = fakeenvoy.SubsetHint(tc.subset...)
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
				if got := h.counter("kvrouter_requests_shed_total", "objective", tc.objective[0]); got != 1 {
					t.Fatalf("shed_total{objective=%q} %v, want 1", tc.objective[0], got)
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

// A reload (SetRouting) puts a new objectives table in force for the requests decided
// from then on: an objective made sheddable is shed, one made critical is routed.
func TestShedFollowsObjectivesSetByRouting(t *testing.T) {
	waiting := func(n int) scoring.Metrics { return scoring.Metrics{Valid: true, Waiting: n} }
	h := newHarness(t, func(o *extproc.Options) { o.ShedWaiting, o.Objectives = 8, objectives{"batch": 0} })
	h.fleet.metrics = map[string]scoring.Metrics{epA: waiting(9), epB: waiting(9), epC: waiting(9)}
	send := func() *fakeenvoy.RequestResult {
		t.Helper()
		x := h.start(mode(filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, false))
		defer x.Cancel()
		res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(fakeenvoy.Header{Key: epp.HeaderObjective, Value: "batch"}),
			Body: [][]byte{chatBody("m")}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := send(); res.Immediate != nil {
		t.Fatalf("priority 0: answered %v", res.Immediate.GetStatus())
	}
	h.srv.SetRouting(extproc.Routing{Policy: h.policy, ShedWaiting: 8, Objectives: objectives{"batch": -5}})
	if res := send(); res.Immediate == nil || res.Immediate.GetStatus().GetCode() != 429 {
		t.Fatalf("sheddable after the reload: got %v, want a 429", res.Immediate)
	}
	h.srv.SetRouting(extproc.Routing{Policy: h.policy, ShedWaiting: 8})
	if res := send(); res.Immediate != nil {
		t.Fatalf("objectives removed: answered %v", res.Immediate.GetStatus())
	}
}
