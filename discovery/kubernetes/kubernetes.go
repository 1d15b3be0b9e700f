package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvrouter/kvrouter/discovery"
)

// InferencePools is the InferencePool resource kvrouter watches.
var InferencePools = schema.GroupVersionResource{Group: infv1.GroupName, Version: "v1", Resource: "inferencepools"}

// Source names, for metrics and logs.
const (
	SourceService       = "kubernetes-service"
	SourceSelector      = "kubernetes-selector"
	SourceInferencePool = "kubernetes-inference-pool"
)

// Clients are the API clients a Source needs; Dynamic is used with inference_pool only.
type Clients struct {
	Core    k8s.Interface
	Dynamic dynamic.Interface
}

// NewClients builds clients from the in-cluster service account, or from the kubeconfig
// file when cfg.Kubeconfig is set.
func NewClients(cfg *discovery.KubernetesConfig) (Clients, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return Clients{}, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	rc.UserAgent = "kvrouter"
	core, err := k8s.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	return Clients{Core: core, Dynamic: dyn}, nil
}

// Source watches the Kubernetes API (informers) and feeds the fleet through a
// discovery.Reconciler.
type Source struct {
	cfg    discovery.KubernetesConfig
	name   string
	c      Clients
	rec    *discovery.Reconciler
	o      discovery.Options
	kick   chan struct{}
	snap   func() ([]discovery.Target, error)
	synced []cache.InformerSynced
	start  func(stop <-chan struct{})
	stop   func() // waits for the informers' goroutines, once stop is closed
}

// New builds the source for cfg; it starts nothing (Run does).
func New(cfg discovery.KubernetesConfig, ev discovery.KVEventsConfig, c Clients, reg discovery.Registry, o discovery.Options) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("discovery: kv_events: %w", err)
	}
	if c.Core == nil || (cfg.InferencePool != "" && c.Dynamic == nil) {
		return nil, errors.New("discovery: kubernetes: missing API client")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	s := &Source{cfg: cfg, c: c, o: o, kick: make(chan struct{}, 1)}
	switch {
	case cfg.Service != "":
		s.name = SourceService
	case cfg.InferencePool != "":
		s.name = SourceInferencePool
	default:
		s.name = SourceSelector
	}
	var now func() time.Time
	if o.Clock != nil {
		now = o.Clock.Now
	}
	s.rec = discovery.NewReconciler(s.name, reg, cfg.TargetConfig, ev, discovery.ReconcilerOptions{
		Logger: o.Logger, Metrics: o.Metrics, Now: now,
	})
	return s, nil
}

// Name is the source's name in metrics and logs.
func (s *Source) Name() string { return s.name }

// Endpoints returns the addresses the source holds in the fleet.
func (s *Source) Endpoints() (ready, unready []string) { return s.rec.Endpoints() }

func (s *Source) notify() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Source) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.notify() },
		UpdateFunc: func(any, any) { s.notify() },
		DeleteFunc: func(any) { s.notify() },
	}
}

// setup builds the informers; Run calls it.
func (s *Source) setup() error {
	ns := s.cfg.Namespace
	switch {
	case s.cfg.Service != "":
		f := informers.NewSharedInformerFactoryWithOptions(s.c.Core, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.LabelSelector = labels.Set{discoveryv1.LabelServiceName: s.cfg.Service}.String()
			}))
		inf := f.Discovery().V1().EndpointSlices()
		if _, err := inf.Informer().AddEventHandler(s.handler()); err != nil {
			return err
		}
		lister := inf.Lister().EndpointSlices(ns)
		s.synced = []cache.InformerSynced{inf.Informer().HasSynced}
		s.start, s.stop = f.Start, f.Shutdown
		s.snap = func() ([]discovery.Target, error) {
			slices, err := lister.List(labels.Everything())
			if err != nil {
				return nil, err
			}
			return s.sliceTargets(slices), nil
		}
	case s.cfg.InferencePool != "":
		pf := informers.NewSharedInformerFactoryWithOptions(s.c.Core, 0, informers.WithNamespace(ns))
		pods := pf.Core().V1().Pods()
		if _, err := pods.Informer().AddEventHandler(s.handler()); err != nil {
			return err
		}
		df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.c.Dynamic, 0, ns, nil)
		pools := df.ForResource(InferencePools)
		if _, err := pools.Informer().AddEventHandler(s.handler()); err != nil {
			return err
		}
		podLister := pods.Lister().Pods(ns)
		poolLister := pools.Lister().ByNamespace(ns)
		s.synced = []cache.InformerSynced{pods.Informer().HasSynced, pools.Informer().HasSynced}
		s.start = func(stop <-chan struct{}) { pf.Start(stop); df.Start(stop) }
		s.stop = func() { pf.Shutdown(); df.Shutdown() }
		s.snap = func() ([]discovery.Target, error) {
			obj, err := poolLister.Get(s.cfg.InferencePool)
			if apierrors.IsNotFound(err) {
				return nil, errPoolNotFound
			}
			if err != nil {
				return nil, err
			}
			pool, err := toPool(obj)
			if err != nil {
				return nil, err
			}
			sel := labels.Set{}
			for k, v := range pool.Spec.Selector.MatchLabels {
				sel[string(k)] = string(v)
			}
			if len(sel) == 0 {
				return nil, fmt.Errorf("InferencePool %s/%s selects no labels", ns, pool.Name)
			}
			var ports []uint16
			for _, p := range pool.Spec.TargetPorts {
				if p.Number > 0 && p.Number <= 65535 {
					ports = append(ports, uint16(p.Number))
				}
			}
			if len(ports) == 0 {
				return nil, fmt.Errorf("InferencePool %s/%s has no target port", ns, pool.Name)
			}
			list, err := podLister.List(labels.SelectorFromSet(sel))
			if err != nil {
				return nil, err
			}
			return podTargets(list, ports), nil
		}
	default:
		f := informers.NewSharedInformerFactoryWithOptions(s.c.Core, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.LabelSelector = labels.Set(s.cfg.Selector).String()
			}))
		pods := f.Core().V1().Pods()
		if _, err := pods.Informer().AddEventHandler(s.handler()); err != nil {
			return err
		}
		lister := pods.Lister().Pods(ns)
		sel := labels.SelectorFromSet(s.cfg.Selector)
		s.synced = []cache.InformerSynced{pods.Informer().HasSynced}
		s.start, s.stop = f.Start, f.Shutdown
		s.snap = func() ([]discovery.Target, error) {
			list, err := lister.List(sel)
			if err != nil {
				return nil, err
			}
			return podTargets(list, []uint16{uint16(s.cfg.Port)}), nil
		}
	}
	return nil
}

