package kubernetes_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/kvrouter/kvrouter/discovery"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
)

// apiServer is a small Kubernetes API server for one collection: list, watch and
// watch-list (sendInitialEvents, as client-go's reflectors ask for by default), enough to
// prove that RESTCore's clients use the right paths, selectors and decoding.
type apiServer struct {
	t        *testing.T
	path     string // e.g. /api/v1/namespaces/llm/pods
	kind     string // e.g. Pod
	version  string // e.g. v1
	selector string // the labelSelector every request must carry

	mu      sync.Mutex
	rv      int
	objs    []json.RawMessage
	watches []chan []byte
}

type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// add stores obj (filling kind, apiVersion and resourceVersion) and sends it to watchers.
func (a *apiServer) add(obj metav1.Object, typ string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rv++
	obj.SetResourceVersion(strconv.Itoa(a.rv))
	raw, err := json.Marshal(obj)
	if err != nil {
		a.t.Fatal(err)
	}
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	m["kind"], m["apiVersion"] = a.kind, a.version
	raw, _ = json.Marshal(m)
	a.objs = append(a.objs, raw)
	ev, _ := json.Marshal(watchEvent{Type: typ, Object: raw})
	for _, w := range a.watches {
		w <- append(ev, '\n')
	}
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != a.path {
		http.Error(w, "unexpected path "+r.URL.Path, http.StatusNotFound)
		a.t.Errorf("request for %s, want %s", r.URL.Path, a.path)
		return
	}
	q := r.URL.Query()
	if got := q.Get("labelSelector"); got != a.selector {
		a.t.Errorf("labelSelector %q, want %q", got, a.selector)
	}
	w.Header().Set("Content-Type", "application/json")
	a.mu.Lock()
	if q.Get("watch") != "true" {
		list := map[string]any{"kind": a.kind + "List", "apiVersion": a.version,
			"metadata": map[string]any{"resourceVersion": strconv.Itoa(a.rv)}, "items": a.objs}
		a.mu.Unlock()
		_ = json.NewEncoder(w).Encode(list)
		return
	}
	ch := make(chan []byte, 64)
	a.watches = append(a.watches, ch)
	if q.Get("sendInitialEvents") == "true" {
		for _, o := range a.objs {
			ev, _ := json.Marshal(watchEvent{Type: "ADDED", Object: o})
			ch <- append(ev, '\n')
		}
		bm, _ := json.Marshal(map[string]any{"kind": a.kind, "apiVersion": a.version, "metadata": map[string]any{
			"resourceVersion": strconv.Itoa(a.rv), "annotations": map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
		ev, _ := json.Marshal(watchEvent{Type: "BOOKMARK", Object: bm})
		ch <- append(ev, '\n')
	}
	a.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-ch:
			_, _ = w.Write(ev)
			if fl != nil {
				fl.Flush()
			}
		}
	}
}

func TestRESTCoreAgainstAPIServer(t *testing.T) {
	t.Run("pods by selector, then a pod turns ready", func(t *testing.T) {
		api := &apiServer{t: t, path: "/api/v1/namespaces/llm/pods", kind: "Pod", version: "v1", selector: "app=vllm"}
		api.add(vllmPod("a", "10.0.0.1", true), "ADDED")
		api.add(vllmPod("b", "10.0.0.2", false), "ADDED")
		srv := httptest.NewServer(api)
		// Registered before start's cleanup, so it runs after the source has stopped
		// (Close waits for the open watches).
		t.Cleanup(srv.Close)
		clients, err := kdisc.ClientsForConfig(&rest.Config{Host: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		f := newFleet(t)
		s, err := kdisc.New(selectorCfg(), discovery.DefaultKVEventsConfig(), clients, f, discovery.Options{})
		if err != nil {
			t.Fatal(err)
		}
		start(t, s)
		waitView(t, f, []string{"10.0.0.1:8000"}, nil)
		api.add(vllmPod("b", "10.0.0.2", true), "MODIFIED")
		waitView(t, f, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil)
	})
	t.Run("endpoint slices of a service", func(t *testing.T) {
		api := &apiServer{t: t, path: "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices", kind: "EndpointSlice",
			version: "discovery.k8s.io/v1", selector: discoveryv1.LabelServiceName + "=vllm"}
		api.add(&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "vllm-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "vllm"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8000)}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.7"},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "g"}}},
		}, "ADDED")
		srv := httptest.NewServer(api)
		// Registered before start's cleanup, so it runs after the source has stopped
		// (Close waits for the open watches).
		t.Cleanup(srv.Close)
		clients, err := kdisc.ClientsForConfig(&rest.Config{Host: srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		cfg := selectorCfg()
		cfg.Selector, cfg.Service = nil, "vllm"
		f := newFleet(t)
		s, err := kdisc.New(cfg, discovery.DefaultKVEventsConfig(), clients, f, discovery.Options{})
		if err != nil {
			t.Fatal(err)
		}
		start(t, s)
		waitView(t, f, []string{"10.0.0.7:8000"}, nil)
	})
}
