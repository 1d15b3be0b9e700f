package envoy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	overridehostv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/override_host/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	// Typed configs the files use, registered for protojson's Any resolution.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/load_balancing_policies/least_request/v3"

	"github.com/kvrouter/kvrouter/epp"
)

// The names kvrouter's routing relies on.
const (
	extProcFilterType      = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
	minCircuitBreakerLimit = 10000
)

// Load reads an Envoy bootstrap in YAML, resolves every typed config (an unknown type or
// field is an error) and runs the generated validators on the bootstrap and on every
// typed config inside it.
func Load(path string) (*bootstrapv3.Bootstrap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	return Parse(data)
}

// Parse is Load on bytes.
func Parse(data []byte) (*bootstrapv3.Bootstrap, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("envoy: yaml: %w", err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("envoy: yaml to json: %w", err)
	}
	b := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("envoy: bootstrap: %w", err)
	}
	if err := validateDeep(b.ProtoReflect(), "bootstrap"); err != nil {
		return nil, err
	}
	return b, nil
}

type allValidator interface{ ValidateAll() error }

// validateDeep runs ValidateAll on m, then walks its fields and does the same for each
// message packed in an Any, which the generated validators do not open.
func validateDeep(m protoreflect.Message, path string) error {
	if v, ok := m.Interface().(allValidator); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("envoy: %s: %w", path, err)
		}
	}
	if a, ok := m.Interface().(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("envoy: %s: %w", path, err)
		}
		return validateDeep(inner.ProtoReflect(), path+"("+a.GetTypeUrl()+")")
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := range l.Len() {
				if err = validateDeep(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i)); err != nil {
					return false
				}
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = validateDeep(mv.Message(), fmt.Sprintf("%s[%v]", p, k.Interface()))
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = validateDeep(v.Message(), p)
		}
		return err == nil
	})
	return err
}

// Check applies the rules Envoy enforces in code, outside the generated validators, and
// those kvrouter's routing needs, to every HTTP connection manager that has an ext_proc
// filter. It returns every violation.
func Check(b *bootstrapv3.Bootstrap) error {
	var errs []error
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
		errs = append(errs, checkCluster(c)...)
	}
	found := false
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, nf := range fc.GetFilters() {
				if nf.GetTypedConfig() == nil {
					continue
				}
				hcm := &hcmv3.HttpConnectionManager{}
				if nf.GetTypedConfig().MessageIs(hcm) {
					if err := nf.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						errs = append(errs, fmt.Errorf("listener %s: %w", l.GetName(), err))
						continue
					}
					n, e := checkHCM(l.GetName(), hcm, clusters)
					if n > 0 {
						found = true
					}
					errs = append(errs, e...)
				}
			}
		}
	}
	if !found {
		errs = append(errs, errors.New("no HTTP connection manager with an ext_proc filter"))
	}
	return errors.Join(errs...)
}

// CheckUpstream applies Check's rules for the cluster that kvrouter's picks go to, and
// for the routes to it, to configuration that is not a whole bootstrap: an Istio
// EnvoyFilter's cluster and route patches. It returns every violation.
func CheckUpstream(c *clusterv3.Cluster, routes ...*routev3.Route) error {
	errs := checkCluster(c)
	rc := &routev3.RouteConfiguration{VirtualHosts: []*routev3.VirtualHost{{Name: "patch", Routes: routes}}}
	errs = append(errs, checkRoutes("patch", rc, map[string]*clusterv3.Cluster{c.GetName(): c})...)
	return errors.Join(errs...)
}

// overrideHost returns the cluster's override_host load-balancing policy, or nil.
func overrideHost(c *clusterv3.Cluster) *overridehostv3.OverrideHost {
	for _, p := range c.GetLoadBalancingPolicy().GetPolicies() {
		oh := &overridehostv3.OverrideHost{}
		if tc := p.GetTypedExtensionConfig().GetTypedConfig(); tc != nil && tc.MessageIs(oh) && tc.UnmarshalTo(oh) == nil {
			return oh
		}
	}
	return nil
}

