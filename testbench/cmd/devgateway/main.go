// Command devgateway is a development stand-in for Envoy: an HTTP reverse proxy that asks
// kvrouter (over ext_proc, FULL_DUPLEX_STREAMED) where each request goes and proxies it to
// that endpoint when it is in the -upstreams allowlist. With several kvrouter replicas in
// -extproc, each request's ext_proc stream goes to the next healthy one in turn (gRPC's
// round_robin balancer with client-side health checks of the ext_proc service, as
// Envoy's health-checked kvrouter cluster spreads streams over its hosts). It speaks TLS to kvrouter (verifying
// the certificate with -extproc-ca, else skipping verification as NGINX Gateway Fabric
// does by default). Not for production.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // client-side health checks for -extproc replicas
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/kvrouter/kvrouter/testbench/gateway"
	"github.com/kvrouter/kvrouter/tlscert"
)

func main() {
	listen := flag.String("listen", ":8080", "HTTP listen address")
	extproc := flag.String("extproc", "127.0.0.1:9002", "kvrouter ext_proc gRPC address; a comma list of replicas spreads the streams over the healthy ones in turn")
	upstreams := flag.String("upstreams", "", "comma-separated ip:port allowlist of upstream endpoints")
	maxBody := flag.Int64("max-request-bytes", gateway.DefaultMaxRequestBytes, "largest request body accepted")
	expose := flag.Bool("expose-served", false, "keep kvrouter's x-gateway-destination-endpoint-served header (a pod's ip:port) in responses, for benchmarks; removed by default")
	plaintext := flag.Bool("extproc-plaintext", false, "connect to kvrouter without TLS (only for a kvrouter with listen.tls.mode: disabled)")
	var tc tlscert.ClientConfig
	flag.StringVar(&tc.CAFile, "extproc-ca", "", "PEM CA bundle to verify kvrouter's certificate with (empty: verification skipped, for kvrouter's self-signed default)")
	flag.StringVar(&tc.ServerName, "extproc-server-name", "", "name to verify in kvrouter's certificate and send as SNI (empty: the -extproc host)")
	flag.StringVar(&tc.CertFile, "extproc-cert", "", "client certificate (PEM) for a kvrouter with listen.tls.client_ca_file")
	flag.StringVar(&tc.KeyFile, "extproc-key", "", "client certificate's key (PEM)")
	flag.Parse()
	creds := insecure.NewCredentials()
	if !*plaintext {
		c, err := tc.TLS()
		if err != nil {
			fmt.Fprintln(os.Stderr, "devgateway:", err)
			os.Exit(2)
		}
		creds = credentials.NewTLS(c)
	}
	if err := run(*listen, *extproc, *upstreams, *maxBody, *expose, creds); err != nil {
		fmt.Fprintln(os.Stderr, "devgateway:", err)
		os.Exit(1)
	}
}

func run(listen, target, upstreams string, maxBody int64, expose bool, creds credentials.TransportCredentials) error {
	log, err := zap.NewProduction()
	if err != nil {
		return err
	}
	defer log.Sync()
	var allow []string
	for _, u := range strings.Split(upstreams, ",") {
		if u = strings.TrimSpace(u); u != "" {
			allow = append(allow, u)
		}
	}
	if len(allow) == 0 {
		return errors.New("-upstreams is required")
	}
	conn, err := dial(target, creds)
	if err != nil {
		return fmt.Errorf("dial %s: %w", target, err)
	}
	defer conn.Close()
	gw := gateway.New(extprocv3.NewExternalProcessorClient(conn),
		gateway.Config{Upstreams: allow, MaxRequestBytes: maxBody, ExposeServed: expose}, nil, log)
	srv := &http.Server{Addr: listen, Handler: gw, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("devgateway listening", zap.String("listen", listen), zap.String("extproc", target), zap.Strings("upstreams", allow))
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// dial connects to kvrouter: one address as given, or a comma list of replicas behind
// gRPC's round_robin balancer (a new stream per request, each on the next ready
// replica) with client-side health checks of the ext_proc service, which take a replica
// out of turn while it is unreachable or reports NOT_SERVING (draining, not ready), as
// Envoy's kvrouter cluster does with its gRPC health checks (envoy/envoy.yaml).
func dial(target string, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	var addrs []resolver.Address
	for _, a := range strings.Split(target, ",") {
		if a = strings.TrimSpace(a); a != "" {
			host, _, err := net.SplitHostPort(a)
			if err != nil {
				return nil, fmt.Errorf("-extproc %q: %w", a, err)
			}
			addrs = append(addrs, resolver.Address{Addr: a, ServerName: host})
		}
	}
	switch len(addrs) {
	case 0:
		return nil, errors.New("-extproc is required")
	case 1:
		return grpc.NewClient(addrs[0].Addr, grpc.WithTransportCredentials(creds))
	}
	r := manual.NewBuilderWithScheme("kvrouter-replicas")
	r.InitialState(resolver.State{Addresses: addrs})
	sc := fmt.Sprintf(`{"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": %q}}`,
		extprocv3.ExternalProcessor_ServiceDesc.ServiceName)
	return grpc.NewClient(r.Scheme()+":///kvrouter", grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(sc),
		grpc.WithTransportCredentials(creds))
}
