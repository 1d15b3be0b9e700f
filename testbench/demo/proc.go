package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvrouter/kvrouter/internal/freeport"
)

// ProcessOptions say where the binaries are and which gateway fronts kvrouter.
type ProcessOptions struct {
	// BinDir holds vllm-sim, kvrouter and devgateway (`make build`).
	BinDir string
	// Envoy is the envoy binary to run with EnvoyConfig; empty runs the dev gateway.
	Envoy       string
	EnvoyConfig string
	// WorkDir receives the generated configurations and each process's log.
	WorkDir string
	// peerProxies puts a peerProxy in front of each kvrouter replica's gossip port
	// (RunReplicaFaults' partitions).
	peerProxies bool
	// WithoutReplay is how many servers (the last ones) run without a replay socket,
	// vLLM's default: the fault suite's rows without replay inject on them.
	WithoutReplay int
}

// Processes starts the stack as child processes on 127.0.0.1: one vllm-sim per worker
// (KV events over ZeroMQ with a replay socket but on the last po.WithoutReplay, the
// model's tokenizer), kvrouter with a
// generated configuration, and Envoy (when po.Envoy is set) or the dev gateway. Ports are
// free ephemeral ports picked just before the processes start. Close stops every process
// (SIGTERM, then SIGKILL after 5 s); on Linux the children also die with this process.
func Processes(po ProcessOptions) Starter {
	return func(ctx context.Context, o *Options, policy string) (Stack, error) {
		s := &procStack{}
		if err := s.start(ctx, o, po, policy); err != nil {
			_ = s.Close()
			return nil, err
		}
		return s, nil
	}
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
	// how it was started, for respawn
	env  []string
	bin  string
	args []string
}

type procStack struct {
	procs                           []*proc
	gatewayURL, routerURL, debugURL string
	metrics                         []string
	routerConfig                    string // kvrouter's configuration file
	extproc                         string // kvrouter's ext_proc address
	routers                         []routerProc
	proxies                         []*peerProxy
	partition                       partition
	withoutReplay                   int // the last servers without a replay socket
	// stops records when stop last signalled each process, by name.
	stops map[string]time.Time
}

// hasReplay reports whether server i runs with a replay socket.
func (s *procStack) hasReplay(i int) bool { return i < len(s.metrics)-s.withoutReplay }

func (s *procStack) GatewayURL() string          { return s.gatewayURL }
func (s *procStack) EngineMetricsURLs() []string { return s.metrics }
func (s *procStack) RouterURL() string           { return s.routerURL }
func (s *procStack) DebugURL() string            { return s.debugURL }

// freePorts returns n distinct free loopback ports for the children (freeport: below
// the ephemeral range, so no connection of this process or a parallel test takes one
// before the child binds it).
func freePorts(n int) ([]int, error) { return freeport.List(n) }

// spawn starts bin with args, its output in logPath and env added to this process's
// environment.
// KillWorker kills simulated server i with SIGKILL, as a node or OOM kill would.
func (s *procStack) KillWorker(i int) error {
	name := fmt.Sprintf("vllm-sim %d", i)
	for _, p := range s.procs {
		if p.name == name {
			return p.cmd.Process.Kill()
		}
	}
	return fmt.Errorf("demo: no %s", name)
}

func (s *procStack) spawn(name, logPath string, env []string, bin string, args ...string) error {
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("demo: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{}), env: env, bin: bin, args: args}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	for i, q := range s.procs {
		if q.name == name {
			s.procs[i] = p // a respawn takes its predecessor's place
			return nil
		}
	}
	s.procs = append(s.procs, p)
	return nil
}