func checkCluster(c *clusterv3.Cluster) []error {
	var errs []error
	if oh := overrideHost(c); oh != nil {
		src := false
		for _, s := range oh.GetOverrideHostSources() {
			md := s.GetMetadata()
			if strings.EqualFold(s.GetHeader(), epp.HeaderDestination) ||
				(md.GetKey() == "envoy.lb" && len(md.GetPath()) == 1 && md.GetPath()[0].GetKey() == epp.HeaderDestination) {
				src = true
			}
		}
		if !src {
			errs = append(errs, fmt.Errorf("cluster %s: override_host must take its hosts from the %s header or envoy.lb metadata", c.GetName(), epp.HeaderDestination))
		}
		retries := false
		for _, t := range c.GetCircuitBreakers().GetThresholds() {
			retries = retries || t.GetMaxRetries().GetValue() >= minCircuitBreakerLimit
		}
		if !retries {
			errs = append(errs, fmt.Errorf("cluster %s: override_host cluster needs circuit breaker max_retries >= %d (the default, 3 at once, leaves most requests to a dead pod unretried)", c.GetName(), minCircuitBreakerLimit))
		}
		// override_host picks only hosts the cluster knows: LOGICAL_DNS keeps one logical
		// host (the first address of the answer), ORIGINAL_DST none ahead of a request.
		if t := c.GetType(); c.GetClusterType() == nil && (t == clusterv3.Cluster_LOGICAL_DNS || t == clusterv3.Cluster_ORIGINAL_DST) {
			errs = append(errs, fmt.Errorf("cluster %s: override_host only picks hosts the cluster knows, and a %v cluster does not know the pods: use STRICT_DNS over a headless Service, STATIC or EDS", c.GetName(), t))
		}
	}
	if c.GetType() == clusterv3.Cluster_ORIGINAL_DST {
		if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
			errs = append(errs, fmt.Errorf("cluster %s: ORIGINAL_DST needs lb_policy CLUSTER_PROVIDED, not %v", c.GetName(), c.GetLbPolicy()))
		}
		o := c.GetOriginalDstLbConfig()
		if !o.GetUseHttpHeader() || !strings.EqualFold(o.GetHttpHeaderName(), epp.HeaderDestination) {
			errs = append(errs, fmt.Errorf("cluster %s: ORIGINAL_DST must take its destination from the %s header (original_dst_lb_config use_http_header, http_header_name)", c.GetName(), epp.HeaderDestination))
		}
	}
	return errs
}

// checkHCM checks one connection manager; n is the number of ext_proc filters in it.
func checkHCM(listener string, hcm *hcmv3.HttpConnectionManager, clusters map[string]*clusterv3.Cluster) (n int, errs []error) {
	where := "listener " + listener
	stripAt, servedAt := -1, -1
	for i, f := range hcm.GetHttpFilters() {
		tc := f.GetTypedConfig()
		if tc == nil {
			continue
		}
		if stripAt < 0 && stripsDestination(tc) {
			stripAt = i
		}
		if servedAt < 0 && stripsServed(tc) {
			servedAt = i
		}
		if tc.GetTypeUrl() != "type.googleapis.com/"+extProcFilterType {
			continue
		}
		n++
		ep := &extprocv3.ExternalProcessor{}
		if err := tc.UnmarshalTo(ep); err != nil {
			errs = append(errs, fmt.Errorf("%s: filter %s: %w", where, f.GetName(), err))
			continue
		}
		fw := fmt.Sprintf("%s: filter %s", where, f.GetName())
		if stripAt < 0 {
			errs = append(errs, fmt.Errorf("%s: no filter before ext_proc removes client-sent %s* headers (a Lua filter or header_mutation)", fw, epp.HeaderPrefix))
		}
		// Response filters run in reverse order: only a filter listed before ext_proc
		// sees the header kvrouter adds (a route's response_headers_to_remove runs
		// before ext_proc and does not).
		if servedAt < 0 {
			errs = append(errs, fmt.Errorf("%s: no filter before ext_proc removes %s from responses (a Lua envoy_on_response or header_mutation response_mutations): it tells the client a pod's ip:port", fw, epp.HeaderServed))
		}
		errs = append(errs, checkExtProc(fw, ep, clusters)...)
	}
	if n > 0 {
		errs = append(errs, checkRoutes(where, hcm.GetRouteConfig(), clusters)...)
	}
	return n, errs
}

// stripsDestination reports whether a filter removes client-sent destination headers:
// a Lua filter whose code removes headers with the x-gateway-destination- prefix, or a
// header_mutation filter removing x-gateway-destination-endpoint.
func stripsDestination(tc *anypb.Any) bool {
	lua := &luav3.Lua{}
	if tc.MessageIs(lua) && tc.UnmarshalTo(lua) == nil {
		code := luaCode(lua)
		return strings.Contains(code, "envoy_on_request") && strings.Contains(code, epp.HeaderPrefix) && strings.Contains(code, ":remove(")
	}
	if strings.HasSuffix(tc.GetTypeUrl(), ".header_mutation.v3.HeaderMutation") {
		return mutationRemoves(tc, false, epp.HeaderDestination)
	}
	return false
}

