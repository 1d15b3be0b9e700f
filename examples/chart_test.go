package examples_test

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	istionetv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/envoy"
	"github.com/kvrouter/kvrouter/tlscert"
)

// The chart is rendered by the real helm (`make chart-golden`) into
// testdata/chart/<values>.yaml, one file per values file in charts/kvrouter/ci/. These
// tests parse the renderings strictly; TestChartGoldenFresh re-renders them when a helm
// binary is available and fails when they are stale.

const chartDir = "../charts/kvrouter"

func chartValues(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in %s/ci", chartDir)
	}
	return files
}

func goldenFor(values string) string {
	return filepath.Join("testdata", "chart", strings.TrimSuffix(filepath.Base(values), "-values.yaml")+".yaml")
}

// helmTemplate is the command that renders a golden file.
func helmTemplate(helm, values string) *exec.Cmd {
	return exec.Command(helm, "template", "kvrouter", chartDir, "--namespace", "llm", "--kube-version", "1.33.0", "-f", values)
}

func TestChartGoldenFresh(t *testing.T) {
	helm := helmBinary(t)
	for _, v := range chartValues(t) {
		t.Run(filepath.Base(v), func(t *testing.T) {
			out, err := helmTemplate(helm, v).Output()
			if err != nil {
				t.Fatalf("helm template: %v", err)
			}
			want, err := os.ReadFile(goldenFor(v))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, want) {
				t.Errorf("%s is stale: run `make chart-golden` (%s)", goldenFor(v), firstDiff(string(out), string(want)))
			}
		})
	}
}

// helmBinary returns the helm to render with, or skips (fails under CI=true).
func helmBinary(t *testing.T) string {
	t.Helper()
	helm, err := exec.LookPath(cmp.Or(os.Getenv("HELM"), "helm"))
	if err != nil {
		// CI=true is the one switch that turns every skip for a missing tool into a failure.
		msg := fmt.Sprintf("no helm binary (%v; set HELM or put helm on PATH; `make tools` builds one): renderings not re-checked", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return helm
}

// TestChartRefusesUnsafeUpstreams: values that would make the gateway drop requests
// (a list of endpoints to an ORIGINAL_DST cluster, an override_host cluster that knows
// no pod, gateways that need different max_fallbacks) fail to render, with the reason.
func TestChartRefusesUnsafeUpstreams(t *testing.T) {
	helm := helmBinary(t)
	for _, tc := range []struct {
		name string
		set  []string
		want string
	}{
		{"override-host without the pods' labels", []string{"envoy.enabled=true"}, "set poolSelector"},
		{"fallbacks to ORIGINAL_DST", []string{"envoy.enabled=true", "vllm.enabled=true", "envoy.upstream=original-dst", "config.limits.max_fallbacks=2"}, "ORIGINAL_DST cluster takes one ip:port"},
		{"gateways disagree", []string{"envoy.enabled=true", "vllm.enabled=true", "istio.enabled=true"}, "envoy.upstream and istio.upstream differ"},
		{"unknown upstream", []string{"envoy.enabled=true", "vllm.enabled=true", "envoy.upstream=round-robin"}, `upstream "round-robin"`},
		{"unknown InferencePool provider", []string{"inferencePool.enabled=true", "inferencePool.provider=kgateway"}, `inferencePool.provider "kgateway": want none, istio or gke`},
		{"GKE without its proxies admitted", []string{"inferencePool.enabled=true", "inferencePool.provider=gke"}, "set networkPolicy.extprocFrom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", "kvrouter", chartDir, "--namespace", "llm", "--kube-version", "1.33.0"}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := exec.Command(helm, args...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("helm template (err %v):\n%s\nwant a failure naming %q", err, out, tc.want)
			}
		})
	}
}

func TestChartRenderings(t *testing.T) {
	for _, v := range chartValues(t) {
		name := strings.TrimSuffix(filepath.Base(v), "-values.yaml")
		t.Run(name, func(t *testing.T) {
			objs := loadDir(t, goldenFor(v))
			checkChart(t, name, objs)
		})
	}
}