// find returns the named child, or nil.
func (s *procStack) find(name string) *proc {
	for _, p := range s.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// stop sends sig to the named child and waits (at most 10 s, then SIGKILL) until it exits.
func (s *procStack) stop(name string, sig syscall.Signal) error {
	p := s.find(name)
	if p == nil {
		return fmt.Errorf("demo: no process %q", name)
	}
	if s.stops == nil {
		s.stops = map[string]time.Time{}
	}
	s.stops[name] = time.Now()
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return nil
}

// respawn starts the named child again as it was first started (same arguments, same
// ports), its output in the old log's name + ".again".
func (s *procStack) respawn(name string) error {
	p := s.find(name)
	if p == nil {
		return fmt.Errorf("demo: no process %q", name)
	}
	return s.spawn(name, p.log+".again", p.env, p.bin, p.args...)
}

// pid returns the named child's process id (0 when unknown).
func (s *procStack) pid(name string) int {
	if p := s.find(name); p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// usage returns a reader of the named child's CPU time (user + system, all threads) and
// minor page faults.
func (s *procStack) usage(name string) func() (procUsage, error) {
	for _, p := range s.procs {
		if p.name == name {
			pid := p.cmd.Process.Pid
			return func() (procUsage, error) { return childUsage(pid) }
		}
	}
	return func() (procUsage, error) { return procUsage{}, fmt.Errorf("demo: no process %q", name) }
}

// exitError is a child that stopped before Close.
type exitError struct {
	name, log string
	err       error
	tail      []byte // the end of its log
}

func (e *exitError) Error() string {
	return fmt.Sprintf("demo: %s exited (%v); log %s ends:\n%s", e.name, e.err, e.log, e.tail)
}

// portTaken reports whether the child failed to bind a port: the ports were reserved and
// released before it started, and another process took one in between.
func (e *exitError) portTaken() bool { return bytes.Contains(e.tail, []byte("address already in use")) }

// exited reports (as an *exitError) a child that stopped before Close.
func (s *procStack) exited() error {
	for _, p := range s.procs {
		select {
		case <-p.done:
			tail, _ := os.ReadFile(p.log)
			if len(tail) > 800 {
				tail = tail[len(tail)-800:]
			}
			return &exitError{name: p.name, log: p.log, err: p.err, tail: tail}
		default:
		}
	}
	return nil
}

// startTries bounds the starts of a stack whose child lost a port to another process.
const startTries = 3

// startReady starts a stack and waits until it is ready; when a child exits because
// another process took one of its ports, it closes the stack and starts a new one (new
// ports) up to startTries times in all. Other errors are returned at once.
func startReady[S interface{ Close() error }](ctx context.Context, start func() (S, error), ready func(S) error,
	logf func(string, ...any)) (S, error) {
	var zero S
	for try := 1; ; try++ {
		st, err := start()
		if err == nil {
			if err = ready(st); err == nil {
				return st, nil
			}
			_ = st.Close()
		}
		var ee *exitError
		if !errors.As(err, &ee) || !ee.portTaken() || try == startTries || ctx.Err() != nil {
			return zero, err
		}
		logf("%s lost a port to another process (try %d of %d): starting again on new ports", ee.name, try, startTries)
	}
}

// Close stops the processes, the gateway first, and waits for all of them.
func (s *procStack) Close() error {
	var wg sync.WaitGroup
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		wg.Go(func() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		})
	}
	wg.Wait()
	for _, p := range s.proxies {
		_ = p.Close()
	}
	return nil
}

