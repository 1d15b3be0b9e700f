package examples_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istionetv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	infx "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvrouter/kvrouter/config"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
	"github.com/kvrouter/kvrouter/envoy"
)

// object is one parsed manifest document.
type object struct {
	file string
	gvk  schema.GroupVersionKind
	name string
	obj  any
}

func (o object) String() string { return fmt.Sprintf("%s: %s %s", o.file, o.gvk.Kind, o.name) }

// newTyped returns an empty Go object for a kind, or nil when the kind is unknown.
func newTyped(gvk schema.GroupVersionKind) any {
	switch gvk {
	case schema.GroupVersion(infv1.GroupVersion).WithKind("InferencePool"):
		return &infv1.InferencePool{}
	case kdisc.InferenceObjectives.GroupVersion().WithKind("InferenceObjective"):
		return &infx.InferenceObjective{}
	case kdisc.InferenceModelRewrites.GroupVersion().WithKind("InferenceModelRewrite"):
		return &infx.InferenceModelRewrite{}
	case schema.GroupVersion(gwv1.GroupVersion).WithKind("Gateway"):
		return &gwv1.Gateway{}
	case schema.GroupVersion(gwv1.GroupVersion).WithKind("HTTPRoute"):
		return &gwv1.HTTPRoute{}
	case istionetv1alpha3.SchemeGroupVersion.WithKind("EnvoyFilter"):
		return &istionetv1alpha3.EnvoyFilter{}
	case istionetv1.SchemeGroupVersion.WithKind("Gateway"):
		return &istionetv1.Gateway{}
	case istionetv1.SchemeGroupVersion.WithKind("VirtualService"):
		return &istionetv1.VirtualService{}
	case istionetv1.SchemeGroupVersion.WithKind("DestinationRule"):
		return &istionetv1.DestinationRule{}
	case schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"}:
		return &serviceMonitor{}
	case schema.GroupVersionKind{Group: "networking.gke.io", Version: "v1", Kind: "HealthCheckPolicy"}:
		return &gkeHealthCheckPolicy{}
	case schema.GroupVersionKind{Group: "networking.gke.io", Version: "v1", Kind: "GCPBackendPolicy"}:
		return &gkeBackendPolicy{}
	}
	if o, err := scheme.Scheme.New(gvk); err == nil {
		return o
	}
	return nil
}

// serviceMonitor is the part of Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) the chart renders, under the CRD's field names, so that a
// misspelt or unexpected field fails strict parsing (the operator's Go module is not a
// dependency).
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string `json:"jobLabel"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// gkeTargetRef is the policies' targetRef (networking.gke.io/v1).
type gkeTargetRef struct {
	Group string `json:"group"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
}

// gkeHealthCheckPolicy and gkeBackendPolicy are the parts of GKE's HealthCheckPolicy and
// GCPBackendPolicy (networking.gke.io/v1) the chart renders, under the API's field names
// (as the Inference Extension's chart writes them for provider gke), for strict parsing.
type gkeHealthCheckPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		TargetRef gkeTargetRef `json:"targetRef"`
		Default   struct {
			Config struct {
				Type            string `json:"type"`
				HTTPHealthCheck struct {
					RequestPath string `json:"requestPath"`
					Port        int32  `json:"port"`
				} `json:"httpHealthCheck"`
			} `json:"config"`
		} `json:"default"`
	} `json:"spec"`
}

type gkeBackendPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		TargetRef gkeTargetRef `json:"targetRef"`
		Default   struct {
			TimeoutSec int `json:"timeoutSec"`
		} `json:"default"`
	} `json:"spec"`
}

// splitDocs splits a YAML stream on "---" lines, dropping empty documents.
func splitDocs(data []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(append([]byte("\n"), data...), []byte("\n---\n")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			out = append(out, append(d, '\n')) // the separator took the document's last newline
		}
	}
	return out
}