func checkChart(t *testing.T, name string, objs []object) {
	t.Helper()
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.gvk.Kind]++
	}
	d := find[*appsv1.Deployment](t, objs, "kvrouter")
	c := d.Spec.Template.Spec.Containers[0]
	cm := find[*corev1.ConfigMap](t, objs, "kvrouter-config")
	cfg, err := config.Parse([]byte(cm.Data["kvrouter.yaml"]), name+": kvrouter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	central := cfg.Discovery.KVEvents.Mode == discovery.ModeCentral
	replicas := int32(2)
	if central {
		// Each vLLM publisher connects to one kvrouter: one replica, never two at once.
		replicas = 1
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("central mode: strategy %q, want Recreate", d.Spec.Strategy.Type)
		}
		svc := find[*corev1.Service](t, objs, "kvrouter-kv-events")
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 5557 || svc.Spec.Ports[0].TargetPort.StrVal != "kv-events-0" {
			t.Errorf("central mode: kv-events Service ports %+v", svc.Spec.Ports)
		}
	}
	if *d.Spec.Replicas != replicas || c.ReadinessProbe.GRPC == nil || c.ReadinessProbe.GRPC.Port != 9003 ||
		d.Spec.Template.Annotations["prometheus.io/port"] != "9090" {
		t.Errorf("kvrouter Deployment: replicas %d, probe %+v, annotations %v", *d.Spec.Replicas, c.ReadinessProbe, d.Spec.Template.Annotations)
	}
	// The probe port opens after the tokenizers load: a startup probe keeps liveness from
	// restarting a pod that is still loading its models.
	if p := c.StartupProbe; p == nil || p.GRPC == nil || p.GRPC.Port != 9003 || p.PeriodSeconds*p.FailureThreshold < 30 {
		t.Errorf("kvrouter Deployment: startup probe %+v, want gRPC on 9003 allowing at least 30 s", p)
	}
	checkNetworkPolicy(t, objs, central)
	checkPickerService(t, find[*corev1.Service](t, objs, "kvrouter"), cfg.Listen.TLS.Mode != tlscert.ModeDisabled)
	if kinds["ServiceMonitor"] > 0 {
		checkServiceMonitor(t, objs, find[*serviceMonitor](t, objs, "kvrouter"), d)
	}
	if f := cfg.Listen.TLS.CertFile; f != "" {
		// The certificate comes from a Secret mounted where the configuration names it.
		mounted := false
		for _, m := range c.VolumeMounts {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && filepath.Dir(f) == m.MountPath {
					mounted = true
				}
			}
		}
		if !mounted {
			t.Errorf("listen.tls.cert_file %s is not in a mounted Secret (%+v)", f, c.VolumeMounts)
		}
	}
	// Istio reaches kvrouter's TLS port only through a DestinationRule saying so: with the
	// EnvoyFilter, and with an InferencePool whose Gateway is Istio's (inferencePool.provider).
	if kinds["EnvoyFilter"] > 0 || (kinds["InferencePool"] > 0 && name == "inference-pool-istio") {
		checkIstioTLS(t, find[*istionetv1.DestinationRule](t, objs, "kvrouter-extproc"), "kvrouter.llm.svc.cluster.local")
	} else if kinds["DestinationRule"] > 0 {
		t.Errorf("a DestinationRule without Istio in use: the cluster may not have its CRD")
	}
	if kinds["EnvoyFilter"] > 0 {
		c, r := checkEnvoyFilter(t, find[*istionetv1alpha3.EnvoyFilter](t, objs, "kvrouter"), "vllm")
		checkUpstream(t, objs, cfg, chartPool, c, []*routev3.Route{r})
	}
	role := find[*rbacv1.Role](t, objs, "kvrouter-discovery")
	for _, r := range role.Rules {
		if !reflect.DeepEqual(r.Verbs, []string{"get", "list", "watch"}) {
			t.Errorf("role rule %+v is not read-only", r)
		}
	}
	k := cfg.Discovery.Kubernetes
	if k == nil || k.Namespace != "llm" {
		t.Fatalf("discovery %+v does not watch the release namespace", k)
	}
	for _, o := range objs {
		// Streamed completions run for minutes: a route without its own request timeout
		// gets the implementation's default (Envoy's 15s, GKE's 30s).
		if route, ok := o.obj.(*gwv1.HTTPRoute); ok {
			for i, r := range route.Spec.Rules {
				if r.Timeouts == nil || r.Timeouts.Request == nil {
					t.Errorf("HTTPRoute %s rule %d has no timeouts.request", route.Name, i)
				} else if d, err := time.ParseDuration(string(*r.Timeouts.Request)); err != nil || d < time.Minute {
					t.Errorf("HTTPRoute %s rule %d: timeouts.request %s (%v), want at least a minute", route.Name, i, *r.Timeouts.Request, err)
				}
			}
		}
	}
	if kinds["HealthCheckPolicy"] > 0 || kinds["GCPBackendPolicy"] > 0 || name == "inference-pool-gke" {
		checkGKEPolicies(t, objs, find[*infv1.InferencePool](t, objs, k.InferencePool))
	}
	if kinds["InferencePool"] > 0 {
		pool := find[*infv1.InferencePool](t, objs, k.InferencePool)
		if string(pool.Spec.EndpointPickerRef.Name) != "kvrouter" || pool.Spec.EndpointPickerRef.Port.Number != 9002 {
			t.Errorf("pool's picker %+v is not kvrouter:9002", pool.Spec.EndpointPickerRef)
		}
	} else if k.Service == "" {
		t.Errorf("discovery has no service: %+v", k)
	}
	if kinds["ConfigMap"] > 1 {
		for _, o := range objs {
			if cm, ok := o.obj.(*corev1.ConfigMap); ok && cm.Name == "kvrouter-envoy" {
				b, err := envoy.Parse([]byte(cm.Data["envoy.yaml"]))
				if err != nil {
					t.Fatal(err)
				}
				if err := envoy.Check(b); err != nil {
					t.Error(err)
				}
				if !strings.Contains(cm.Data["envoy.yaml"], "{address: kvrouter-headless.llm.svc.cluster.local, port_value: 9002}") {
					t.Error("Envoy does not reach kvrouter through the headless Service")
				}
				c, routes := bootstrapUpstream(t, b)
				checkUpstream(t, objs, cfg, chartPool, c, routes)
			}
		}
	}
	for _, o := range objs {
		if dep, ok := o.obj.(*appsv1.Deployment); ok && dep.Name == "vllm" {
			vc := dep.Spec.Template.Spec.Containers[0]
			ev := kvEventsConfig(t, vc.Args)
			endpoint, topic := "tcp://*:5557", ""
			if central {
				// Connect (no "*"), naming the pod; the replay socket stays on the pod.
				endpoint, topic = "tcp://kvrouter-kv-events.llm.svc:5557", "kv@$(POD_IP):8000@Qwen/Qwen3-0.6B"
				if len(vc.Env) != 1 || vc.Env[0].Name != "POD_IP" || vc.Env[0].ValueFrom.FieldRef.FieldPath != "status.podIP" {
					t.Errorf("vllm env %+v: want POD_IP from status.podIP", vc.Env)
				}
			}
			if ev["endpoint"] != endpoint || ev["topic"] != topic || ev["replay_endpoint"] != "tcp://*:5558" || ev["publisher"] != "zmq" {
				t.Errorf("vllm kv events %v", ev)
			}
			if dep.Spec.Template.Annotations[discovery.AnnotationModels] == "" {
				t.Errorf("vllm pods lack %s", discovery.AnnotationModels)
			}
		}
	}
}