// mutationRemoves reports whether a header_mutation filter removes header from requests
// (or responses). It decodes the filter generically, to avoid compiling the
// header_mutation package for a filter the shipped files do not use.
func mutationRemoves(tc *anypb.Any, response bool, header string) bool {
	m, err := tc.UnmarshalNew()
	if err != nil {
		return false
	}
	js, _ := protojson.Marshal(m)
	type removal struct {
		Remove string `json:"remove"`
	}
	var v struct {
		Mutations struct {
			Request  []removal `json:"requestMutations"`
			Response []removal `json:"responseMutations"`
		} `json:"mutations"`
	}
	if json.Unmarshal(js, &v) != nil {
		return false
	}
	list := v.Mutations.Request
	if response {
		list = v.Mutations.Response
	}
	for _, rm := range list {
		if strings.EqualFold(rm.Remove, header) {
			return true
		}
	}
	return false
}

// luaCode is a Lua filter's inline code, wherever the config put it.
func luaCode(lua *luav3.Lua) string {
	//lint:ignore SA1019 configs may still use the deprecated inline_code, which Envoy still runs
	return lua.GetDefaultSourceCode().GetInlineString() + lua.GetInlineCode()
}

// stripsServed reports whether a filter removes kvrouter's served-endpoint header from
// responses: a Lua filter whose envoy_on_response removes it, or a header_mutation filter
// with a response mutation removing it.
func stripsServed(tc *anypb.Any) bool {
	lua := &luav3.Lua{}
	if tc.MessageIs(lua) && tc.UnmarshalTo(lua) == nil {
		code := luaCode(lua)
		_, resp, ok := strings.Cut(code, "function envoy_on_response")
		return ok && strings.Contains(resp, `:remove("`+epp.HeaderServed+`")`)
	}
	if strings.HasSuffix(tc.GetTypeUrl(), ".header_mutation.v3.HeaderMutation") {
		return mutationRemoves(tc, true, epp.HeaderServed)
	}
	return false
}

// checkUpstreamTLS requires the ext_proc cluster to speak TLS, as kvrouter serves by
// default: an UpstreamTlsContext transport socket with an SNI and HTTP/2 offered in ALPN
// (gRPC servers refuse a TLS connection that negotiated no protocol).
func checkUpstreamTLS(c *clusterv3.Cluster) []error {
	ts := c.GetTransportSocket()
	up := &tlsv3.UpstreamTlsContext{}
	if ts.GetTypedConfig() == nil || !ts.GetTypedConfig().MessageIs(up) {
		return []error{fmt.Errorf("cluster %s: kvrouter serves TLS: the ext_proc cluster needs a transport_socket with an UpstreamTlsContext (envoy.transport_sockets.tls)", c.GetName())}
	}
	if err := ts.GetTypedConfig().UnmarshalTo(up); err != nil {
		return []error{fmt.Errorf("cluster %s: transport_socket: %w", c.GetName(), err)}
	}
	var errs []error
	if up.GetSni() == "" {
		errs = append(errs, fmt.Errorf("cluster %s: the UpstreamTlsContext needs an sni", c.GetName()))
	}
	if !slices.Contains(up.GetCommonTlsContext().GetAlpnProtocols(), "h2") {
		errs = append(errs, fmt.Errorf("cluster %s: the UpstreamTlsContext must offer h2 in common_tls_context.alpn_protocols (gRPC over TLS)", c.GetName()))
	}
	return errs
}

