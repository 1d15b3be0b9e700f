package config

import (
	"net"
	"strconv"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/tlscert"
)

// ListenConfig holds the addresses kvrouter listens on ("host:port"; port 0 picks a free
// port, for tests).
type ListenConfig struct {
	// ExtProc serves Envoy's ext_proc stream and the gRPC health service Envoy checks,
	// over TLS unless TLS.Mode is disabled.
	ExtProc string `yaml:"extproc"`
	// TLS is the ext_proc port's TLS: on by default with a self-signed certificate.
	TLS tlscert.Config `yaml:"tls"`
	// Health serves the gRPC health service for Kubernetes probes (plaintext: the
	// kubelet's gRPC probe does not speak TLS; it tells only SERVING or not).
	Health string `yaml:"health"`
	// Metrics serves HTTP /metrics, /healthz and /readyz.
	Metrics string `yaml:"metrics"`
	// Debug serves /debug/endpoints, /debug/kv, POST /debug/route and /debug/pprof/.
	// Loopback by default: reachable through `kubectl port-forward`, not from the pod
	// network. Empty: not served.
	Debug string `yaml:"debug"`
}

// DefaultListenConfig returns ":9002" (TLS, self-signed), ":9003", ":9090" and
// "127.0.0.1:9091" for the debug views.
func DefaultListenConfig() ListenConfig {
	return ListenConfig{ExtProc: ":9002", TLS: tlscert.DefaultConfig(), Health: ":9003", Metrics: ":9090", Debug: "127.0.0.1:9091"}
}

// Validate checks each address, that no two share a fixed port, and the TLS section.
func (c *ListenConfig) Validate() error {
	var errs field.Errors
	errs.Nest("tls", c.TLS.Validate())
	type bound struct{ name, host, port string }
	var seen []bound
	addrs := []struct{ name, addr string }{{"extproc", c.ExtProc}, {"health", c.Health}, {"metrics", c.Metrics}}
	if c.Debug != "" {
		addrs = append(addrs, struct{ name, addr string }{"debug", c.Debug})
	}
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			errs.Addf(a.name, "%q is not host:port", a.addr)
			continue
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil {
			errs.Addf(a.name, "%q: port must be 0..65535", a.addr)
			continue
		} else if n == 0 {
			continue
		}
		// Two listeners clash on one port when they name the same host or one binds
		// every address.
		for _, b := range seen {
			if b.port == port && (b.host == host || wildcard(b.host) || wildcard(host)) {
				errs.Addf(a.name, "%q is already used by %s", a.addr, b.name)
				break
			}
		}
		seen = append(seen, bound{a.name, host, port})
	}
	return errs.Err()
}
