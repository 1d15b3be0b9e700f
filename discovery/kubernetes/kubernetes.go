package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	infx "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvrouter/kvrouter/discovery"
)

// InferencePools is the InferencePool resource kvrouter watches.
var InferencePools = schema.GroupVersionResource{Group: infv1.GroupName, Version: "v1", Resource: "inferencepools"}

// InferenceObjectives is the InferenceObjective resource kvrouter watches with an
// InferencePool: the priorities of the requests that name one (the Inference Extension's
// v1.5.0 picker reads the same version).
var InferenceObjectives = schema.GroupVersionResource{Group: infx.GroupName, Version: "v1alpha2", Resource: "inferenceobjectives"}

// InferenceModelRewrites is the InferenceModelRewrite resource kvrouter watches with an
// InferencePool: the rules that rewrite the model requests name (the Inference
// Extension's v1.5.0 picker reads the same version).
var InferenceModelRewrites = schema.GroupVersionResource{Group: infx.GroupName, Version: "v1alpha2", Resource: "inferencemodelrewrites"}

// Source names, for metrics and logs.
const (
	SourceService       = "kubernetes-service"
	SourceSelector      = "kubernetes-selector"
	SourceInferencePool = "kubernetes-inference-pool"
)

// Source watches the Kubernetes API (informers) and feeds the fleet through a
// discovery.Reconciler.
type Source struct {
	cfg  discovery.KubernetesConfig
	name string
	c    Clients
	rec  *discovery.Reconciler
	o    discovery.Options
	kick chan struct{}
	snap func() ([]discovery.Target, error)
	infs []cache.SharedIndexInformer // built by setup, run by Run
	// side are informers Run runs without waiting for them to sync: the
	// InferenceObjectives and InferenceModelRewrites, whose absence (no CRD, no
	// permission) must not keep the pool's pods out of the fleet.
	side []cache.SharedIndexInformer
	// objectives maps the names of the InferenceObjectives referring to the pool to their
	// priorities; nil until the first list.
	objectives atomic.Pointer[map[string]int]
	// rewrites are the rules of the InferenceModelRewrites referring to the pool and those
	// refused; nil until the first list.
	rewrites atomic.Pointer[poolRewrites]
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

// watch adds a shared informer on lw (objects like obj) that kicks the source on every
// change, and returns its store.
func (s *Source) watch(lw cache.ListerWatcher, obj runtime.Object) (cache.Store, error) {
	inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(s.handler()); err != nil {
		return nil, err
	}
	s.infs = append(s.infs, inf)
	return inf.GetStore(), nil
}

// typed lists a store's objects of type T.
func typed[T any](st cache.Store) []T {
	items := st.List()
	out := make([]T, 0, len(items))
	for _, o := range items {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// podsMatching lists the store's pods that sel selects.
func podsMatching(st cache.Store, sel labels.Selector) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range typed[*corev1.Pod](st) {
		if sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out
}

// setup builds the informers; Run calls it.
func (s *Source) setup() error {
	ns := s.cfg.Namespace
	switch {
	case s.cfg.Service != "":
		sel := labels.Set{discoveryv1.LabelServiceName: s.cfg.Service}.String()
		store, err := s.watch(s.c.Core.ListWatch(EndpointSlices, ns, func(o *metav1.ListOptions) { o.LabelSelector = sel }),
			&discoveryv1.EndpointSlice{})
		if err != nil {
			return err
		}
		s.snap = func() ([]discovery.Target, error) {
			return s.sliceTargets(typed[*discoveryv1.EndpointSlice](store)), nil
		}
	case s.cfg.InferencePool != "":
		podStore, err := s.watch(s.c.Core.ListWatch(Pods, ns, nil), &corev1.Pod{})
		if err != nil {
			return err
		}
		poolStore, err := s.watch(s.dynamicLW(InferencePools), &unstructured.Unstructured{})
		if err != nil {
			return err
		}
		if err := s.watchSide(InferenceObjectives, "objectives_watch",
			"InferenceObjectives cannot be watched: every request has priority 0 until they can",
			func(objs []any) { s.objectives.Store(s.indexObjectives(objs)) }); err != nil {
			return err
		}
		if err := s.watchSide(InferenceModelRewrites, "rewrites_watch",
			"InferenceModelRewrites cannot be watched: no model is rewritten by a rule until they can",
			func(objs []any) { s.rewrites.Store(s.indexRewrites(objs, s.rewrites.Load())) }); err != nil {
			return err
		}
		s.snap = func() ([]discovery.Target, error) {
			obj, found, err := poolStore.GetByKey(ns + "/" + s.cfg.InferencePool)
			if err != nil {
				return nil, err
			}
			if !found {
				return nil, errPoolNotFound
			}
			pool, err := fromUnstructured[infv1.InferencePool]("InferencePool", obj)
			if err != nil {
				return nil, err
			}
			set := labels.Set{}
			for k, v := range pool.Spec.Selector.MatchLabels {
				set[string(k)] = string(v)
			}
			if len(set) == 0 {
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
			return podTargets(podsMatching(podStore, labels.SelectorFromSet(set)), ports), nil
		}
	default:
		selStr := labels.Set(s.cfg.Selector).String()
		store, err := s.watch(s.c.Core.ListWatch(Pods, ns, func(o *metav1.ListOptions) { o.LabelSelector = selStr }), &corev1.Pod{})
		if err != nil {
			return err
		}
		// The API filters by the selector; the store is checked again in case a
		// CoreAPI does not.
		sel := labels.SelectorFromSet(s.cfg.Selector)
		s.snap = func() ([]discovery.Target, error) {
			return podTargets(podsMatching(store, sel), []uint16{uint16(s.cfg.Port)}), nil
		}
	}
	return nil
}

var errPoolNotFound = errors.New("InferencePool not found")

// dynamicLW lists and watches r in the source's namespace with the dynamic client.
func (s *Source) dynamicLW(r schema.GroupVersionResource) cache.ListerWatcher {
	c := s.c.Dynamic.Resource(r).Namespace(s.cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, o)
		},
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, s.c.Dynamic)
}

// watchSide adds a side informer on the namespace's objects of resource r (the
// InferenceObjectives, the InferenceModelRewrites): after every change index is given
// all of them again, to keep those referring to the pool. A watch that fails (no CRD, no
// RBAC permission) is counted (kvrouter_discovery_errors_total{reason=reason}), logged
// with warning once per distinct error and retried by the informer; meanwhile index
// keeps what it last had (nothing before the first list).
func (s *Source) watchSide(r schema.GroupVersionResource, reason, warning string, index func(objs []any)) error {
	inf := cache.NewSharedIndexInformer(s.dynamicLW(r), &unstructured.Unstructured{}, 0, cache.Indexers{})
	st := inf.GetStore()
	all := func(any) { index(st.List()) }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: all, UpdateFunc: func(_, o any) { all(o) }, DeleteFunc: all,
	}); err != nil {
		return err
	}
	lastErr := "" // the last watch error logged (the reflector's goroutine only)
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, rf *cache.Reflector, err error) {
		s.o.Metrics.Error(s.name, reason)
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			s.o.Logger.Warn(warning, zap.String("namespace", s.cfg.Namespace), zap.Error(err))
		}
		cache.DefaultWatchErrorHandler(ctx, rf, err)
	}); err != nil {
		return err
	}
	s.side = append(s.side, inf)
	return nil
}

