package app_test

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/discovery"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
	"github.com/kvrouter/kvrouter/discovery/kubernetes/clientset"
	"github.com/kvrouter/kvrouter/internal/app"
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
