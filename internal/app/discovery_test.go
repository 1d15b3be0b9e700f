package app_test

import (
	"context"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	infx "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/discovery"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
	"github.com/kvrouter/kvrouter/discovery/kubernetes/clientset"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/rewrite"
)

// staticResolver answers every question with its addresses.
type staticResolver struct {
	mu    sync.Mutex
	addrs []netip.Addr
}

func (r *staticResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addrs, nil
}

func discoveryConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg := loopbackConfig()
	cfg.Limits.DrainTimeout = time.Second
	return &cfg
}

// TestDNSDiscoveryFeedsTheFleet: with no static endpoint the router is not ready until
// DNS discovery finds a pod, and then routes to it.
func TestDNSDiscoveryFeedsTheFleet(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.up.Store(true)
	ap := netip.MustParseAddrPort(vllm.Listener.Addr().String())
	cfg := discoveryConfig(t)
	var dns discovery.DNSConfig
	dns.SetDefaults()
	dns.Name, dns.Port, dns.Models, dns.Interval = "vllm.llm.svc.cluster.local", int(ap.Port()), []string{model}, time.Second
	cfg.Discovery.DNS = &dns
	res := &staticResolver{addrs: []netip.Addr{ap.Addr()}}
	a := startApp(t, cfg, app.Options{Resolver: res, HTTPClient: vllm.Client()})
	waitHealth(t, dial(t, a.addrs.Health), app.ReadinessService, healthpb.HealthCheckResponse_SERVING)
	st := a.Fleet().Status()
	if len(st) != 1 || st[0].Config.Address != ap.String() || st[0].Config.MetricsURL != "http://"+ap.String()+"/metrics" {
		t.Fatalf("fleet %+v", st)
	}
	if got := st[0].Config.KVEvents.Endpoints; len(got) != 1 || got[0] != "tcp://"+netip.AddrPortFrom(ap.Addr(), 5557).String() {
		t.Errorf("events endpoints %v", got)
	}
}

// TestKubernetesDiscoveryReadiness: the router's readiness follows the pods discovery
// finds through the Kubernetes API.
func TestKubernetesDiscoveryReadiness(t *testing.T) {
	cfg := discoveryConfig(t)
	var k discovery.KubernetesConfig
	k.SetDefaults()
	k.Namespace, k.Selector, k.Port, k.Models, k.MetricsPath = "llm", map[string]string{"app": "vllm"}, 8000, []string{model}, "-"
	cfg.Discovery.Kubernetes = &k
	pod := func(ready corev1.ConditionStatus) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.7",
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}},
		}
	}
	cs := fake.NewClientset(pod(corev1.ConditionFalse))
	a := startApp(t, cfg, app.Options{KubeClients: &kdisc.Clients{Core: clientset.New(cs)}})
	cc := dial(t, a.addrs.Health)
	checkHealth(t, cc, app.ReadinessService, healthpb.HealthCheckResponse_NOT_SERVING)
	if _, err := cs.CoreV1().Pods("llm").Update(context.Background(), pod(corev1.ConditionTrue), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, cc, app.ReadinessService, healthpb.HealthCheckResponse_SERVING)
	if st := a.Fleet().Status(); len(st) != 1 || st[0].Config.Address != "10.1.0.7:"+strconv.Itoa(8000) {
		t.Fatalf("fleet %+v", st)
	}
	if _, err := cs.CoreV1().Pods("llm").Update(context.Background(), pod(corev1.ConditionFalse), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, cc, app.ReadinessService, healthpb.HealthCheckResponse_NOT_SERVING)
}

