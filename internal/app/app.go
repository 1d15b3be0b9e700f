package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"golang.org/x/net/netutil"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/utils/clock"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/discovery"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/peersync"
	"github.com/kvrouter/kvrouter/policy"
	"github.com/kvrouter/kvrouter/tlscert"
)

// Health service names.
const (
	// ExtProcService is the service name Envoy's gRPC health check of the ext_proc
	// cluster asks for.
	ExtProcService = "envoy.service.ext_proc.v3.ExternalProcessor"
	// LivenessService is SERVING on the probe port for as long as the process runs.
	LivenessService = "liveness"
	// ReadinessService (and "") is SERVING on the probe port while at least one endpoint
	// is eligible and the router is not draining. The port opens once New has loaded
	// every configured model's tokenizer (or found it unsupported: routed by load), so
	// readiness never precedes the tokenizers.
	ReadinessService = "readiness"
	// InferenceExtensionService is SERVING on the probe port from the start of Run until
	// the drain starts, whatever the fleet's state: the name the Inference Extension's
	// chart (without leader election), llm-d's and Dynamo's operators give both probes of
	// their endpoint picker, which answers it SERVING once its pool is synced, endpoints
	// or none. kvrouter's port opens only after start-up, so a deployment written for that
	// picker runs kvrouter unchanged, and a fleet with no eligible endpoint never fails
	// its liveness probe (a restart would not bring an endpoint back).
	InferenceExtensionService = "inference-extension"
)

// Options are the App's collaborators; every field may be left zero.
type Options struct {
	// Logger receives the service's logs. Nil: no logs.
	Logger *zap.Logger
	// Registry receives every metric and is served on /metrics. Nil: a new registry with
	// the Go and process collectors.
	Registry *prometheus.Registry
	// Now is the clock. Nil: time.Now.
	Now func() time.Time
	// HTTPClient scrapes the endpoints' /metrics. Nil: a default client.
	HTTPClient *http.Client
	// Tokenizer gives requests their prompt token ids. Nil: the tokenizers and chat
	// templates of the configuration's models section (none: requests are routed without
	// tokens, by load).
	Tokenizer extproc.Tokenizer
	// Rand feeds the random policy. Nil: seeded from the clock.
	Rand rand.Source
	// KubeClients are the Kubernetes API clients of discovery.kubernetes. Nil: built
	// from the configuration (in-cluster service account, or its kubeconfig).
	KubeClients *kdisc.Clients
	// Resolver resolves discovery.dns names. Nil: net.DefaultResolver.
	Resolver discovery.Resolver
	// Clock drives discovery's intervals and grace periods, the configuration file's
	// change checks and the drain delay. Nil: the real clock.
	Clock clock.WithTicker
	// ConfigPath is the file the configuration was loaded from: Reload reads it again,
	// and Run checks it for changes every ConfigCheckInterval. Empty: no reload.
	ConfigPath string
	// ConfigCheckInterval is how often Run looks at ConfigPath's identity, modification
	// time and size. 0: DefaultConfigCheckInterval; negative: never (Reload only).
	ConfigCheckInterval time.Duration
	// SoftMemoryLimit makes Run keep the Go runtime's soft memory limit at 2x the live
	// heap + limits.body_budget_bytes (never above GOMEMLIMIT; see memLimiter). The
	// command sets it; tests running several Apps in one process leave it off, as the
	// limit is the process's.
	SoftMemoryLimit bool
}

// Addrs are the addresses the App listens on (resolved, so port 0 becomes a real port).
// Debug is empty when listen.debug is.
type Addrs struct {
	ExtProc, Health, Metrics, Debug string
}

// App is one kvrouter service instance.
type App struct {
	cfg     *config.Config
	log     *zap.Logger
	reg     *prometheus.Registry
	fleet   *fleet.Fleet
	extproc *extproc.Server
	kv      *kvPath
	// policies is the one list of routing policies (policy.Builtin), built once.
	policies *policy.Registry
	// softMemLimit: Run keeps the soft memory limit (Options.SoftMemoryLimit).
	softMemLimit bool
	// pols are the policy and the fallback (which routes requests without token ids or a
	// known model) in force; a reload swaps them.
	pols atomic.Pointer[policies]
	// policyReg takes the policies' metrics: a policy rebuilt by a reload replaces its
	// predecessor's collectors (its counters start again from 0).
	policyReg prometheus.Registerer
	rand      rand.Source
	// live is the configuration in force: New's, with a reload's live sections applied.
	live   atomic.Pointer[config.Config]
	reload *reloader
	tok    extproc.Tokenizer
	// now is the injected clock (time.Now when none is given).
	now func() time.Time
	// clock times the drain delay (Options.Clock; the real clock when none is given).
	clock     clock.WithTicker
	discovery runner // nil without discovery
	// replica and peers share in-flight state with other kvrouter replicas (nil
	// without replicas.peers).
	replica *peersync.Replica
	peers   *peersync.Node

	extGRPC    *grpc.Server // ext_proc + health for Envoy
	probeGRPC  *grpc.Server // health for Kubernetes
	extHealth  *health.Server
	probeHlth  *health.Server
	httpServer *http.Server
	debugHTTP  *http.Server    // nil without listen.debug
	tls        *tlscert.Source // nil with listen.tls.mode disabled

	draining atomic.Bool
	healthMu sync.Mutex // orders health updates

	lnExt, lnProbe, lnHTTP, lnDebug net.Listener
}

