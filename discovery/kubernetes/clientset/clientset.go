// Package clientset adapts a client-go kubernetes.Interface (a real Clientset, or the fake
// one from k8s.io/client-go/kubernetes/fake that tests use) to discovery/kubernetes's
// CoreAPI. kvrouter itself does not import it: the Clientset brings every Kubernetes API
// group into the build, and kvrouter reads only pods and EndpointSlices.
package clientset

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
)

// Core is a kdisc.CoreAPI over a kubernetes.Interface.
type Core struct {
	cs k8s.Interface
}

// New adapts cs.
func New(cs k8s.Interface) *Core { return &Core{cs: cs} }

// ListWatch implements kdisc.CoreAPI with cs's typed clients, as client-go's informer
// factory builds its list-watches (including its watch-list capability check).
func (c *Core) ListWatch(r kdisc.Resource, namespace string, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	var list func(context.Context, metav1.ListOptions) (runtime.Object, error)
	var wt func(context.Context, metav1.ListOptions) (watch.Interface, error)
	switch r {
	case kdisc.EndpointSlices:
		api := c.cs.DiscoveryV1().EndpointSlices(namespace)
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) }
		wt = api.Watch
	default:
		api := c.cs.CoreV1().Pods(namespace)
		list = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, o) }
		wt = api.Watch
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return wt(ctx, o)
		},
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, c.cs)
}