// TestInferenceObjectivesShed: with an InferencePool, the priorities come from the
// pool's InferenceObjectives: a request naming a sheddable one is shed while every pod's
// queue is over limits.shed_queue_depth, one naming a critical one is routed.
func TestInferenceObjectivesShed(t *testing.T) {
	vllm := newFakeVLLM(t)
	vllm.waiting.Store(9)
	vllm.up.Store(true)
	ap := netip.MustParseAddrPort(vllm.Listener.Addr().String())
	cfg := discoveryConfig(t)
	var k discovery.KubernetesConfig
	k.SetDefaults()
	k.Namespace, k.InferencePool, k.Models = "llm", "vllm-pool", []string{model}
	cfg.Discovery.Kubernetes = &k
	cfg.Limits.Scrape.Interval, cfg.Limits.Scrape.Timeout = 50*time.Millisecond, 50*time.Millisecond
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Namespace: "llm", Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ap.Addr().String(),
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	})
	toUnstructured := func(o any) *unstructured.Unstructured {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		return &unstructured.Unstructured{Object: m}
	}
	pool := &infv1.InferencePool{
		TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.k8s.io/v1", Kind: "InferencePool"},
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-pool", Namespace: "llm"},
		Spec: infv1.InferencePoolSpec{
			Selector:    infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "vllm"}},
			TargetPorts: []infv1.Port{{Number: infv1.PortNumber(ap.Port())}},
		},
	}
	objective := func(name string, priority int) *unstructured.Unstructured {
		return toUnstructured(&infx.InferenceObjective{
			TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.x-k8s.io/v1alpha2", Kind: "InferenceObjective"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "llm"},
			Spec:       infx.InferenceObjectiveSpec{Priority: &priority, PoolRef: infx.PoolObjectReference{Name: "vllm-pool"}},
		})
	}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kdisc.InferencePools: "InferencePoolList", kdisc.InferenceObjectives: "InferenceObjectiveList",
		kdisc.InferenceModelRewrites: "InferenceModelRewriteList"},
		toUnstructured(pool), objective("batch", -1), objective("chat", 10),
		// The pool's rewrites are watched beside: one applies, one is refused.
		toUnstructured(&infx.InferenceModelRewrite{
			TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.x-k8s.io/v1alpha2", Kind: "InferenceModelRewrite"},
			ObjectMeta: metav1.ObjectMeta{Name: "alias", Namespace: "llm"},
			Spec: infx.InferenceModelRewriteSpec{PoolRef: &infx.PoolObjectReference{Name: "vllm-pool"},
				Rules: []infx.InferenceModelRewriteRule{{Matches: []infx.Match{{Model: &infx.ModelMatch{Value: "small"}}},
					Targets: []infx.TargetModel{{ModelRewrite: model}}}}},
		}),
		toUnstructured(&infx.InferenceModelRewrite{
			TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.x-k8s.io/v1alpha2", Kind: "InferenceModelRewrite"},
			ObjectMeta: metav1.ObjectMeta{Name: "no-target", Namespace: "llm"},
			Spec: infx.InferenceModelRewriteSpec{PoolRef: &infx.PoolObjectReference{Name: "vllm-pool"},
				Rules: []infx.InferenceModelRewriteRule{{}}},
		}))
	reg := prometheus.NewRegistry()
	a := startApp(t, cfg, app.Options{Registry: reg, KubeClients: &kdisc.Clients{Core: clientset.New(cs), Dynamic: dyn}, HTTPClient: vllm.Client()})
	client := extprocv3.NewExternalProcessorClient(dial(t, a.addrs.ExtProc))
	status := func(objective string) int32 { return objectiveStatus(t, client, objective) }
	testwait.For(t, "the sheddable objective shed", func() bool { return status("batch") == 429 })
	if code := status("chat"); code != 0 {
		t.Fatalf("critical objective answered %d, want routed", code)
	}
	if got := testmetrics.Must(t, reg, "kvrouter_requests_shed_total", "objective", "batch"); got != 1 {
		t.Fatalf("kvrouter_requests_shed_total{objective=batch} %v, want 1", got)
	}
	if got := getObjectives(t, a); got.Source != "inference_pool" || got.ShedQueueDepth != 5 ||
		!maps.Equal(got.Objectives, map[string]int{"batch": -1, "chat": 10}) {
		t.Fatalf("/debug/objectives %+v, want the pool's batch -1 and chat 10, shed past 5", got)
	}
	type debugRewrites struct {
		Source   string
		Rewrites []rewrite.Rewrite
		Refused  map[string]string
	}
	var rw debugRewrites
	testwait.For(t, "the pool's rewrites", func() bool {
		rw = getJSON[debugRewrites](t, "http://"+a.addrs.Debug+"/debug/rewrites")
		return len(rw.Rewrites) > 0
	})
	if rw.Source != "inference_pool" || len(rw.Rewrites) != 1 || rw.Rewrites[0].Name != "alias" ||
		!strings.Contains(rw.Refused["no-target"], "at least one target is required") {
		t.Fatalf("/debug/rewrites %+v, want the pool's alias, no-target refused", rw)
	}
}

// TestReloadObjectivesInPoolMode: while an InferencePool's InferenceObjectives give the
// priorities, a file that leaves inference_pool mode and lists objectives needs a
// restart for both; the watched priorities stay in force.
func TestReloadObjectivesInPoolMode(t *testing.T) {
	head := "listen: {extproc: 127.0.0.1:0, health: 127.0.0.1:0, metrics: 127.0.0.1:0, debug: \"\", tls: {mode: disabled}}\n" +
		"limits: {drain_delay: 0s, drain_timeout: 1s}\n"
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	writeFile(t, path, head+"discovery: {kubernetes: {namespace: llm, inference_pool: vllm-pool, models: ["+model+"], metrics_path: \"-\"}}\n")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kdisc.InferencePools: "InferencePoolList", kdisc.InferenceObjectives: "InferenceObjectiveList",
		kdisc.InferenceModelRewrites: "InferenceModelRewriteList"})
	a := startApp(t, cfg, app.Options{ConfigPath: path, ConfigCheckInterval: -1,
		KubeClients: &kdisc.Clients{Core: clientset.New(fake.NewClientset()), Dynamic: dyn}})
	writeFile(t, path, head+"discovery: {kubernetes: {namespace: llm, selector: {app: vllm}, port: 8000, models: ["+model+"], metrics_path: \"-\"}}\n"+
		"objectives: {batch: -1}\n")
	rep, err := a.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(rep.Applied, "objectives") || !slices.Contains(rep.Restart, "objectives") {
		t.Fatalf("applied %v restart %v: objectives must wait for the restart", rep.Applied, rep.Restart)
	}
}