// New builds the service from a validated configuration; it starts nothing.
func New(cfg *config.Config, o Options) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("app: invalid configuration: %w", err)
	}
	a := &App{cfg: cfg, log: o.Logger, reg: o.Registry, now: o.Now, policies: policy.Builtin(), softMemLimit: o.SoftMemoryLimit}
	a.live.Store(cfg)
	if a.now == nil {
		a.now = time.Now
	}
	if a.clock = o.Clock; a.clock == nil {
		a.clock = clock.RealClock{}
	}
	if a.log == nil {
		a.log = zap.NewNop()
	}
	if a.reg == nil {
		a.reg = prometheus.NewRegistry()
		a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	a.policyReg = replacingRegisterer{a.reg}
	a.reload = newReloader(o, a.reg)
	f, err := fleet.New(cfg.Fleet(), fleet.Options{
		Logger:     a.log.Named("fleet"),
		Registerer: a.reg,
		Now:        o.Now,
		Client:     o.HTTPClient,
		PoolName:   poolName(cfg),
	})
	if err != nil {
		return nil, fmt.Errorf("app: %w", err)
	}
	a.fleet = f
	if a.kv, err = newKVPath(cfg, f, a.log.Named("kv"), a.reg, o.Now); err != nil {
		return nil, err
	}
	if a.discovery, err = newDiscovery(cfg.Discovery, f, o, a.log, a.reg); err != nil {
		return nil, err
	}
	a.reg.MustRegister(newExtensionInfo(), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvrouter_ready",
		Help: "1 while at least one endpoint is eligible and the router is not draining.",
	}, func() float64 {
		if a.ready() {
			return 1
		}
		return 0
	}))

	a.extHealth = health.NewServer()
	a.probeHlth = health.NewServer()
	// In BUFFERED mode Envoy sends the whole body in one message: allow the largest body
	// kvrouter reads plus room for headers, so that it arrives rather than failing the
	// stream (gRPC's default limit is 4 MiB).
	// limits.max_streams is also each connection's HTTP/2 stream limit, so a gateway
	// opens another connection rather than have streams refused.
	extOpts := append(extproc.ServerOptions(), grpc.MaxRecvMsgSize(cfg.Limits.MaxBodyBytes+1<<20),
		grpc.MaxConcurrentStreams(uint32(cfg.Limits.MaxStreams)))
	if cfg.Listen.TLS.Enabled() {
		// The ext_proc port, and the health service Envoy checks on it, speak TLS.
		if a.tls, err = tlscert.New(cfg.Listen.TLS, tlscert.Options{Logger: a.log.Named("tls"), Registerer: a.reg, Now: o.Now}); err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
		// A connection that never finishes its handshake holds one of limits.max_connections:
		// give it 10 s (gRPC's default is 120 s), ample for a gateway on the same network.
		extOpts = append(extOpts, grpc.Creds(credentials.NewTLS(a.tls.ServerConfig())), grpc.ConnectionTimeout(10*time.Second))
	} else {
		a.log.Warn("listen.tls.mode is disabled: the ext_proc port serves plaintext gRPC")
	}
	a.extGRPC = grpc.NewServer(extOpts...)
	healthpb.RegisterHealthServer(a.extGRPC, a.extHealth)
	if err := a.registerExtProc(o); err != nil {
		return nil, err
	}
	if err := a.newReplicas(); err != nil {
		return nil, err
	}
	a.probeGRPC = grpc.NewServer()
	healthpb.RegisterHealthServer(a.probeGRPC, a.probeHlth)

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", a.serveReadyz)
	a.httpServer = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if cfg.Listen.Debug != "" {
		// The debug views and Go's profiles tell the fleet's layout, the index's content
		// and the command line: on their own port, loopback by default.
		dbg := http.NewServeMux()
		dbg.HandleFunc("GET /debug/endpoints", a.serveEndpoints)
		dbg.HandleFunc("GET /debug/kv", a.serveDebugKV)
		dbg.HandleFunc("GET /debug/replicas", a.serveDebugReplicas)
		dbg.HandleFunc("GET /debug/objectives", a.serveDebugObjectives)
		dbg.HandleFunc("GET /debug/rewrites", a.serveDebugRewrites)
		dbg.HandleFunc("POST /debug/route", a.serveDebugRoute)
		dbg.HandleFunc("GET /debug/pprof/", pprof.Index)
		dbg.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		dbg.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		dbg.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		dbg.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
		a.debugHTTP = &http.Server{Handler: dbg, ReadHeaderTimeout: 10 * time.Second}
	}

	a.updateHealth()
	return a, nil
}

