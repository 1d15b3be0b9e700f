package app_test

import (
	"context"
	"fmt"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// The Inference Extension's series a GIE dashboard reads are on the router's registry:
// the pool's, derived from the fleet's own figures, the build's, and the requests'.
func TestInferenceExtensionSeries(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	reg := prometheus.NewRegistry()
	a := startApp(t, testConfig(t, vllm), app.Options{Registry: reg})
	waitHealth(t, dial(t, a.addrs.Health), app.ReadinessService, healthpb.HealthCheckResponse_SERVING)

	x, err := fakeenvoy.Start(context.Background(), extprocv3.NewExternalProcessorClient(dial(t, a.addrs.ExtProc)), fakeenvoy.FullDuplex())
	if err != nil {
		t.Fatal(err)
	}
	defer x.Cancel()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}]}`, model)
	res, err := x.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"}},
		Body: [][]byte{[]byte(body)}})
	if err != nil || res.Immediate != nil {
		t.Fatalf("request: %v, immediate %v", err, res.Immediate)
	}

	pool := []string{"name", fleet.DefaultPoolName}
	if got := testmetrics.Must(t, reg, "inference_pool_ready_pods", pool...); got != 1 {
		t.Errorf("inference_pool_ready_pods = %v, want 1", got)
	}
	// One endpoint: the pool's averages are its own figures, as kvrouter exports them.
	for gie, own := range map[string]string{
		"inference_pool_average_kv_cache_utilization": "kvrouter_endpoint_kv_cache_usage_ratio",
		"inference_pool_average_queue_size":           "kvrouter_endpoint_waiting_requests",
		"inference_pool_average_running_requests":     "kvrouter_endpoint_running_requests",
	} {
		if g, o := testmetrics.Must(t, reg, gie, pool...), testmetrics.Must(t, reg, own); g != o {
			t.Errorf("%s = %v, %s = %v: want equal", gie, g, own, o)
		}
	}
	if got := testmetrics.Must(t, reg, "inference_extension_info"); got != 1 {
		t.Errorf("inference_extension_info = %v, want 1", got)
	}
	labels := []string{"model_name", model, "target_model_name", model, "priority", "0"}
	if got := testmetrics.Must(t, reg, "inference_objective_request_total", labels...); got != 1 {
		t.Errorf("inference_objective_request_total = %v, want 1", got)
	}
	if got := testmetrics.Must(t, reg, "inference_objective_running_requests", "model_name", model); got != 1 {
		t.Errorf("inference_objective_running_requests = %v, want 1 (no response yet)", got)
	}
}
