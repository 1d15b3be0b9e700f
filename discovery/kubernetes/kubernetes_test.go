package kubernetes_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	infx "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvrouter/kvrouter/discovery"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
	"github.com/kvrouter/kvrouter/discovery/kubernetes/clientset"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/internal/testwait"
)

const (
	ns   = "llm"
	qwen = "Qwen/Qwen3-0.6B"
)

func newFleet(t *testing.T) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(fleet.Config{Scrape: fleet.DefaultScrapeConfig()}, fleet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func vllmPod(name, ip string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "vllm"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// view is the fleet as a test sees it: eligible addresses and held-out ones.
func view(f *fleet.Fleet) (eligible, held []string) {
	for _, s := range f.Status() {
		if s.Ready {
			eligible = append(eligible, s.Config.Address)
		} else {
			held = append(held, s.Config.Address)
		}
	}
	return eligible, held
}

// waitView polls until the fleet shows want; it fails after 10s (a hang, not a timing
// assertion).
func waitView(t *testing.T, f *fleet.Fleet, eligible, held []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		el, h := view(f)
		if slices.Equal(el, eligible) && slices.Equal(h, held) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet: eligible %v held %v; want %v and %v", el, h, eligible, held)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func start(t *testing.T, s *kdisc.Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// removals records the fleet's Removed notifications (made in the source's goroutine).
type removals struct {
	mu   sync.Mutex
	list []string
}

func (r *removals) record(c fleet.Change) {
	if c.Kind == fleet.Removed {
		r.mu.Lock()
		r.list = append(r.list, c.Address)
		r.mu.Unlock()
	}
}

// take returns the removals so far and forgets them.
func (r *removals) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.list
	r.list = nil
	return l
}

func selectorCfg() discovery.KubernetesConfig {
	var c discovery.KubernetesConfig
	c.SetDefaults()
	c.Namespace = ns
	c.Selector = map[string]string{"app": "vllm"}
	c.Port = 8000
	c.Models = []string{qwen}
	c.MetricsPath = "-"
	return c
}

func TestSelectorPodsLifecycle(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	other := vllmPod("other", "10.0.0.99", true)
	other.Labels = map[string]string{"app": "something-else"}
	cs := fake.NewClientset(vllmPod("a", "10.0.0.1", true), vllmPod("b", "10.0.0.2", false), other)
	f := newFleet(t)
	rec := &removals{}
	f.Subscribe(rec.record)
	s, err := kdisc.New(selectorCfg(), discovery.DefaultKVEventsConfig(), kdisc.Clients{Core: clientset.New(cs)}, f, discovery.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	start(t, s)
	pods := cs.CoreV1().Pods(ns)
	update := func(p *corev1.Pod) {
		t.Helper()
		if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("ready pod joins, unready and unselected do not", func(t *testing.T) {
		waitView(t, f, []string{"10.0.0.1:8000"}, nil)
		if got := f.Status()[0].Config.KVEvents.Endpoints; !slices.Equal(got, []string{"tcp://10.0.0.1:5557"}) {
			t.Errorf("events endpoints %v", got)
		}
	})
	t.Run("pod turns ready", func(t *testing.T) {
		update(vllmPod("b", "10.0.0.2", true))
		waitView(t, f, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil)
	})
	t.Run("new pod joins", func(t *testing.T) {
		if _, err := pods.Create(ctx, vllmPod("c", "10.0.0.3", true), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitView(t, f, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, nil)
	})
	t.Run("readiness flaps: held out, then back with its state", func(t *testing.T) {
		update(vllmPod("a", "10.0.0.1", false))
		waitView(t, f, []string{"10.0.0.2:8000", "10.0.0.3:8000"}, []string{"10.0.0.1:8000"})
		clk.Step(29 * time.Second)
		update(vllmPod("a", "10.0.0.1", true))
		waitView(t, f, []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}, nil)
		if got := rec.take(); len(got) != 0 {
			t.Errorf("removed %v during a flap", got)
		}
	})
	t.Run("unready past the grace: removed", func(t *testing.T) {
		update(vllmPod("a", "10.0.0.1", false))
		waitView(t, f, []string{"10.0.0.2:8000", "10.0.0.3:8000"}, []string{"10.0.0.1:8000"})
		testwait.For(t, "grace timer", clk.HasWaiters)
		clk.Step(30 * time.Second)
		waitView(t, f, []string{"10.0.0.2:8000", "10.0.0.3:8000"}, nil)
		if got := rec.take(); !slices.Equal(got, []string{"10.0.0.1:8000"}) {
			t.Errorf("removed %v", got)
		}
	})
	t.Run("deleted pod removed at once", func(t *testing.T) {
		if err := pods.Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitView(t, f, []string{"10.0.0.3:8000"}, nil)
		if got := rec.take(); !slices.Equal(got, []string{"10.0.0.2:8000"}) {
			t.Errorf("removed %v", got)
		}
	})
	t.Run("pod changes IP: old address removed at once", func(t *testing.T) {
		update(vllmPod("c", "10.0.0.33", true))
		waitView(t, f, []string{"10.0.0.33:8000"}, nil)
		if got := rec.take(); !slices.Equal(got, []string{"10.0.0.3:8000"}) {
			t.Errorf("removed %v", got)
		}
	})
	t.Run("annotations give models and ranks", func(t *testing.T) {
		p := vllmPod("c", "10.0.0.33", true)
		p.Annotations = map[string]string{discovery.AnnotationModels: "m2", discovery.AnnotationDataParallelSize: "2"}
		update(p)
		testwait.For(t, "update", func() bool {
			st := f.Status()
			return len(st) == 1 && slices.Equal(st[0].Config.Models, []string{"m2"})
		})
		if got := f.Status()[0].Config.KVEvents.Endpoints; !slices.Equal(got, []string{"tcp://10.0.0.33:5557", "tcp://10.0.0.33:5558"}) {
			t.Errorf("events endpoints %v", got)
		}
	})
	t.Run("terminating pod is held out", func(t *testing.T) {
		p := vllmPod("c", "10.0.0.33", true)
		p.Annotations = map[string]string{discovery.AnnotationModels: "m2", discovery.AnnotationDataParallelSize: "2"}
		p.DeletionTimestamp = &metav1.Time{Time: clk.Now()}
		update(p)
		waitView(t, f, nil, []string{"10.0.0.33:8000"})
	})
}

func TestServiceEndpointSlices(t *testing.T) {
	ctx := context.Background()
	slice := func(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
				Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8000)}},
			Endpoints:   eps,
		}
	}
	ep := func(pod, ip string, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}}
	}
	otherSvc := slice("other-abc", ep("x", "10.0.9.9", nil))
	otherSvc.Labels[discoveryv1.LabelServiceName] = "other"
	wrongPort := slice("vllm-port", ep("y", "10.0.8.8", nil))
	wrongPort.Ports[0].Port = ptr.To[int32](9000)
	cs := fake.NewClientset(slice("vllm-1", ep("a", "10.0.0.1", ptr.To(true)), ep("b", "10.0.0.2", ptr.To(false))), otherSvc, wrongPort)
	f := newFleet(t)
	cfg := selectorCfg()
	cfg.Selector = nil
	cfg.Service = "vllm"
	s, err := kdisc.New(cfg, discovery.DefaultKVEventsConfig(), kdisc.Clients{Core: clientset.New(cs)}, f, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	start(t, s)
	t.Run("ready endpoints of the service join", func(t *testing.T) {
		waitView(t, f, []string{"10.0.0.1:8000"}, nil)
	})
	t.Run("second slice, nil ready counts as ready", func(t *testing.T) {
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice("vllm-2", ep("c", "10.0.0.3", nil)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitView(t, f, []string{"10.0.0.1:8000", "10.0.0.3:8000"}, nil)
	})
	t.Run("endpoint turns unready", func(t *testing.T) {
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice("vllm-1", ep("a", "10.0.0.1", ptr.To(false))), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitView(t, f, []string{"10.0.0.3:8000"}, []string{"10.0.0.1:8000"})
	})
	t.Run("slice deleted: its pods removed", func(t *testing.T) {
		if err := cs.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "vllm-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitView(t, f, []string{"10.0.0.3:8000"}, nil)
	})
}

func pool(ports ...int32) *unstructured.Unstructured {
	p := &infv1.InferencePool{
		TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.k8s.io/v1", Kind: "InferencePool"},
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-pool", Namespace: ns},
		Spec: infv1.InferencePoolSpec{
			Selector:          infv1.LabelSelector{MatchLabels: map[infv1.LabelKey]infv1.LabelValue{"app": "vllm"}},
			EndpointPickerRef: infv1.EndpointPickerRef{Name: "kvrouter", Port: &infv1.Port{Number: 9002}},
		},
	}
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, infv1.Port{Number: infv1.PortNumber(n)})
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p)
	if err != nil {
		panic(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// dynClient is a fake dynamic client serving InferencePools, InferenceObjectives and
// InferenceModelRewrites.
func dynClient(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		kdisc.InferencePools: "InferencePoolList", kdisc.InferenceObjectives: "InferenceObjectiveList",
		kdisc.InferenceModelRewrites: "InferenceModelRewriteList"}, objs...)
}