// bootstrapUpstream returns the cluster the bootstrap's ext_proc listener routes picked
// requests to (vllm_pool) and the routes to it.
func bootstrapUpstream(t *testing.T, b *bootstrapv3.Bootstrap) (*clusterv3.Cluster, []*routev3.Route) {
	t.Helper()
	var c *clusterv3.Cluster
	for _, cl := range b.GetStaticResources().GetClusters() {
		if cl.GetName() == "vllm_pool" {
			c = cl
		}
	}
	if c == nil {
		t.Fatal("Envoy has no vllm_pool cluster")
	}
	var routes []*routev3.Route
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.GetRoutes() {
						if r.GetRoute().GetCluster() == c.GetName() {
							routes = append(routes, r)
						}
					}
				}
			}
		}
	}
	if len(routes) == 0 {
		t.Fatal("no route to vllm_pool")
	}
	return c, routes
}

// chartPool is the chart's headless Service over the vLLM pods (`<release>-pool`).
const chartPool = "kvrouter-pool"

// checkUpstream: the gateway's cluster for kvrouter's picks and kvrouter's configuration
// agree. With override_host: the cluster resolves the headless Service named pool (in
// namespace llm) on the port kvrouter names the pods by, the Service is headless on that
// port and selects every vLLM Deployment's pods, which listen on it, every route to the
// cluster retries as many times as kvrouter lists fallbacks (2) and keeps bodies up to
// kvrouter's max_body_bytes for it. With ORIGINAL_DST (one ip:port): kvrouter lists no
// fallbacks and objs hold no pool Service. The chart's renderings and the
// examples/kubernetes manifests both go through it.
func checkUpstream(t *testing.T, objs []object, cfg *config.Config, pool string, c *clusterv3.Cluster, routes []*routev3.Route) {
	t.Helper()
	overrideHost := false
	for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
		overrideHost = overrideHost || p.GetTypedExtensionConfig().GetName() == "envoy.load_balancing_policies.override_host"
	}
	if !overrideHost {
		if c.GetType() != clusterv3.Cluster_ORIGINAL_DST {
			t.Fatalf("cluster %s is neither override_host nor ORIGINAL_DST", c.GetName())
		}
		if cfg.Limits.MaxFallbacks != 0 {
			t.Errorf("limits.max_fallbacks %d behind an ORIGINAL_DST cluster, which takes one ip:port", cfg.Limits.MaxFallbacks)
		}
		for _, o := range objs {
			if svc, ok := o.obj.(*corev1.Service); ok && svc.Name == pool {
				t.Error("the pool's headless Service is rendered for an ORIGINAL_DST cluster")
			}
		}
		return
	}
	if err := envoy.CheckUpstream(c, routes...); err != nil {
		t.Error(err)
	}
	if cfg.Limits.MaxFallbacks != 2 {
		t.Errorf("limits.max_fallbacks %d behind an override_host cluster, want 2", cfg.Limits.MaxFallbacks)
	}
	// One retry per fallback listed; at least one, which override_host sends where its
	// fallback policy picks once the list is spent.
	retries := max(cfg.Limits.MaxFallbacks, 1)
	for _, r := range routes {
		rp := r.GetRoute().GetRetryPolicy()
		if got := int(rp.GetNumRetries().GetValue()); got != retries || !strings.Contains(rp.GetRetryOn(), "reset") {
			t.Errorf("route %q: retry_on %q, num_retries %d; want connect-failure,reset and %d retries (max_fallbacks %d)", r.GetName(), rp.GetRetryOn(), got, retries, cfg.Limits.MaxFallbacks)
		}
		//lint:ignore SA1019 the shipped configs set the deprecated field, which Envoy still honours
		if got := int(r.GetPerRequestBufferLimitBytes().GetValue()); got != cfg.Limits.MaxBodyBytes {
			t.Errorf("route %q keeps %d bytes of body for retries, kvrouter reads %d", r.GetName(), got, cfg.Limits.MaxBodyBytes)
		}
	}
	port := cfg.Discovery.Kubernetes.Port
	if cfg.Discovery.Kubernetes.InferencePool != "" {
		port = int(find[*infv1.InferencePool](t, objs, cfg.Discovery.Kubernetes.InferencePool).Spec.TargetPorts[0].Number)
	}
	eps := c.GetLoadAssignment().GetEndpoints()
	if c.GetType() != clusterv3.Cluster_STRICT_DNS || len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
		t.Fatalf("cluster %s: type %v with %d localities, want STRICT_DNS over one address", c.GetName(), c.GetType(), len(eps))
	}
	sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if host := pool + ".llm.svc.cluster.local"; sa.GetAddress() != host || int(sa.GetPortValue()) != port {
		t.Errorf("cluster %s resolves %s:%d, want %s:%d (the port kvrouter names pods by)", c.GetName(), sa.GetAddress(), sa.GetPortValue(), host, port)
	}
	svc := find[*corev1.Service](t, objs, pool)
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || int(svc.Spec.Ports[0].Port) != port || svc.Spec.Ports[0].TargetPort.IntValue() != port {
		t.Errorf("%s: clusterIP %q, ports %+v; want headless on %d", pool, svc.Spec.ClusterIP, svc.Spec.Ports, port)
	}
	// Every vLLM Deployment (examples/kubernetes has the GPU one and the simulator's):
	// the Service selects its pods and they listen on the port.
	var vllms int
	for _, o := range objs {
		d, ok := o.obj.(*appsv1.Deployment)
		if !ok || d.Name != "vllm" {
			continue
		}
		vllms++
		pt := d.Spec.Template
		if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pt.Labels)) {
			t.Errorf("%s selects %v, not the vLLM pods of %s (%v)", pool, svc.Spec.Selector, o.file, pt.Labels)
		}
		listens := false
		for _, ctr := range pt.Spec.Containers {
			for _, p := range ctr.Ports {
				listens = listens || int(p.ContainerPort) == port
			}
		}
		if !listens {
			t.Errorf("the vLLM pods of %s declare no container port %d, where %s sends", o.file, port, c.GetName())
		}
	}
	if vllms == 0 {
		t.Error("no vllm Deployment")
	}
}