// indexObjectives maps the names of the objects that are InferenceObjectives referring
// to the source's pool (ourPool) to their priorities (an unset priority is 0, as the
// Inference Extension reads it).
func (s *Source) indexObjectives(objs []any) *map[string]int {
	m := make(map[string]int, len(objs))
	for _, obj := range objs {
		o, err := fromUnstructured[infx.InferenceObjective]("InferenceObjective", obj)
		if err != nil {
			s.o.Metrics.Error(s.name, "objective_invalid")
			continue
		}
		if !s.ourPool(&o.Spec.PoolRef) {
			continue
		}
		p := 0
		if o.Spec.Priority != nil {
			p = *o.Spec.Priority
		}
		m[o.Name] = p
	}
	return &m
}

// ourPool reports whether ref names the source's pool. As the Inference Extension's
// picker reads it, a reference naming another pool or another group is not the pool's; a
// kind left unset means InferencePool.
func (s *Source) ourPool(ref *infx.PoolObjectReference) bool {
	return ref != nil && string(ref.Name) == s.cfg.InferencePool && (ref.Group == "" || string(ref.Group) == infv1.GroupName) &&
		(ref.Kind == "" || ref.Kind == "InferencePool")
}

// Priority implements extproc.Objectives: the priority of the InferenceObjective named
// name in the pool's namespace, when it refers to the pool. It knows none before the
// first list, outside inference_pool mode or while InferenceObjectives cannot be
// watched. Safe for concurrent use.
func (s *Source) Priority(name string) (int, bool) {
	m := s.objectives.Load()
	if m == nil {
		return 0, false
	}
	p, ok := (*m)[name]
	return p, ok
}

// Objectives returns a copy of the priorities Priority reads (nil before the first
// list), for /debug/objectives. Safe for concurrent use.
func (s *Source) Objectives() map[string]int {
	m := s.objectives.Load()
	if m == nil {
		return nil
	}
	return maps.Clone(*m)
}

// fromUnstructured is an informer's object as the typed resource T (kind names it in
// errors).
func fromUnstructured[T any](kind string, obj any) (*T, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("%s informer returned %T", kind, obj)
	}
	var o T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &o); err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", kind, u.GetNamespace(), u.GetName(), err)
	}
	return &o, nil
}

// Run starts the informers, waits for their caches, and then applies the complete set of
// targets after every change (and when a grace period ends) until ctx ends; it returns
// nil then, or an error when the caches cannot sync.
func (s *Source) Run(ctx context.Context) error {
	if err := s.setup(); err != nil {
		return fmt.Errorf("discovery: %s: %w", s.name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs first: the informers stop, then Run waits for them
	synced := make([]cache.InformerSynced, 0, len(s.infs))
	for _, inf := range s.infs {
		wg.Go(func() { inf.Run(ctx.Done()) })
		synced = append(synced, inf.HasSynced)
	}
	for _, inf := range s.side {
		wg.Go(func() { inf.Run(ctx.Done()) })
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
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