func (s *procStack) start(ctx context.Context, o *Options, po ProcessOptions, policy string) error {
	tokDir, err := filepath.Abs(o.TokenizerDir)
	if err != nil {
		return err
	}
	// Per worker: HTTP, events, replay; then extproc, health, metrics, gateway, envoy admin, debug.
	ports, err := freePorts(3*o.Workers + 6)
	if err != nil {
		return err
	}
	bin := func(name string) string { return filepath.Join(po.BinDir, name) }
	s.withoutReplay = po.WithoutReplay
	var servers []serverAddrs
	for i := range o.Workers {
		hp, ep, rp := ports[3*i], ports[3*i+1], ports[3*i+2]
		replay := fmt.Sprintf("tcp://127.0.0.1:%d", rp)
		if i >= o.Workers-po.WithoutReplay {
			replay = ""
		}
		ev, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
			"endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", ep), "replay_endpoint": replay, "bind": true})
		err := s.spawn(fmt.Sprintf("vllm-sim %d", i), filepath.Join(po.WorkDir, fmt.Sprintf("vllm-sim-%d-%s.log", i, policy)), nil, bin("vllm-sim"),
			"--host", "127.0.0.1", "--port", strconv.Itoa(hp), "--model", o.Model, "--tokenizer", tokDir,
			"--kv-events-config", string(ev), "--enable-prompt-tokens-details",
			"--kv-cache-bytes", strconv.FormatInt(o.KVBytes, 10), "--time-scale", strconv.FormatFloat(o.TimeScale, 'g', -1, 64),
			"--speed", strconv.FormatFloat(o.speed(i), 'g', -1, 64))
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", hp)
		servers = append(servers, serverAddrs{HTTP: addr, Events: fmt.Sprintf("tcp://127.0.0.1:%d", ep), Replay: replay})
		s.metrics = append(s.metrics, "http://"+addr+"/metrics")
	}
	base := 3 * o.Workers
	ext, health, metrics := fmt.Sprintf("127.0.0.1:%d", ports[base]), fmt.Sprintf("127.0.0.1:%d", ports[base+1]), fmt.Sprintf("127.0.0.1:%d", ports[base+2])
	gw, admin, debug := fmt.Sprintf("127.0.0.1:%d", ports[base+3]), ports[base+4], fmt.Sprintf("127.0.0.1:%d", ports[base+5])
	oc := *o
	oc.TokenizerDir = tokDir
	if err := s.startRouters(&oc, po, policy, servers, listenAddrs{extproc: ext, health: health, metrics: metrics, debug: debug}); err != nil {
		return err
	}
	s.gatewayURL = "http://" + gw
	if po.Envoy != "" {
		if len(s.routers) > 1 {
			return errors.New("demo: several kvrouter replicas run behind the dev gateway only")
		}
		src, err := os.ReadFile(po.EnvoyConfig)
		if err != nil {
			return err
		}
		var ups []string
		for _, sv := range servers {
			ups = append(ups, sv.HTTP)
		}
		y, err := envoyConfig(string(src), gw, ext, admin, ups...)
		if err != nil {
			return err
		}
		path := filepath.Join(po.WorkDir, "envoy-"+policy+".yaml")
		if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
			return err
		}
		return s.spawn("envoy", filepath.Join(po.WorkDir, "envoy-"+policy+".log"), nil, po.Envoy,
			"-c", path, "--disable-hot-restart", "--log-level", "warn")
	}
	var ups []string
	for _, sv := range servers {
		ups = append(ups, sv.HTTP)
	}
	return s.spawn("devgateway", filepath.Join(po.WorkDir, "devgateway-"+policy+".log"), nil, bin("devgateway"),
		"-listen", gw, "-extproc", s.extprocs(), "-upstreams", strings.Join(ups, ","), "-expose-served")
}

// envoyConfig points the repository's Envoy bootstrap at the demo's ports: the listener
// on gw (loopback), the admin port, the kvrouter cluster at ext (TLS, kvrouter's
// self-signed default), and, in a bootstrap whose vLLM cluster lists the pool's Service
// (override_host, envoy.yaml), that cluster at the servers ups; it keeps the
// served-endpoint response header for kvbench's servers-per-prefix column. Everything
// else (the header-stripping filter, ext_proc in FULL_DUPLEX_STREAMED, the retry policy)
// is used as shipped.
func envoyConfig(src, gw, ext string, admin int, ups ...string) (string, error) {
	const pool = "        - endpoint:\n            address:\n              socket_address: {address: vllm-pool, port_value: 8000}\n"
	if strings.Contains(src, pool) && len(ups) > 0 {
		var b strings.Builder
		for _, u := range ups {
			h, p, _ := net.SplitHostPort(u)
			fmt.Fprintf(&b, "        - endpoint:\n            address:\n              socket_address: {address: %s, port_value: %s}\n", h, p)
		}
		src = strings.Replace(src, pool, b.String(), 1)
	}
	gwHost, gwPort, _ := net.SplitHostPort(gw)
	extHost, extPort, _ := net.SplitHostPort(ext)
	for _, r := range []struct{ old, new string }{
		{"{address: 127.0.0.1, port_value: 9901}", fmt.Sprintf("{address: 127.0.0.1, port_value: %d}", admin)},
		{"{address: 0.0.0.0, port_value: 8081}", fmt.Sprintf("{address: %s, port_value: %s}", gwHost, gwPort)},
		{"{address: kvrouter, port_value: 9002}", fmt.Sprintf("{address: %s, port_value: %s}", extHost, extPort)},
		{`handle:headers():remove("x-gateway-destination-endpoint-served")`, "-- kvdemo keeps the served endpoint: kvbench counts servers per prefix"},
	} {
		if !strings.Contains(src, r.old) {
			return "", errors.New("demo: envoy config: " + r.old + " not found; the bootstrap changed shape")
		}
		src = strings.Replace(src, r.old, r.new, 1)
	}
	return src, nil
}

// envoyConfigFile rewrites the bootstrap at path with placeholder ports (for checks).
func envoyConfigFile(path string) (string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return envoyConfig(string(src), "127.0.0.1:1", "127.0.0.1:2", 3, "127.0.0.1:4", "127.0.0.1:5")
}