func stripComments(d []byte) []byte {
	var b bytes.Buffer
	for _, l := range bytes.Split(d, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			b.Write(l)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// parseStrict decodes one document into its Go type; unknown fields fail. Istio specs
// are protobuf messages whose own JSON decoder tolerates unknown fields, so the spec is
// decoded a second time with protojson, which does not.
func parseStrict(file string, doc []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return object{}, err
	}
	gvk := schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind)
	obj := newTyped(gvk)
	if obj == nil {
		return object{}, fmt.Errorf("unknown kind %s", gvk)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return object{}, fmt.Errorf("%s: %w", gvk.Kind, err)
	}
	if m, ok := specMessage(obj); ok {
		var raw struct {
			Spec json.RawMessage `json:"spec"`
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return object{}, err
		}
		if err := json.Unmarshal(js, &raw); err != nil {
			return object{}, err
		}
		if err := protojson.Unmarshal(raw.Spec, m); err != nil {
			return object{}, fmt.Errorf("%s spec: %w", gvk.Kind, err)
		}
	}
	name := ""
	if mo, ok := obj.(metav1.Object); ok {
		name = mo.GetName()
	}
	return object{file: file, gvk: gvk, name: name, obj: obj}, nil
}

func specMessage(obj any) (proto.Message, bool) {
	switch o := obj.(type) {
	case *istionetv1alpha3.EnvoyFilter:
		return &o.Spec, true
	case *istionetv1.Gateway:
		return &o.Spec, true
	case *istionetv1.VirtualService:
		return &o.Spec, true
	case *istionetv1.DestinationRule:
		return &o.Spec, true
	}
	return nil, false
}

func loadDir(t *testing.T, glob string) []object {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no files match %s", glob)
	}
	var out []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocs(data) {
			o, err := parseStrict(f, doc)
			if err != nil {
				t.Errorf("%s document %d: %v", f, i+1, err)
				continue
			}
			out = append(out, o)
		}
	}
	return out
}

func find[T any](t *testing.T, objs []object, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok && o.name == name {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%d %T named %q, want 1", len(found), zero, name)
	}
	return found[0]
}

func TestStrictParsingCatchesUnknownFields(t *testing.T) {
	tests := []struct{ name, doc string }{
		{"core", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {app: x}}\n"},
		{"apps", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n"},
		{"pool", "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\nmetadata: {name: x}\nspec: {targetPort: [{number: 1}]}\n"},
		{"route", "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: x}\nspec: {rule: []}\n"},
		{"istio spec", "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec: {configPatch: []}\n"},
		{"unknown kind", "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseStrict("test", []byte(tc.doc)); err == nil {
				t.Errorf("accepted %q", tc.doc)
			}
		})
	}
}