func TestChartFilesMatchRepository(t *testing.T) {
	for _, f := range []struct{ chart, repo string }{
		{"files/envoy.yaml", "../envoy/envoy.yaml"},
		{"files/envoy-fallbacks.yaml", "../envoy/envoy-fallbacks.yaml"},
		{"files/grafana-dashboard.json", "grafana/kvrouter-dashboard.json"},
	} {
		t.Run(f.chart, func(t *testing.T) {
			a, err := os.ReadFile(filepath.Join(chartDir, f.chart))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(f.repo)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Errorf("%s differs from %s: copy it over", f.chart, f.repo)
			}
		})
	}
}

// checkNetworkPolicy: kvrouter's pods admit ext_proc only from named peers (the chart's
// Envoy when it ships one), /metrics only from named peers, central mode's KV-event port
// only from named peers, and nothing else.
func checkNetworkPolicy(t *testing.T, objs []object, central bool) {
	t.Helper()
	np := find[*networkingv1.NetworkPolicy](t, objs, "kvrouter")
	if !reflect.DeepEqual(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy types %v, want Ingress", np.Spec.PolicyTypes)
	}
	d := find[*appsv1.Deployment](t, objs, "kvrouter")
	if sel, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the policy's pod selector %v does not select kvrouter's pods", np.Spec.PodSelector)
	}
	byPort := map[string][]networkingv1.NetworkPolicyPeer{}
	for _, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			t.Errorf("ingress rule %+v admits every source", r)
		}
		for _, p := range r.Ports {
			byPort[p.Port.String()] = r.From
		}
	}
	want := []string{"extproc", "metrics"}
	if central {
		want = append(want, "5557")
	}
	got := slices.Sorted(maps.Keys(byPort))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ports admitted %v, want %v", got, want)
	}
	for _, o := range objs {
		if dep, ok := o.obj.(*appsv1.Deployment); ok && dep.Name == "kvrouter-envoy" {
			if !admits(byPort["extproc"], np.Namespace, np.Namespace, dep.Spec.Template.Labels) {
				t.Errorf("the chart's Envoy pods %v are not admitted to ext_proc by %+v", dep.Spec.Template.Labels, byPort["extproc"])
			}
		}
		// The InferencePool's Gateway: its proxies wherever the implementations put them,
		// unless the peers were named (an address block: GKE's proxies are not pods).
		named := slices.ContainsFunc(byPort["extproc"], func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil })
		if route, ok := o.obj.(*gwv1.HTTPRoute); ok && !named {
			for _, parent := range route.Spec.ParentRefs {
				gw := string(parent.Name)
				for _, proxy := range []struct {
					impl, ns string
					labels   map[string]string
				}{
					{"Istio", np.Namespace, map[string]string{"gateway.networking.k8s.io/gateway-name": gw, "istio.io/gateway-name": gw}},
					{"Envoy Gateway", "envoy-gateway-system", map[string]string{
						"gateway.envoyproxy.io/owning-gateway-name": gw, "gateway.envoyproxy.io/owning-gateway-namespace": np.Namespace}},
				} {
					if !admits(byPort["extproc"], np.Namespace, proxy.ns, proxy.labels) {
						t.Errorf("%s's proxies of Gateway %s (namespace %s, labels %v) are not admitted to ext_proc by %+v",
							proxy.impl, gw, proxy.ns, proxy.labels, byPort["extproc"])
					}
				}
				// Another Gateway's Envoy Gateway proxies are not.
				other := map[string]string{"gateway.envoyproxy.io/owning-gateway-name": gw, "gateway.envoyproxy.io/owning-gateway-namespace": "elsewhere"}
				if admits(byPort["extproc"], np.Namespace, "envoy-gateway-system", other) {
					t.Errorf("Envoy Gateway proxies of a Gateway %s in another namespace are admitted to ext_proc", gw)
				}
			}
		}
	}
}