// poolSource is a source in inference_pool mode for the pool "vllm-pool" (pool()), with
// the clients' objects and opts.
func poolSource(t *testing.T, cs *fake.Clientset, dyn *dynfake.FakeDynamicClient, f *fleet.Fleet, opts discovery.Options) *kdisc.Source {
	t.Helper()
	cfg := selectorCfg()
	cfg.Selector, cfg.Port, cfg.InferencePool = nil, 0, "vllm-pool"
	s, err := kdisc.New(cfg, discovery.DefaultKVEventsConfig(), kdisc.Clients{Core: clientset.New(cs), Dynamic: dyn}, f, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestInferencePool(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(vllmPod("a", "10.0.0.1", true), vllmPod("b", "10.0.0.2", true))
	dyn := dynClient(pool(8000))
	f := newFleet(t)
	s := poolSource(t, cs, dyn, f, discovery.Options{})
	start(t, s)
	pools := dyn.Resource(kdisc.InferencePools).Namespace(ns)
	t.Run("pool's pods on its target port", func(t *testing.T) {
		waitView(t, f, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil)
	})
	t.Run("two target ports: one endpoint per rank", func(t *testing.T) {
		if _, err := pools.Update(ctx, pool(8000, 8001), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitView(t, f, []string{"10.0.0.1:8000", "10.0.0.1:8001", "10.0.0.2:8000", "10.0.0.2:8001"}, nil)
		for _, st := range f.Status() {
			want := "tcp://10.0.0.1:5558"
			switch st.Config.Address {
			case "10.0.0.1:8000":
				want = "tcp://10.0.0.1:5557"
			case "10.0.0.2:8000":
				want = "tcp://10.0.0.2:5557"
			case "10.0.0.2:8001":
				want = "tcp://10.0.0.2:5558"
			}
			if got := st.Config.KVEvents.Endpoints; !slices.Equal(got, []string{want}) {
				t.Errorf("%s: events %v, want %s", st.Config.Address, got, want)
			}
		}
	})
	t.Run("pool deleted: no endpoints", func(t *testing.T) {
		if err := pools.Delete(ctx, "vllm-pool", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitView(t, f, nil, nil)
	})
}

// objective is an InferenceObjective in ns referring to pool (group "" stands for the
// default the API server fills in); priority nil leaves spec.priority unset.
func objective(name, pool, group string, priority *int) *unstructured.Unstructured {
	o := &infx.InferenceObjective{
		TypeMeta:   metav1.TypeMeta{APIVersion: "inference.networking.x-k8s.io/v1alpha2", Kind: "InferenceObjective"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: infx.InferenceObjectiveSpec{Priority: priority,
			PoolRef: infx.PoolObjectReference{Name: infx.ObjectName(pool), Group: infx.Group(group)}},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		panic(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// priorities is what the source knows of names: name -> priority, absent when unknown.
func priorities(s *kdisc.Source, names ...string) map[string]int {
	out := map[string]int{}
	for _, n := range names {
		if p, ok := s.Priority(n); ok {
			out[n] = p
		}
	}
	return out
}

// With an InferencePool the source keeps the priorities of the InferenceObjectives of
// its namespace that refer to the pool, following their changes.
func TestInferenceObjectives(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(vllmPod("a", "10.0.0.1", true))
	dyn := dynClient(pool(8000),
		objective("batch", "vllm-pool", "", ptr.To(-1)),
		objective("chat", "vllm-pool", infv1.GroupName, ptr.To(10)),
		objective("unset", "vllm-pool", "", nil),
		objective("other-pool", "another-pool", "", ptr.To(-3)),
		objective("other-group", "vllm-pool", "example.com", ptr.To(-3)),
	)
	f := newFleet(t)
	s := poolSource(t, cs, dyn, f, discovery.Options{})
	if got := priorities(s, "batch"); len(got) != 0 {
		t.Fatalf("known before Run: %v", got)
	}
	start(t, s)
	names := []string{"batch", "chat", "unset", "other-pool", "other-group", "new"}
	waitPriorities := func(t *testing.T, want map[string]int) {
		t.Helper()
		testwait.For(t, "priorities", func() bool { return maps.Equal(priorities(s, names...), want) })
	}
	objs := dyn.Resource(kdisc.InferenceObjectives).Namespace(ns)
	t.Run("the pool's objectives, unset priority 0", func(t *testing.T) {
		waitPriorities(t, map[string]int{"batch": -1, "chat": 10, "unset": 0})
		waitView(t, f, []string{"10.0.0.1:8000"}, nil)
	})
	t.Run("new objective", func(t *testing.T) {
		if _, err := objs.Create(ctx, objective("new", "vllm-pool", "", ptr.To(-2)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPriorities(t, map[string]int{"batch": -1, "chat": 10, "unset": 0, "new": -2})
	})
	t.Run("priority changed", func(t *testing.T) {
		if _, err := objs.Update(ctx, objective("batch", "vllm-pool", "", ptr.To(5)), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPriorities(t, map[string]int{"batch": 5, "chat": 10, "unset": 0, "new": -2})
	})
	t.Run("moved to another pool: no longer ours", func(t *testing.T) {
		if _, err := objs.Update(ctx, objective("chat", "another-pool", "", ptr.To(10)), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPriorities(t, map[string]int{"batch": 5, "unset": 0, "new": -2})
	})
	t.Run("deleted", func(t *testing.T) {
		if err := objs.Delete(ctx, "new", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPriorities(t, map[string]int{"batch": 5, "unset": 0})
	})
}

// Without a watchable InferenceObjective or InferenceModelRewrite resource (the CRD not
// installed: the list fails) the pool's pods are still discovered, the failure is
// counted, and nothing of that resource applies.
func TestInferencePoolWithoutSideResources(t *testing.T) {
	for _, tc := range []struct {
		resource string
		group    string
		reason   string
		none     func(s *kdisc.Source) int // what applies: none without the watch
	}{
		{"inferenceobjectives", kdisc.InferenceObjectives.Group, "objectives_watch",
			func(s *kdisc.Source) int { return len(priorities(s, "batch")) }},
		{"inferencemodelrewrites", kdisc.InferenceModelRewrites.Group, "rewrites_watch",
			func(s *kdisc.Source) int { return len(lookups(s, "small")) }},
	} {
		t.Run(tc.resource, func(t *testing.T) {
			cs := fake.NewClientset(vllmPod("a", "10.0.0.1", true))
			dyn := dynClient(pool(8000))
			dyn.PrependReactor("list", tc.resource, func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: tc.group, Resource: tc.resource}, "")
			})
			reg := prometheus.NewRegistry()
			f := newFleet(t)
			s := poolSource(t, cs, dyn, f, discovery.Options{Metrics: discovery.NewMetrics(reg)})
			start(t, s)
			waitView(t, f, []string{"10.0.0.1:8000"}, nil)
			testwait.For(t, tc.reason+" counted", func() bool {
				return testmetrics.Value(t, reg, "kvrouter_discovery_errors_total", "reason", tc.reason) > 0
			})
			if n := tc.none(s); n != 0 {
				t.Fatalf("%d known without a watch", n)
			}
		})
	}
}