// Fleet returns the endpoint registry, for discovery to add and remove endpoints.
func (a *App) Fleet() *fleet.Fleet { return a.fleet }

// Listen binds the three listeners and returns their addresses. Run calls it when it has
// not been called; call it first to learn the ports chosen for port 0.
func (a *App) Listen() (Addrs, error) {
	if a.lnExt == nil {
		var err error
		l := a.cfg.Listen
		if a.lnExt, err = net.Listen("tcp", l.ExtProc); err != nil {
			return Addrs{}, fmt.Errorf("app: listen extproc: %w", err)
		}
		// Connections past limits.max_connections wait in the kernel's backlog instead of
		// taking the descriptors the admin port, KV events and scrapes need.
		a.lnExt = netutil.LimitListener(a.lnExt, a.cfg.Limits.MaxConnections)
		if a.lnProbe, err = net.Listen("tcp", l.Health); err != nil {
			a.lnExt.Close()
			return Addrs{}, fmt.Errorf("app: listen health: %w", err)
		}
		if a.lnHTTP, err = net.Listen("tcp", l.Metrics); err != nil {
			a.lnExt.Close()
			a.lnProbe.Close()
			return Addrs{}, fmt.Errorf("app: listen metrics: %w", err)
		}
		if l.Debug != "" {
			if a.lnDebug, err = net.Listen("tcp", l.Debug); err != nil {
				a.lnExt.Close()
				a.lnProbe.Close()
				a.lnHTTP.Close()
				return Addrs{}, fmt.Errorf("app: listen debug: %w", err)
			}
		}
	}
	addrs := Addrs{ExtProc: a.lnExt.Addr().String(), Health: a.lnProbe.Addr().String(), Metrics: a.lnHTTP.Addr().String()}
	if a.lnDebug != nil {
		addrs.Debug = a.lnDebug.Addr().String()
	}
	return addrs, nil
}

// Run serves until ctx ends, then drains: health turns NOT_SERVING, new ext_proc
// streams are still taken for limits.drain_delay, then none is accepted, streams in flight run to their end (at most limits.drain_timeout),
// and Run returns nil. It returns an error when a server fails.
func (a *App) Run(ctx context.Context) error {
	addrs, err := a.Listen()
	if err != nil {
		return err
	}
	unsubscribe := a.fleet.Subscribe(func(fleet.Change) { a.updateHealth() })
	defer unsubscribe()
	a.updateHealth()
	a.probeHlth.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	ref, commit := buildInfo()
	a.log.Info("kvrouter serving", zap.String("version", ref), zap.String("commit", commit), zap.String("extproc", addrs.ExtProc), zap.Bool("extproc_tls", a.tls != nil),
		zap.String("health", addrs.Health), zap.String("metrics", addrs.Metrics), zap.String("debug", addrs.Debug),
		zap.Int("endpoints", len(a.cfg.Endpoints)))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return a.fleet.Run(gctx) })
	g.Go(func() error { return a.kv.run(gctx) })
	if a.discovery != nil {
		g.Go(func() error { return a.discovery.Run(gctx) })
	}
	if a.reload.path != "" && a.reload.interval > 0 {
		g.Go(func() error { a.watchConfig(gctx); return nil })
	}
	if a.peers != nil {
		g.Go(func() error { return a.peers.Run(gctx) })
	}
	if a.softMemLimit {
		m := newMemLimiter(a.cfg.Limits.BodyBudgetBytes)
		g.Go(func() error { m.run(gctx); return nil })
	}
	g.Go(func() error { return serveGRPC(a.extGRPC, a.lnExt, "extproc") })
	g.Go(func() error { return serveGRPC(a.probeGRPC, a.lnProbe, "health") })
	g.Go(func() error {
		if err := a.httpServer.Serve(a.lnHTTP); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("app: metrics server: %w", err)
		}
		return nil
	})
	if a.debugHTTP != nil {
		g.Go(func() error {
			if err := a.debugHTTP.Serve(a.lnDebug); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("app: debug server: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		a.drain()
		return nil
	})
	return g.Wait()
}

// serveGRPC serves s on l until the drain stops it. A drain that stops s before Serve
// began (a shutdown right after the start) is a normal end too: Serve then closes l and
// returns grpc.ErrServerStopped.
func serveGRPC(s *grpc.Server, l net.Listener, name string) error {
	if err := s.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("app: %s server: %w", name, err)
	}
	return nil
}