var errPoolNotFound = errors.New("InferencePool not found")

func toPool(obj runtime.Object) (*infv1.InferencePool, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("InferencePool informer returned %T", obj)
	}
	var pool infv1.InferencePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pool); err != nil {
		return nil, fmt.Errorf("InferencePool %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &pool, nil
}

// Run starts the informers, waits for their caches, and then applies the complete set of
// targets after every change (and when a grace period ends) until ctx ends; it returns
// nil then, or an error when the caches cannot sync.
func (s *Source) Run(ctx context.Context) error {
	if err := s.setup(); err != nil {
		return fmt.Errorf("discovery: %s: %w", s.name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer s.stop()
	defer cancel() // runs first: stop waits for the informers to see it
	s.start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("discovery: %s: caches did not sync", s.name)
	}
	s.o.Logger.Info("kubernetes discovery synced", zap.String("source", s.name), zap.String("namespace", s.cfg.Namespace))
	var lastErr string
	for {
		var next time.Time
		targets, err := s.snap()
		switch {
		case errors.Is(err, errPoolNotFound):
			// A missing pool serves nothing: its pods leave the fleet.
			s.o.Metrics.Error(s.name, "pool_not_found")
			if lastErr != err.Error() {
				s.o.Logger.Warn("InferencePool not found: no endpoints", zap.String("pool", s.cfg.InferencePool))
			}
			lastErr = err.Error()
			s.rec.Apply(nil)
			next = s.rec.Expire()
		case err != nil:
			// The last good set stands.
			s.o.Metrics.Error(s.name, "list")
			if lastErr != err.Error() {
				s.o.Logger.Warn("kubernetes discovery: keeping the last endpoints", zap.Error(err))
			}
			lastErr = err.Error()
			next = s.rec.Expire()
		default:
			lastErr = ""
			s.rec.Apply(targets)
			s.o.Metrics.Synced(s.name)
			next = s.rec.Expire()
		}
		var timer <-chan time.Time
		var stop func() bool
		if !next.IsZero() {
			t := s.clock().NewTimer(next.Sub(s.clock().Now()))
			timer, stop = t.C(), t.Stop
		}
		select {
		case <-ctx.Done():
		case <-s.kick:
		case <-timer:
		}
		if stop != nil {
			stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

func (s *Source) clock() clockLike {
	if s.o.Clock != nil {
		return s.o.Clock
	}
	return realClock{}
}

// podTargets turns pods into targets: one per pod with one port, one per pod and port
// (data-parallel rank i on ports[i]) with several.
func podTargets(pods []*corev1.Pod, ports []uint16) []discovery.Target {
	out := make([]discovery.Target, 0, len(pods)*len(ports))
	for _, p := range pods {
		ip, _ := netip.ParseAddr(p.Status.PodIP)
		ready := podReady(p) && ip.IsValid()
		id := p.Namespace + "/" + p.Name
		for i, port := range ports {
			t := discovery.Target{ID: id, IP: ip, Port: port, Ready: ready, Annotations: p.Annotations, Rank: -1}
			if len(ports) > 1 {
				t.ID = id + ":" + strconv.Itoa(int(port))
				t.Rank = i
			}
			out = append(out, t)
		}
	}
	return out
}

// podReady: running, not being deleted, and its Ready condition true.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// sliceTargets turns a Service's EndpointSlices into targets: each endpoint's first
// address, on the slice port whose number is the configured port.
func (s *Source) sliceTargets(list []*discoveryv1.EndpointSlice) []discovery.Target {
	var out []discovery.Target
	for _, sl := range list {
		if sl.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		if !slices.ContainsFunc(sl.Ports, func(p discoveryv1.EndpointPort) bool {
			return p.Port != nil && int(*p.Port) == s.cfg.Port
		}) {
			s.o.Metrics.Error(s.name, "port_not_in_slice")
			continue
		}
		for _, e := range sl.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			ip, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				continue
			}
			// A nil Ready means unknown: consumers treat it as ready (API documentation).
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			id := ip.String()
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				id = e.TargetRef.Namespace + "/" + e.TargetRef.Name
			}
			out = append(out, discovery.Target{ID: id, IP: ip, Port: uint16(s.cfg.Port), Ready: ready, Rank: -1})
		}
	}
	// The same pod may sit in two slices while they are rebalanced: the reconciler
	// keeps the first ready entry per ID.
	return out
}
