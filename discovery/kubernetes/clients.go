package kubernetes

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvrouter/kvrouter/discovery"
)

// Resource names a core resource a Source lists and watches.
type Resource string

// The resources a Source reads through CoreAPI.
const (
	Pods           Resource = "pods"           // core/v1
	EndpointSlices Resource = "endpointslices" // discovery.k8s.io/v1
)

// CoreAPI lists and watches pods and EndpointSlices in one namespace, with tweak applied
// to the options of every list and watch (the label selector). NewClients implements it
// with two REST clients that know only core/v1 and discovery.k8s.io/v1; package
// discovery/kubernetes/clientset adapts client-go's Clientset (and its fake, for tests).
// The Clientset is not used here because its scheme, its informer factory and its typed
// clients import every Kubernetes API group: with them, building kvrouter took more than
// twice as long.
type CoreAPI interface {
	ListWatch(r Resource, namespace string, tweak func(*metav1.ListOptions)) cache.ListerWatcher
}

// Clients are the API clients a Source needs; Dynamic is used with inference_pool only.
type Clients struct {
	Core    CoreAPI
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
	return ClientsForConfig(rc)
}

// ClientsForConfig builds clients for the API server rc points at.
func ClientsForConfig(rc *rest.Config) (Clients, error) {
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "kvrouter"
	core, err := NewRESTCore(rc)
	if err != nil {
		return Clients{}, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	return Clients{Core: core, Dynamic: dyn}, nil
}

// RESTCore is CoreAPI over REST clients for core/v1 (/api) and discovery.k8s.io/v1
// (/apis), decoding into the typed objects.
type RESTCore struct {
	core, discovery rest.Interface
}

// NewRESTCore builds the two REST clients from rc.
func NewRESTCore(rc *rest.Config) (*RESTCore, error) {
	scheme := runtime.NewScheme()
	// ListOptions, WatchEvent and Status, as client-go's own scheme registers them.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, fmt.Errorf("discovery: kubernetes: %w", err)
		}
	}
	codecs := serializer.NewCodecFactory(scheme)
	client := func(gv schema.GroupVersion, path string) (rest.Interface, error) {
		c := rest.CopyConfig(rc)
		c.GroupVersion = &gv
		c.APIPath = path
		c.NegotiatedSerializer = codecs.WithoutConversion()
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		r, err := rest.RESTClientFor(c)
		if err != nil {
			return nil, fmt.Errorf("discovery: kubernetes: %s client: %w", gv, err)
		}
		return r, nil
	}
	core, err := client(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, err
	}
	disc, err := client(discoveryv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, err
	}
	return &RESTCore{core: core, discovery: disc}, nil
}

// ListWatch implements CoreAPI.
func (c *RESTCore) ListWatch(r Resource, namespace string, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	g := c.core
	if r == EndpointSlices {
		g = c.discovery
	}
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	return cache.NewFilteredListWatchFromClient(g, string(r), namespace, tweak)
}