// checkServiceMonitor: the ServiceMonitor selects, in the release namespace, Services
// whose named port reaches kvrouter's metrics container port, and exactly one of them, so
// that each pod is scraped once, on /metrics.
func checkServiceMonitor(t *testing.T, objs []object, sm *serviceMonitor, d *appsv1.Deployment) {
	t.Helper()
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{"llm"}) || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Fatalf("ServiceMonitor spec %+v: want namespace llm and one /metrics endpoint", sm.Spec)
	}
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	metricsPort := ""
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		if p.ContainerPort == 9090 {
			metricsPort = p.Name
		}
	}
	scraped := 0
	for _, o := range objs {
		svc, ok := o.obj.(*corev1.Service)
		if !ok || !sel.Matches(labels.Set(svc.Labels)) {
			continue
		}
		for _, p := range svc.Spec.Ports {
			if p.Name == sm.Spec.Endpoints[0].Port {
				scraped++
				if p.TargetPort.StrVal != metricsPort || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
					t.Errorf("Service %s port %s reaches %v on pods %v, not kvrouter's metrics port %q", svc.Name, p.Name, p.TargetPort, svc.Spec.Selector, metricsPort)
				}
			}
		}
	}
	if scraped != 1 {
		t.Errorf("the ServiceMonitor scrapes kvrouter through %d Services, want 1", scraped)
	}
}