func TestKubernetesManifests(t *testing.T) {
	objs := loadDir(t, "kubernetes/*.yaml")
	var real, sim *appsv1.Deployment
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.Deployment); ok && d.Name == "vllm" {
			if strings.HasSuffix(o.file, "11-vllm-sim.yaml") {
				sim = d
			} else {
				real = d
			}
		}
	}
	t.Run("vllm publishes KV events and cached tokens", func(t *testing.T) {
		args := real.Spec.Template.Spec.Containers[0].Args
		if !slices.Contains(args, "--enable-prompt-tokens-details") {
			t.Errorf("args %v lack --enable-prompt-tokens-details", args)
		}
		ev := kvEventsConfig(t, args)
		want := map[string]any{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
			"replay_endpoint": "tcp://*:5558", "topic": ""}
		if !reflect.DeepEqual(ev, want) {
			t.Errorf("kv events config %v, want %v", ev, want)
		}
	})
	t.Run("sim variant differs in image and command only", func(t *testing.T) {
		if sim == nil || real == nil {
			t.Fatal("missing a vllm Deployment")
		}
		a, b := real.DeepCopy(), sim.DeepCopy()
		ca, cb := &a.Spec.Template.Spec.Containers[0], &b.Spec.Template.Spec.Containers[0]
		if ca.Image == cb.Image || len(cb.Command) == 0 {
			t.Errorf("sim image %q command %v", cb.Image, cb.Command)
		}
		// What a GPU server needs and the simulator does not.
		ca.Image, cb.Image, ca.Command, cb.Command = "", "", nil, nil
		ca.Resources, ca.VolumeMounts, ca.StartupProbe = corev1.ResourceRequirements{}, nil, nil
		a.Spec.Template.Spec.Volumes = nil
		if !reflect.DeepEqual(a, b) {
			t.Errorf("the sim Deployment differs beyond image, command and GPU resources:\n%+v\n%+v", a.Spec, b.Spec)
		}
	})
	t.Run("kvrouter deployment", func(t *testing.T) {
		d := find[*appsv1.Deployment](t, objs, "kvrouter")
		if *d.Spec.Replicas != 2 {
			t.Errorf("replicas %d", *d.Spec.Replicas)
		}
		pt := d.Spec.Template
		for k, v := range map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9090", "prometheus.io/path": "/metrics"} {
			if pt.Annotations[k] != v {
				t.Errorf("annotation %s = %q, want %q", k, pt.Annotations[k], v)
			}
		}
		c := pt.Spec.Containers[0]
		for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
			if p == nil || p.GRPC == nil || p.GRPC.Port != 9003 {
				t.Errorf("probe %+v is not gRPC on 9003", p)
			}
		}
		// The probe port opens after the tokenizers load: liveness must not count that time.
		if p := c.StartupProbe; p != nil && p.PeriodSeconds*p.FailureThreshold < 30 {
			t.Errorf("startup probe allows %d s, want at least 30 for the models to load", p.PeriodSeconds*p.FailureThreshold)
		}
		if pt.Spec.ServiceAccountName != "kvrouter" {
			t.Errorf("service account %q", pt.Spec.ServiceAccountName)
		}
		if sc := pt.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("kvrouter may run as root")
		}
	})
	t.Run("rbac is least privilege", func(t *testing.T) {
		role := find[*rbacv1.Role](t, objs, "kvrouter-discovery")
		want := []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{kdisc.InferenceObjectives.Group}, Resources: []string{kdisc.InferenceObjectives.Resource, kdisc.InferenceModelRewrites.Resource},
				Verbs: []string{"get", "list", "watch"}},
		}
		if !reflect.DeepEqual(role.Rules, want) {
			t.Errorf("rules %+v", role.Rules)
		}
		rb := find[*rbacv1.RoleBinding](t, objs, "kvrouter-discovery")
		if rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Name != "kvrouter" {
			t.Errorf("binding %+v", rb)
		}
	})
	t.Run("kvrouter config passes check-config", func(t *testing.T) {
		cm := find[*corev1.ConfigMap](t, objs, "kvrouter-config")
		cfg, err := config.Parse([]byte(cm.Data["kvrouter.yaml"]), "kvrouter-config")
		if err != nil {
			t.Fatal(err)
		}
		svc := find[*corev1.Service](t, objs, cfg.Discovery.Kubernetes.Service)
		if svc.Spec.Ports[0].TargetPort.StrVal != "http" || cfg.Discovery.Kubernetes.Port != 8000 {
			t.Errorf("discovery port %d does not match the vllm Service", cfg.Discovery.Kubernetes.Port)
		}
	})
	t.Run("envoy config is the repository's fallbacks file with the Services' names", func(t *testing.T) {
		cm := find[*corev1.ConfigMap](t, objs, "envoy-config")
		got := cm.Data["envoy.yaml"]
		b, err := envoy.Parse([]byte(got))
		if err != nil {
			t.Fatal(err)
		}
		if err := envoy.Check(b); err != nil {
			t.Error(err)
		}
		orig, err := os.ReadFile("../envoy/envoy-fallbacks.yaml")
		if err != nil {
			t.Fatal(err)
		}
		want := string(orig)
		for _, r := range [][2]string{
			{"{address: kvrouter, port_value: 9002}", "{address: kvrouter-headless.llm.svc.cluster.local, port_value: 9002}"},
			{"{address: vllm-pool, port_value: 8000}", "{address: " + manifestPool + ".llm.svc.cluster.local, port_value: 8000}"},
		} {
			if strings.Count(want, r[0]) != 1 {
				t.Fatalf("envoy/envoy-fallbacks.yaml has %d %q, want 1", strings.Count(want, r[0]), r[0])
			}
			want = strings.Replace(want, r[0], r[1], 1)
		}
		if got != want {
			t.Errorf("envoy.yaml in the ConfigMap differs from envoy/envoy-fallbacks.yaml beyond the two Services' addresses: %s", firstDiff(got, want))
		}
		svc := find[*corev1.Service](t, objs, "kvrouter-headless")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("kvrouter-headless is not headless")
		}
		// Envoy's retries, retry buffer and pool agree with kvrouter's configuration.
		kcm := find[*corev1.ConfigMap](t, objs, "kvrouter-config")
		cfg, err := config.Parse([]byte(kcm.Data["kvrouter.yaml"]), "kvrouter-config")
		if err != nil {
			t.Fatal(err)
		}
		c, routes := bootstrapUpstream(t, b)
		checkUpstream(t, objs, cfg, manifestPool, c, routes)
	})
	t.Run("envoy image is the chart's", func(t *testing.T) {
		// The chart's envoy.image is the first release with what envoy-fallbacks.yaml uses
		// (override_host's list, selected_host_key): Envoy 1.38.
		data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var values struct {
			Envoy struct {
				Image string `json:"image"`
			} `json:"envoy"`
		}
		if err := yaml.Unmarshal(data, &values); err != nil {
			t.Fatal(err)
		}
		d := find[*appsv1.Deployment](t, objs, "envoy")
		if got, want := d.Spec.Template.Spec.Containers[0].Image, values.Envoy.Image; want == "" || got != want {
			t.Errorf("envoy image %q, the chart's envoy.image is %q", got, want)
		}
	})
}

