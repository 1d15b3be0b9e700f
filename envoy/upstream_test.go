package envoy_test

import (
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/kvrouter/kvrouter/envoy"
)

// fallbackParts returns envoy-fallbacks.yaml's vllm_pool cluster and its route, the
// parts an Istio EnvoyFilter patches in.
func fallbackParts(t *testing.T) (*clusterv3.Cluster, *routev3.Route) {
	t.Helper()
	b, err := envoy.Load("envoy-fallbacks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c *clusterv3.Cluster
	for _, cl := range b.GetStaticResources().GetClusters() {
		if cl.GetName() == "vllm_pool" {
			c = cl
		}
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	r := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	if c == nil || r.GetRoute().GetCluster() != "vllm_pool" {
		t.Fatalf("envoy-fallbacks.yaml: no vllm_pool cluster (%v) or route to it (%v)", c, r)
	}
	return c, r
}

// TestCheckUpstream: the checks on the vLLM cluster and its routes hold for patches as
// for bootstraps.
func TestCheckUpstream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*clusterv3.Cluster, *routev3.Route)
		want   string // "" accepts
	}{
		{"as shipped", func(*clusterv3.Cluster, *routev3.Route) {}, ""},
		{"no retry policy", func(_ *clusterv3.Cluster, r *routev3.Route) { r.GetRoute().RetryPolicy = nil }, "needs a retry_policy"},
		{"retries without connect-failure", func(_ *clusterv3.Cluster, r *routev3.Route) { r.GetRoute().GetRetryPolicy().RetryOn = "5xx" }, "needs a retry_policy"},
		{"zero retries", func(_ *clusterv3.Cluster, r *routev3.Route) {
			r.GetRoute().GetRetryPolicy().NumRetries = wrapperspb.UInt32(0)
		}, "num_retries >= 1"},
		{"default max_retries", func(c *clusterv3.Cluster, _ *routev3.Route) { c.CircuitBreakers = nil }, "max_retries >= 10000"},
		{"original_dst without the header", func(c *clusterv3.Cluster, _ *routev3.Route) {
			c.LoadBalancingPolicy = nil
			c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_ORIGINAL_DST}
			c.LbPolicy = clusterv3.Cluster_CLUSTER_PROVIDED
		}, "must take its destination from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, r := fallbackParts(t)
			tc.mutate(c, r)
			err := envoy.CheckUpstream(c, r)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