// checkGKEPolicies: behind a GKE Gateway the pool's pods are health-checked where vLLM
// answers (/health on the pool's port) and the load balancer lets a request run for
// minutes; ext_proc is admitted from an address block (the proxy-only subnet), since
// GKE's proxies are not pods.
func checkGKEPolicies(t *testing.T, objs []object, pool *infv1.InferencePool) {
	t.Helper()
	want := gkeTargetRef{Group: infv1.GroupName, Kind: "InferencePool", Name: pool.Name}
	hc := find[*gkeHealthCheckPolicy](t, objs, pool.Name)
	c := hc.Spec.Default.Config
	if hc.Spec.TargetRef != want || c.Type != "HTTP" || c.HTTPHealthCheck.RequestPath != "/health" || c.HTTPHealthCheck.Port != int32(pool.Spec.TargetPorts[0].Number) {
		t.Errorf("HealthCheckPolicy %+v: want an HTTP check of /health on port %d of %+v", hc.Spec, pool.Spec.TargetPorts[0].Number, want)
	}
	bp := find[*gkeBackendPolicy](t, objs, pool.Name)
	if bp.Spec.TargetRef != want || bp.Spec.Default.TimeoutSec < 60 {
		t.Errorf("GCPBackendPolicy %+v: want a timeout of a minute or more on %+v", bp.Spec, want)
	}
	np := find[*networkingv1.NetworkPolicy](t, objs, "kvrouter")
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port.String() == "extproc" && !slices.ContainsFunc(r.From, func(peer networkingv1.NetworkPolicyPeer) bool { return peer.IPBlock != nil }) {
				t.Errorf("ext_proc admits %+v, no address block for GKE's proxies", r.From)
			}
		}
	}
}

// checkPickerService: the Service an InferencePool's endpointPickerRef names declares
// the ext_proc port's protocol as the Inference Extension's picker Service does (http2,
// over TLS), or kubernetes.io/h2c when kvrouter serves it in cleartext.
func checkPickerService(t *testing.T, svc *corev1.Service, tls bool) {
	t.Helper()
	want := "kubernetes.io/h2c"
	if tls {
		want = "http2"
	}
	for _, p := range svc.Spec.Ports {
		if p.Port == 9002 {
			if p.AppProtocol == nil || *p.AppProtocol != want {
				t.Errorf("Service %s port 9002 appProtocol %v, want %s (TLS %v)", svc.Name, p.AppProtocol, want, tls)
			}
			return
		}
	}
	t.Errorf("Service %s has no port 9002", svc.Name)
}

// admits tells whether a NetworkPolicy of namespace policyNS with ingress peers lets in a
// pod of namespace ns with podLabels (namespaces labelled as Kubernetes does,
// kubernetes.io/metadata.name).
func admits(peers []networkingv1.NetworkPolicyPeer, policyNS, ns string, podLabels map[string]string) bool {
	for _, peer := range peers {
		if peer.IPBlock != nil {
			continue
		}
		if peer.NamespaceSelector == nil {
			if ns != policyNS {
				continue
			}
		} else if sel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil ||
			!sel.Matches(labels.Set{"kubernetes.io/metadata.name": ns}) {
			continue
		}
		if peer.PodSelector == nil {
			return true
		}
		if sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector); err == nil && sel.Matches(labels.Set(podLabels)) {
			return true
		}
	}
	return false
}