func checkExtProc(fw string, ep *extprocv3.ExternalProcessor, clusters map[string]*clusterv3.Cluster) []error {
	var errs []error
	pm := ep.GetProcessingMode()
	fds := extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if pm.GetRequestBodyMode() == fds && pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
		errs = append(errs, fmt.Errorf("%s: request_body_mode FULL_DUPLEX_STREAMED needs request_trailer_mode SEND", fw))
	}
	if pm.GetResponseBodyMode() == fds && pm.GetResponseTrailerMode() != extprocv3.ProcessingMode_SEND {
		errs = append(errs, fmt.Errorf("%s: response_body_mode FULL_DUPLEX_STREAMED needs response_trailer_mode SEND", fw))
	}
	if pm.GetRequestHeaderMode() == extprocv3.ProcessingMode_SKIP {
		errs = append(errs, fmt.Errorf("%s: request_header_mode SKIP: kvrouter never sees the request", fw))
	}
	if ep.GetFailureModeAllow() {
		if pm.GetRequestBodyMode() != extprocv3.ProcessingMode_BUFFERED {
			errs = append(errs, fmt.Errorf("%s: failure_mode_allow needs request_body_mode BUFFERED, not %v", fw, pm.GetRequestBodyMode()))
		}
		if pm.GetResponseBodyMode() == fds {
			errs = append(errs, fmt.Errorf("%s: failure_mode_allow with response_body_mode FULL_DUPLEX_STREAMED depends on the Envoy version; use NONE", fw))
		}
	}
	if ep.GetAllowModeOverride() {
		errs = append(errs, fmt.Errorf("%s: allow_mode_override must be false", fw))
	}
	if ep.GetDisableClearRouteCache() || ep.GetRouteCacheAction() == extprocv3.ExternalProcessor_RETAIN {
		errs = append(errs, fmt.Errorf("%s: the route cache must be cleared so that the picked endpoint's route is taken", fw))
	}
	mo := ep.GetMetadataOptions()
	for _, ns := range []string{epp.NamespaceSubsetHint, epp.NamespaceLB} {
		if !slices.Contains(mo.GetForwardingNamespaces().GetUntyped(), ns) {
			errs = append(errs, fmt.Errorf("%s: metadata_options.forwarding_namespaces.untyped lacks %s", fw, ns))
		}
	}
	if !slices.Contains(mo.GetReceivingNamespaces().GetUntyped(), epp.NamespaceLB) {
		errs = append(errs, fmt.Errorf("%s: metadata_options.receiving_namespaces.untyped lacks envoy.lb", fw))
	}
	name := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if name == "" {
		if ep.GetGrpcService().GetGoogleGrpc() == nil {
			errs = append(errs, fmt.Errorf("%s: no gRPC service", fw))
		}
		return errs
	}
	c := clusters[name]
	if c == nil {
		return append(errs, fmt.Errorf("%s: ext_proc cluster %q is not defined", fw, name))
	}
	if !speaksHTTP2(c) {
		errs = append(errs, fmt.Errorf("cluster %s: the ext_proc cluster must speak HTTP/2 (typed_extension_protocol_options envoy.extensions.upstreams.http.v3.HttpProtocolOptions explicit_http_config.http2_protocol_options)", name))
	}
	errs = append(errs, checkUpstreamTLS(c)...)
	hc := false
	for _, h := range c.GetHealthChecks() {
		if h.GetGrpcHealthCheck() != nil && h.GetGrpcHealthCheck().GetServiceName() == epp.ServiceName {
			hc = true
		}
	}
	if !hc {
		errs = append(errs, fmt.Errorf("cluster %s: needs a gRPC health check on service %s", name, epp.ServiceName))
	}
	high := false
	for _, t := range c.GetCircuitBreakers().GetThresholds() {
		if t.GetMaxRequests().GetValue() >= minCircuitBreakerLimit && t.GetMaxPendingRequests().GetValue() >= minCircuitBreakerLimit &&
			t.GetMaxConnections().GetValue() >= minCircuitBreakerLimit {
			high = true
		}
	}
	if !high {
		errs = append(errs, fmt.Errorf("cluster %s: circuit breaker max_requests, max_pending_requests and max_connections must be >= %d (the default 1,024 caps concurrent requests)", name, minCircuitBreakerLimit))
	}
	return errs
}

func speaksHTTP2(c *clusterv3.Cluster) bool {
	//lint:ignore SA1019 the deprecated field still works in Envoy, so a config using it speaks HTTP/2
	if c.GetHttp2ProtocolOptions() != nil {
		return true
	}
	a := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if a == nil {
		return false
	}
	o := &httpv3.HttpProtocolOptions{}
	if err := a.UnmarshalTo(o); err != nil {
		return false
	}
	return o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

// checkRoutes requires every route to an ORIGINAL_DST cluster to match only requests
// carrying the destination header (without it Envoy would connect to the request's
// original destination, itself), and every route to an override_host cluster to retry
// connect failures (on the fallbacks kvrouter lists).
func checkRoutes(where string, rc *routev3.RouteConfiguration, clusters map[string]*clusterv3.Cluster) []error {
	var errs []error
	if rc == nil {
		return []error{fmt.Errorf("%s: an inline route_config is required", where)}
	}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			c := clusters[r.GetRoute().GetCluster()]
			if c != nil && overrideHost(c) != nil {
				rp := r.GetRoute().GetRetryPolicy()
				if !strings.Contains(rp.GetRetryOn(), "connect-failure") || rp.GetNumRetries().GetValue() < 1 {
					errs = append(errs, fmt.Errorf("%s: route %q to override_host cluster %s needs a retry_policy with retry_on connect-failure and num_retries >= 1 (the fallbacks kvrouter lists are tried on retries)", where, r.GetName(), c.GetName()))
				}
			}
			if c == nil || c.GetType() != clusterv3.Cluster_ORIGINAL_DST {
				continue
			}
			ok := false
			for _, h := range r.GetMatch().GetHeaders() {
				if strings.EqualFold(h.GetName(), epp.HeaderDestination) && h.GetPresentMatch() && !h.GetInvertMatch() {
					ok = true
				}
			}
			if !ok {
				errs = append(errs, fmt.Errorf("%s: route %q to ORIGINAL_DST cluster %s must match only requests with %s present (headers: present_match)", where, r.GetName(), c.GetName(), epp.HeaderDestination))
			}
		}
	}
	return errs
}
