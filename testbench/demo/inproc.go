package demo

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/testbench/gateway"
	"github.com/kvrouter/kvrouter/testbench/sim"
	"github.com/kvrouter/kvrouter/testbench/sim/server"
	"github.com/kvrouter/kvrouter/tlscert"
)

// InProcess starts the stack inside this process: each simulated server, kvrouter's App
// and the dev gateway run as goroutines behind real loopback sockets (HTTP, ZeroMQ,
// gRPC), so every byte crosses the same protocols as between processes. dir receives
// the generated configuration.
func InProcess(dir string, log *zap.Logger) Starter {
	if log == nil {
		log = zap.NewNop()
	}
	return func(ctx context.Context, o *Options, policy string) (Stack, error) {
		s := &inproc{}
		ctx, s.cancel = context.WithCancel(ctx)
		if err := s.start(ctx, o, policy, dir, log); err != nil {
			_ = s.Close()
			return nil, err
		}
		return s, nil
	}
}

type inproc struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	errMu   sync.Mutex
	err     error
	closers []func()

	gatewayURL, routerURL, debugURL string
	metrics                         []string
}

func (s *inproc) GatewayURL() string          { return s.gatewayURL }
func (s *inproc) EngineMetricsURLs() []string { return s.metrics }
func (s *inproc) RouterURL() string           { return s.routerURL }
func (s *inproc) DebugURL() string            { return s.debugURL }

func (s *inproc) goRun(name string, f func() error) {
	s.wg.Go(func() {
		if err := f(); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, http.ErrServerClosed) {
			s.errMu.Lock()
			if s.err == nil {
				s.err = fmt.Errorf("demo: %s: %w", name, err)
			}
			s.errMu.Unlock()
		}
	})
}

// Close stops every server and waits for them.
func (s *inproc) Close() error {
	s.cancel()
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.wg.Wait()
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

func (s *inproc) serveHTTP(name string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	s.goRun(name, func() error { return hs.Serve(ln) })
	s.closers = append(s.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	return ln.Addr().String(), nil
}

func (s *inproc) start(ctx context.Context, o *Options, policy, dir string, log *zap.Logger) error {
	if o.routers() > 1 {
		return errors.New("demo: several kvrouter replicas run as processes only")
	}
	b := o.Prompt
	if b == nil {
		var err error
		if b, err = prompt.LoadDir(o.TokenizerDir, prompt.LoadOptions{}); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
	}
	var servers []serverAddrs
	for i := range o.Workers {
		cfg := server.DefaultConfig()
		cfg.Model = o.Model
		cfg.TimeScale = o.TimeScale
		cfg.EnablePromptTokensDetails = true
		cfg.Engine.NumGPUBlocks = sim.Qwen3_0_6B.NumBlocks(o.KVBytes, cfg.Engine.BlockSize)
		cfg.Engine.HashSeed = randomSeed()
		cfg.Engine.Speed = o.speed(i)
		cfg.KVEvents.EnableKVCacheEvents = true
		cfg.KVEvents.Endpoint = "tcp://127.0.0.1:0"
		cfg.KVEvents.Bind = true
		cfg.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
		srv, err := server.New(cfg, server.Options{Logger: log.Named(fmt.Sprintf("sim%d", i)), Tokenizer: b, Chat: b})
		if err != nil {
			return err
		}
		s.goRun("vllm-sim", func() error { return srv.Run(ctx) })
		pub, replay, err := srv.PublisherAddr(ctx, 0)
		if err != nil {
			return err
		}
		addr, err := s.serveHTTP("vllm-sim", srv.Handler())
		if err != nil {
			return err
		}
		servers = append(servers, serverAddrs{HTTP: addr, Events: "tcp://" + strings.TrimPrefix(pub, "tcp://"),
			Replay: "tcp://" + strings.TrimPrefix(replay, "tcp://")})
		s.metrics = append(s.metrics, "http://"+addr+"/metrics")
	}

	path := filepath.Join(dir, "kvrouter-"+policy+".yaml")
	if err := os.WriteFile(path, routerConfig(o, servers, policy, listenAddrs{extproc: "127.0.0.1:0", health: "127.0.0.1:0", metrics: "127.0.0.1:0", debug: "127.0.0.1:0"}), 0o644); err != nil {
		return err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	// The router tokenizes with the same loaded files as the servers (loading them once per
	// stack instead of twice is what keeps the test fast under -race); the configuration's
	// models section still names them, as in production.
	a, err := app.New(cfg, app.Options{Logger: log.Named("kvrouter"), Tokenizer: modelTokenizer{o.Model, b}})
	if err != nil {
		return err
	}
	addrs, err := a.Listen()
	if err != nil {
		return err
	}
	s.routerURL, s.debugURL = "http://"+addrs.Metrics, "http://"+addrs.Debug
	s.goRun("kvrouter", func() error { return a.Run(ctx) })

	// The gateway speaks TLS to kvrouter's self-signed default without verifying it, as
	// NGINX Gateway Fabric does by default.
	tc, err := tlscert.ClientConfig{}.TLS()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addrs.ExtProc, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return err
	}
	var allow []string
	for _, sv := range servers {
		allow = append(allow, sv.HTTP)
	}
	gw := gateway.New(extprocv3.NewExternalProcessorClient(conn), gateway.Config{Upstreams: allow, ExposeServed: true}, nil, log.Named("gateway"))
	gaddr, err := s.serveHTTP("gateway", gw)
	if err != nil {
		conn.Close()
		return err
	}
	s.closers = append(s.closers, func() { conn.Close() })
	s.gatewayURL = "http://" + gaddr
	return nil
}

func randomSeed() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// modelTokenizer serves one model's prompt ids (extproc.Tokenizer).
type modelTokenizer struct {
	model string
	b     *prompt.Builder
}

func (m modelTokenizer) PromptTokens(req *openai.Request, base string) ([]uint32, error) {
	if base != m.model {
		return nil, &prompt.UnknownModelError{Model: base}
	}
	return m.b.PromptTokens(req)
}