// manifestPool is examples/kubernetes' headless Service over the vLLM pods.
const manifestPool = "vllm-pool"

// firstDiff describes the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var a, b string
		if i < len(g) {
			a = g[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b || (i >= len(g)) != (i >= len(w)) {
			return fmt.Sprintf("line %d: got %q, want %q", i+1, a, b)
		}
	}
	return fmt.Sprintf("no line differs; lengths %d and %d", len(got), len(want))
}

// kvEventsConfig returns the JSON of --kv-events-config.
func kvEventsConfig(t *testing.T, args []string) map[string]any {
	t.Helper()
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			var m map[string]any
			if err := json.Unmarshal([]byte(v), &m); err != nil {
				t.Fatalf("--kv-events-config is not JSON: %v", err)
			}
			return m
		}
	}
	t.Fatalf("no --kv-events-config in %v", args)
	return nil
}

func TestGatewayAPIManifests(t *testing.T) {
	objs := loadDir(t, "gateway-api/inferencepool.yaml")
	k8s := loadDir(t, "kubernetes/*.yaml")
	pool := find[*infv1.InferencePool](t, objs, "vllm-qwen")
	ref := pool.Spec.EndpointPickerRef
	svc := find[*corev1.Service](t, k8s, string(ref.Name))
	if ref.Port == nil || !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == int32(ref.Port.Number) }) || ref.Port.Number != 9002 {
		t.Errorf("endpoint picker port %+v is not kvrouter's ext_proc port 9002", ref.Port)
	}
	// Istio's Gateway needs to be told to speak TLS to kvrouter's ext_proc port.
	if gw := find[*gwv1.Gateway](t, objs, "inference-gateway"); gw.Spec.GatewayClassName == "istio" {
		checkIstioTLS(t, find[*istionetv1.DestinationRule](t, objs, "kvrouter-extproc"),
			string(ref.Name)+"."+pool.Namespace+".svc.cluster.local")
	}
	checkPickerService(t, svc, true)
	route := find[*gwv1.HTTPRoute](t, objs, "vllm-qwen")
	br := route.Spec.Rules[0].BackendRefs[0]
	if br.Kind == nil || *br.Kind != "InferencePool" || br.Group == nil || string(*br.Group) != infv1.GroupName || string(br.Name) != pool.Name {
		t.Errorf("backendRef %+v does not name the InferencePool", br)
	}
	data, err := os.ReadFile("gateway-api/kvrouter-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data, "gateway-api/kvrouter-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Discovery.Kubernetes.InferencePool != pool.Name {
		t.Errorf("kvrouter discovers pool %q, not %q", cfg.Discovery.Kubernetes.InferencePool, pool.Name)
	}
	// The objectives refer to the pool, one sheddable (priority < 0) and one not.
	var sheddable, kept int
	for _, o := range objs {
		obj, ok := o.obj.(*infx.InferenceObjective)
		if !ok {
			continue
		}
		if string(obj.Spec.PoolRef.Name) != pool.Name || obj.Namespace != pool.Namespace {
			t.Errorf("%s does not refer to the pool %s/%s", o, pool.Namespace, pool.Name)
		}
		if obj.Spec.Priority != nil && *obj.Spec.Priority < 0 {
			sheddable++
		} else {
			kept++
		}
	}
	if sheddable == 0 || kept == 0 {
		t.Errorf("%d sheddable and %d other InferenceObjectives, want some of each", sheddable, kept)
	}
	// The rewrites refer to the pool and send requests to models its pods serve.
	rewrites := 0
	for _, o := range objs {
		obj, ok := o.obj.(*infx.InferenceModelRewrite)
		if !ok {
			continue
		}
		rewrites++
		if obj.Spec.PoolRef == nil || string(obj.Spec.PoolRef.Name) != pool.Name || obj.Namespace != pool.Namespace {
			t.Errorf("%s does not refer to the pool %s/%s", o, pool.Namespace, pool.Name)
		}
		for _, r := range obj.Spec.Rules {
			if len(r.Targets) == 0 {
				t.Errorf("%s: a rule without targets", o)
			}
			for _, tm := range r.Targets {
				if !slices.Contains(cfg.Discovery.Kubernetes.Models, tm.ModelRewrite) {
					t.Errorf("%s: target %q is not a model the pool's pods serve (%v)", o, tm.ModelRewrite, cfg.Discovery.Kubernetes.Models)
				}
			}
		}
	}
	if rewrites == 0 {
		t.Error("no InferenceModelRewrite")
	}
}

