package extproc_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// The Inference Extension picker's per-request series: counted where kvrouter's own are,
// labelled by the request's model only when the fleet serves it.
func TestInferenceObjectiveSeries(t *testing.T) {
	usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":256}}}\n\ndata: [DONE]\n\n"
	saturated := map[string]scoring.Metrics{epA: {Valid: true, Waiting: 9}, epB: {Valid: true, Waiting: 9}, epC: {Valid: true, Waiting: 9}}
	tests := []struct {
		name      string
		model     string // the body's model
		objective string
		noFleet   bool                       // no endpoint is eligible
		metrics   map[string]scoring.Metrics // the fleet's figures (shedding)
		status    int                        // the upstream's status; 0: not answered
		wantModel string                     // the model_name label
		wantPrio  string                     // the priority label; "": not routed
		wantErr   string                     // the error_code counted; "": none
		wantDone  bool                       // a duration and the token counts are observed
	}{
		{name: "routed and answered", model: "m", objective: "chat", status: 200,
			wantModel: "m", wantPrio: "10", wantDone: true},
		{name: "no objective is priority 0", model: "only-b", status: 200,
			wantModel: "only-b", wantPrio: "0", wantDone: true},
		{name: "a model the fleet does not serve is not a label", model: "made-up-by-a-client", status: 200,
			wantModel: "", wantPrio: "0", wantDone: true},
		{name: "upstream error", model: "m", status: 500,
			wantModel: "m", wantPrio: "0", wantErr: "ModelServerError", wantDone: true},
		{name: "no eligible endpoint", model: "m", noFleet: true,
			wantModel: "m", wantErr: "ServiceUnavailable"},
		{name: "shed", model: "m", objective: "batch", metrics: saturated,
			wantModel: "m", wantErr: "ResourceExhausted"},
		{name: "in flight", model: "m", wantModel: "m", wantPrio: "0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(o *extproc.Options) { o.ShedWaiting, o.Objectives = 8, testObjectives })
			h.fleet.metrics = tc.metrics
			if tc.noFleet {
				h.fleet.order = nil
			}
			x := h.start(fakeenvoy.FullDuplex())
			defer x.Cancel()
			var hs fakeenvoy.Headers
			if tc.objective != "" {
				hs = append(hs, fakeenvoy.Header{Key: epp.HeaderObjective, Value: tc.objective})
			}
			res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(hs...), Body: [][]byte{chatBody(tc.model)}})
			if err != nil {
				t.Fatal(err)
			}
			if (res.Immediate == nil) != (tc.wantPrio != "") {
				t.Fatalf("immediate response %v, want routed %v", res.Immediate, tc.wantPrio != "")
			}
			model := []string{"model_name", tc.wantModel, "target_model_name", tc.wantModel}
			running := testmetrics.Value(t, h.reg, "inference_objective_running_requests", "model_name", tc.wantModel)
			if tc.status != 0 {
				if _, err := x.Response(tc.status, nil, [][]byte{[]byte(usage)}, nil, nil); err != nil {
					t.Fatal(err)
				}
				if err := x.Close(); err != nil {
					t.Fatal(err)
				}
				h.waitIdle()
				if running != 1 {
					t.Errorf("running_requests before the response = %v, want 1", running)
				}
				running = testmetrics.Value(t, h.reg, "inference_objective_running_requests", "model_name", tc.wantModel)
			} else if tc.wantPrio != "" && running != 1 {
				t.Errorf("running_requests in flight = %v, want 1", running)
			}
			if tc.status != 0 && running != 0 {
				t.Errorf("running_requests after the response = %v, want 0", running)
			}

			wantReq := 0.0
			if tc.wantPrio != "" {
				wantReq = 1
			}
			if got := testmetrics.Value(t, h.reg, "inference_objective_request_total", append(model, "priority", tc.wantPrio)...); got != wantReq {
				t.Errorf("request_total = %v, want %v", got, wantReq)
			}
			if got := h.counter("inference_objective_request_total"); got != wantReq {
				t.Errorf("request_total over all labels = %v, want %v", got, wantReq)
			}
			wantErrs := 0.0
			if tc.wantErr != "" {
				wantErrs = 1
				if got := testmetrics.Value(t, h.reg, "inference_objective_request_error_total", append(model, "error_code", tc.wantErr)...); got != 1 {
					t.Errorf("request_error_total{error_code=%q} = %v, want 1", tc.wantErr, got)
				}
			}
			if got := h.counter("inference_objective_request_error_total"); got != wantErrs {
				t.Errorf("request_error_total over all labels = %v, want %v", got, wantErrs)
			}

			type obs struct {
				metric string
				sum    float64
			}
			for _, o := range []obs{{"inference_objective_request_duration_seconds", -1},
				{"inference_objective_input_tokens", 300}, {"inference_objective_output_tokens", 7},
				{"inference_objective_prompt_cached_tokens", 256}, {"inference_objective_response_sizes", float64(len(usage))}} {
				n, sum := testmetrics.Histogram(t, h.reg, o.metric, model...)
				switch {
				case !tc.wantDone && n != 0:
					t.Errorf("%s observed %d times for a request not answered", o.metric, n)
				case tc.wantDone && n != 1:
					t.Errorf("%s observed %d times, want 1", o.metric, n)
				case tc.wantDone && o.sum >= 0 && sum != o.sum:
					t.Errorf("%s sum = %v, want %v", o.metric, sum, o.sum)
				case tc.wantDone && o.sum < 0 && sum <= 0:
					t.Errorf("%s sum = %v, want > 0", o.metric, sum)
				}
			}
			n, sum := testmetrics.Histogram(t, h.reg, "inference_objective_request_sizes", model...)
			if wantN := uint64(wantReq); n != wantN || (n == 1 && sum != float64(len(chatBody(tc.model)))) {
				t.Errorf("request_sizes: %d observations of sum %v, want %d of the body's %d bytes", n, sum, wantN, len(chatBody(tc.model)))
			}
			for _, name := range []string{"inference_objective_request_total", "inference_objective_running_requests",
				"inference_objective_input_tokens"} {
				if testmetrics.Exists(t, h.reg, name, "model_name", "made-up-by-a-client") {
					t.Errorf("%s has a client's model name as a label", name)
				}
			}
		})
	}
}
