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

	istionetv1 "istio.io/client-go/pkg/apis/networking/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/envoy"
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
	helm, err := exec.LookPath(cmp.Or(os.Getenv("HELM"), "helm"))
	if err != nil {
		// CI=true is the one switch that turns every skip for a missing tool into a failure.
		msg := fmt.Sprintf("no helm binary (%v; set HELM or put helm on PATH; `make tools` builds one): renderings not re-checked", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
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
	if kinds["EnvoyFilter"] > 0 {
		checkIstioTLS(t, find[*istionetv1.DestinationRule](t, objs, "kvrouter-extproc"), "kvrouter.llm.svc.cluster.local")
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

func TestChartFilesMatchRepository(t *testing.T) {
	for _, f := range []struct{ chart, repo string }{
		{"files/envoy.yaml", "../envoy/envoy.yaml"},
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
			admitted := false
			for _, peer := range byPort["extproc"] {
				if peer.PodSelector == nil || peer.NamespaceSelector != nil {
					continue
				}
				sel, _ := metav1.LabelSelectorAsSelector(peer.PodSelector)
				admitted = admitted || sel.Matches(labels.Set(dep.Spec.Template.Labels))
			}
			if !admitted {
				t.Errorf("the chart's Envoy pods %v are not admitted to ext_proc by %+v", dep.Spec.Template.Labels, byPort["extproc"])
			}
		}
	}
}