func TestIstioManifests(t *testing.T) {
	objs := loadDir(t, "istio/*.yaml")
	ef := find[*istionetv1alpha3.EnvoyFilter](t, objs, "kvrouter")
	vs := find[*istionetv1.VirtualService](t, objs, "vllm")
	c, r := checkEnvoyFilter(t, ef, vs.Spec.Http[0].Name)
	checkIstioTLS(t, find[*istionetv1.DestinationRule](t, objs, "kvrouter-extproc"), "kvrouter.llm.svc.cluster.local")
	// The EnvoyFilter's ORIGINAL_DST cluster takes one ip:port, and 20-kvrouter.yaml
	// lists fallbacks for 30-envoy.yaml's retries: the README applies kvrouter for Istio
	// through a sed that sets max_fallbacks to 0. Run that edit and check the result
	// against the EnvoyFilter's cluster.
	cfg := istioKvrouterConfig(t)
	checkUpstream(t, objs, cfg, manifestPool, c, []*routev3.Route{r})
}

// istioSed is the README's command that applies 20-kvrouter.yaml for the Istio wiring.
var istioSed = regexp.MustCompile(`sed 's/([^/']+)/([^/']*)/' examples/kubernetes/20-kvrouter\.yaml \| kubectl apply -f -`)

// istioKvrouterConfig applies the README's sed to 20-kvrouter.yaml and returns the
// kvrouter configuration it yields.
func istioKvrouterConfig(t *testing.T) *config.Config {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, istio, _ := strings.Cut(string(readme), "\n## istio/\n")
	m := istioSed.FindStringSubmatch(istio)
	if m == nil {
		t.Fatalf("README.md's istio/ section has no `%s`", istioSed)
	}
	data, err := os.ReadFile("kubernetes/20-kvrouter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), m[1]); n != 1 {
		t.Fatalf("README's sed replaces %q, which 20-kvrouter.yaml has %d times, want 1", m[1], n)
	}
	var cm *corev1.ConfigMap
	for i, doc := range splitDocs([]byte(strings.Replace(string(data), m[1], m[2], 1))) {
		o, err := parseStrict("20-kvrouter.yaml (sed)", doc)
		if err != nil {
			t.Fatalf("document %d after README's sed: %v", i+1, err)
		}
		if c, ok := o.obj.(*corev1.ConfigMap); ok && c.Name == "kvrouter-config" {
			cm = c
		}
	}
	if cm == nil {
		t.Fatal("no kvrouter-config ConfigMap in 20-kvrouter.yaml")
	}
	cfg, err := config.Parse([]byte(cm.Data["kvrouter.yaml"]), "kvrouter-config (README's sed for Istio)")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// checkEnvoyFilter decodes every patch of kvrouter's EnvoyFilter into its Envoy type
// (unknown fields and types fail) and validates it; it returns the cluster patch and the
// route patch, which must target the VirtualService route named route.
func checkEnvoyFilter(t *testing.T, ef *istionetv1alpha3.EnvoyFilter, route string) (*clusterv3.Cluster, *routev3.Route) {
	t.Helper()
	var cluster *clusterv3.Cluster
	var merged *routev3.Route
	applied := map[string]int{}
	for i, p := range ef.Spec.ConfigPatches {
		what := fmt.Sprintf("patch %d (%s)", i, p.ApplyTo)
		js, err := protojson.Marshal(p.Patch.Value)
		if err != nil {
			t.Fatal(err)
		}
		var m proto.Message
		switch p.ApplyTo.String() {
		case "HTTP_FILTER":
			m = &hcmv3.HttpFilter{}
		case "CLUSTER":
			cluster = &clusterv3.Cluster{}
			m = cluster
		case "HTTP_ROUTE":
			merged = &routev3.Route{}
			m = merged
			if got := p.Match.GetRouteConfiguration().GetVhost().GetRoute().GetName(); got != route {
				t.Errorf("%s patches route %q, the VirtualService's is %q", what, got, route)
			}
		default:
			t.Fatalf("%s: unexpected target", what)
		}
		// The patch must be a valid Envoy message: unknown fields and types fail.
		if err := protojson.Unmarshal(js, m); err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		// A MERGE patch is a fragment of the route it merges into: validate the parts it
		// sets.
		var whole any = m
		if r, ok := m.(*routev3.Route); ok && p.Patch.Operation.String() == "MERGE" {
			whole = r.GetRoute()
			for name, a := range r.GetTypedPerFilterConfig() {
				msg, err := a.UnmarshalNew()
				if err != nil {
					t.Errorf("%s: %s: %v", what, name, err)
					continue
				}
				if v, ok := msg.(interface{ ValidateAll() error }); ok {
					if err := v.ValidateAll(); err != nil {
						t.Errorf("%s: %s: %v", what, name, err)
					}
				}
			}
		}
		if v, ok := whole.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		applied[p.ApplyTo.String()]++
		if f, ok := m.(*hcmv3.HttpFilter); ok && f.Name == "kvrouter.ext_proc" {
			var ep extprocv3.ExternalProcessor
			if err := f.GetTypedConfig().UnmarshalTo(&ep); err != nil {
				t.Fatal(err)
			}
			if got, want := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(), "outbound|9002||kvrouter.llm.svc.cluster.local"; got != want {
				t.Errorf("ext_proc cluster %q, want %q", got, want)
			}
			if ep.FailureModeAllow || !f.Disabled {
				t.Errorf("ext_proc must fail closed and be disabled outside the vLLM route")
			}
		}
	}
	if want := map[string]int{"HTTP_FILTER": 2, "CLUSTER": 1, "HTTP_ROUTE": 1}; !reflect.DeepEqual(applied, want) {
		t.Fatalf("patches %v, want %v", applied, want)
	}
	if got := merged.GetRoute().GetCluster(); got != cluster.GetName() {
		t.Errorf("the route patch sends to %q, the cluster patch adds %q", got, cluster.GetName())
	}
	return cluster, merged
}

// checkIstioTLS requires the DestinationRule to make the gateway speak TLS to kvrouter's
// ext_proc port (9002) with an SNI, as kvrouter serves by default.
func checkIstioTLS(t *testing.T, dr *istionetv1.DestinationRule, host string) {
	t.Helper()
	if dr.Spec.Host != host {
		t.Errorf("DestinationRule host %q, want %q", dr.Spec.Host, host)
	}
	for _, p := range dr.Spec.GetTrafficPolicy().GetPortLevelSettings() {
		if p.GetPort().GetNumber() == 9002 {
			if tls := p.GetTls(); tls.GetMode().String() != "SIMPLE" || tls.GetSni() == "" {
				t.Errorf("port 9002 TLS %v, want mode SIMPLE with an sni", tls)
			}
			return
		}
	}
	t.Errorf("DestinationRule %s sets no TLS for port 9002", dr.Name)
}

// The README's by-hand configuration (Running) is a valid kvrouter configuration that
// names the ports the rest of the block uses.
func TestReadmeLocalConfig(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "cat > kvrouter.yaml <<'EOF'\n")
	block, after, ok2 := strings.Cut(rest, "\nEOF\n")
	if !ok || !ok2 {
		t.Fatal("README.md has no `cat > kvrouter.yaml <<'EOF'` block")
	}
	cfg, err := config.Parse([]byte(block), "README.md (kvrouter.yaml)")
	if err != nil {
		t.Fatal(err)
	}
	ep := cfg.Endpoints[0]
	if len(cfg.Endpoints) != 1 || !strings.Contains(after, "-extproc "+cfg.Listen.ExtProc) || !strings.Contains(after, "-upstreams "+ep.Address) {
		t.Errorf("the README's commands do not use the configuration's ext_proc %s and endpoint %s:\n%s", cfg.Listen.ExtProc, ep.Address, after)
	}
}