// drain stops the servers: Envoy and the probes first see NOT_SERVING, then the
// ext_proc server stops taking streams and waits for those in flight.
func (a *App) drain() {
	start := time.Now()
	a.draining.Store(true)
	a.updateHealth()
	if delay := a.live.Load().Limits.DrainDelay; delay > 0 {
		// Health says NOT_SERVING; streams are still taken until the gateways have
		// seen it (limits.drain_delay), so a rollout fails no request.
		a.log.Info("draining: not serving; still taking streams", zap.Duration("drain_delay", delay))
		<-a.clock.After(delay)
	}
	a.extproc.Drain()
	timeout := a.live.Load().Limits.DrainTimeout
	a.log.Info("draining", zap.Duration("timeout", timeout))

	done := make(chan struct{})
	go func() {
		a.extGRPC.GracefulStop()
		close(done)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		a.log.Warn("drain timeout: cutting the streams still open")
		a.extGRPC.Stop()
		<-done
	}
	a.probeGRPC.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = a.httpServer.Shutdown(ctx)
	if a.debugHTTP != nil {
		_ = a.debugHTTP.Shutdown(ctx)
	}
	a.log.Info("drained", zap.Duration("took", time.Since(start)))
}

func (a *App) ready() bool { return !a.draining.Load() && a.fleet.Ready() }

// updateHealth sets every readiness-tracking health service from the fleet's state.
func (a *App) updateHealth() {
	a.healthMu.Lock()
	defer a.healthMu.Unlock()
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if a.ready() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	a.extHealth.SetServingStatus(ExtProcService, st)
	a.extHealth.SetServingStatus("", st)
	a.probeHlth.SetServingStatus(ReadinessService, st)
	a.probeHlth.SetServingStatus("", st)
	// The Inference Extension's endpoint picker answers the ext_proc service name on its
	// health port too (a gateway or probe configured for it checks there).
	a.probeHlth.SetServingStatus(ExtProcService, st)
	started := healthpb.HealthCheckResponse_SERVING
	if a.draining.Load() {
		started = healthpb.HealthCheckResponse_NOT_SERVING
	}
	a.probeHlth.SetServingStatus(InferenceExtensionService, started)
}

func (a *App) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	switch {
	case a.draining.Load():
		http.Error(w, "draining", http.StatusServiceUnavailable)
	case !a.fleet.Ready():
		http.Error(w, "no eligible endpoint", http.StatusServiceUnavailable)
	default:
		_, _ = w.Write([]byte("ok\n"))
	}
}

// serveEndpoints shows the registry, for operators.
func (a *App) serveEndpoints(w http.ResponseWriter, _ *http.Request) {
	type ep struct {
		Address   string   `json:"address"`
		Models    []string `json:"models"`
		State     string   `json:"state"`
		InFlight  int      `json:"in_flight"`
		Failures  int      `json:"scrape_failures"`
		Valid     bool     `json:"metrics_valid"`
		Running   int      `json:"running"`
		Waiting   int      `json:"waiting"`
		KVUsage   float64  `json:"kv_cache_usage"`
		ScrapedAt string   `json:"scraped_at,omitempty"`
	}
	var out []ep
	for _, s := range a.fleet.Status() {
		e := ep{Address: s.Config.Address, Models: s.Config.Models, State: s.State.String(), InFlight: s.InFlight,
			Failures: s.Failures, Valid: s.Metrics.Valid, Running: s.Metrics.Running, Waiting: s.Metrics.Waiting,
			KVUsage: s.Metrics.KVCacheUsage}
		if !s.ScrapedAt.IsZero() {
			e.ScrapedAt = s.ScrapedAt.UTC().Format(time.RFC3339Nano)
		}
		out = append(out, e)
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}
