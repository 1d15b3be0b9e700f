// Command devgateway is a development stand-in for Envoy: an HTTP reverse proxy that asks
// kvrouter (over ext_proc, FULL_DUPLEX_STREAMED) where each request goes and proxies it to
// that endpoint when it is in the -upstreams allowlist. Not for production.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvrouter/kvrouter/gateway"
)

func main() {
	listen := flag.String("listen", ":8080", "HTTP listen address")
	extproc := flag.String("extproc", "127.0.0.1:9002", "kvrouter ext_proc gRPC address")
	upstreams := flag.String("upstreams", "", "comma-separated ip:port allowlist of upstream endpoints")
	maxBody := flag.Int64("max-request-bytes", gateway.DefaultMaxRequestBytes, "largest request body accepted")
	flag.Parse()
	if err := run(*listen, *extproc, *upstreams, *maxBody); err != nil {
		fmt.Fprintln(os.Stderr, "devgateway:", err)
		os.Exit(1)
	}
}

func run(listen, target, upstreams string, maxBody int64) error {
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
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", target, err)
	}
	defer conn.Close()
	gw := gateway.New(extprocv3.NewExternalProcessorClient(conn),
		gateway.Config{Upstreams: allow, MaxRequestBytes: maxBody}, nil, log)
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
