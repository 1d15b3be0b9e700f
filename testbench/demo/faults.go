package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvrouter/kvrouter/testbench/kvbench"
	"github.com/kvrouter/kvrouter/tlscert"
)

// FaultOptions size the fault suite. Options describe the stack (one policy: the first
// of Options.Policies) and the load sent during each fault.
type FaultOptions struct {
	Options
	Process ProcessOptions
	// IdleStreams ext_proc streams are opened and held without a message.
	IdleStreams int
	// Conns raw TCP connections are opened to the ext_proc port; the suite lowers it to
	// what this process's open-file limit allows (FaultResult.Note says so).
	Conns int
	// Bodies parallel chat bodies of BodyBytes each are sent through the gateway.
	Bodies, BodyBytes int
	// Down is how long a killed process stays down before it is started again.
	Down time.Duration
	// DropBatches KV-event batches are dropped in the rows that drop events.
	DropBatches int
}

// DefaultFaultOptions is `make faults`: the sizes on 3 servers.
func DefaultFaultOptions() FaultOptions {
	o := DefaultOptions()
	o.Workers, o.Policies, o.Requests, o.Concurrency, o.Prefixes = 3, []string{"kv"}, 48, 4, 6
	// Two fallbacks, as kvrouter's limits.max_fallbacks recommends behind a gateway that
	// retries a failed connect on the next listed endpoint (the dev gateway does).
	o.MaxFallbacks = 2
	return FaultOptions{Options: o, IdleStreams: 5000, Conns: 20000, Bodies: 24, BodyBytes: 15 << 20, Down: time.Second,
		DropBatches: 5, Process: ProcessOptions{WithoutReplay: 1}}
}

// ShortFaultOptions is the version run inside `make test` (well under a minute).
func ShortFaultOptions() FaultOptions {
	f := DefaultFaultOptions()
	f.Requests, f.Prefixes, f.IdleStreams, f.Conns, f.Bodies, f.BodyBytes, f.Down = 12, 3, 200, 500, 4, 2<<20, 300*time.Millisecond
	f.DropBatches = 2
	return f
}

// Causes of a failed request that the router did not cause (FaultResult.FailedBy).
const (
	// CauseRouterDown: the fault stopped kvrouter, and the gateway could not reach it
	// (the dev gateway's "ext_proc unavailable": kvrouter draining, down, or not yet
	// reconnected to).
	CauseRouterDown = "kvrouter down"
	// CausePodKilled: sent before the fault killed a server; the server was answering
	// it when it died, and a response already under way cannot be retried elsewhere.
	CausePodKilled = "pod killed mid-request"
)

// FaultResult is one fault's row.
type FaultResult struct {
	Fault string `json:"fault"`
	// Requests were sent through the gateway while the fault was injected; Failed of them
	// did not get a 200. FailedBy counts those a cause other than the router explains
	// (CauseRouterDown, CausePodKilled); FailedRouter is the rest, the router's own
	// (goal 0). RouterDown: the fault stops kvrouter itself.
	Requests     int            `json:"requests"`
	Failed       int            `json:"failed"`
	FailedRouter int            `json:"failed_router"`
	FailedBy     map[string]int `json:"failed_by,omitempty"`
	RouterDown   bool           `json:"router_down"`
	// InjectMS is how long the injection took (from its start to its end: a kill and
	// restart, a stall, a flood held). KVAwareAfterMS is the time from the end of the
	// injection, KVAwareFromStartMS from its start, until routing is KV-aware again:
	// every endpoint's KV events connected (after any rebuild from replay) and healthy in
	// kvrouter's /debug/kv, and caught up with the server's events (its last sequence
	// number applied is the last the server numbered, where kvrouter has applied any
	// since connecting or has a replay socket to rebuild from). -1: not within the
	// suite's 30 s bound.
	InjectMS           float64 `json:"inject_ms"`
	KVAwareAfterMS     float64 `json:"kv_aware_after_ms"`
	KVAwareFromStartMS float64 `json:"kv_aware_from_start_ms"`
	// PeakRSSMB and PeakGoroutines are kvrouter's, sampled every 100 ms from its /metrics.
	PeakRSSMB      float64 `json:"peak_rss_mb"`
	PeakGoroutines int     `json:"peak_goroutines"`
	// DivergenceBlocks is, after the fault and its load, the sum over the servers of the
	// difference between the blocks kvrouter's index holds for the server (/debug/kv
	// indexed_blocks) and the distinct blocks the server's prefix cache holds (vllm-sim's
	// /debug/cache); nil: not measured (a view could not be read). DivergenceByServer is
	// that difference per server (index minus cache), in server order.
	DivergenceBlocks   *int   `json:"divergence_blocks"`
	DivergenceByServer []int  `json:"divergence_by_server,omitempty"`
	Note               string `json:"note,omitempty"`
}

// FaultReport is what `kvdemo faults --json` writes (docs/data/faults.json).
type FaultReport struct {
	// The stack and the load sent during each fault.
	Workers     int    `json:"workers"`
	Requests    int    `json:"requests_per_fault"`
	Concurrency int    `json:"concurrency"`
	Policy      string `json:"policy"`
	Short       bool   `json:"short"`
	// OpenFileLimit is the suite's own open-file limit (raised to its hard limit), which
	// bounds the TCP connections it can open.
	OpenFileLimit int `json:"open_file_limit"`
	// WithoutReplay is how many servers (the last ones) run without a replay socket.
	WithoutReplay int           `json:"servers_without_replay"`
	Rows          []FaultResult `json:"rows"`
}

// OpenFileLimit returns this process's open-file limit (soft), after raising it to the hard
// limit as the TCP-connection fault does.
func OpenFileLimit() int {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return 0
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	return int(lim.Cur)
}

// fault is one injection: it runs while the load runs, and returns a note.
type fault struct {
	name       string
	routerDown bool
	inject     func(ctx context.Context, s *procStack) (note string, err error)
}

// RunFaults starts one stack and injects each fault in turn under load, returning one
// row per fault. Every loop is bounded; all traffic goes to 127.0.0.1.
func RunFaults(ctx context.Context, fo FaultOptions) (_ []FaultResult, err error) {
	o := &fo.Options
	w, _, err := o.workload()
	if err != nil {
		return nil, err
	}
	s, target, err := startFaultStack(ctx, o, fo.Process, o.Policies[0])
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := s.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	var out []FaultResult
	for _, f := range faults(fo) {
		// The stack as at start (the gateway reconnected to a restarted kvrouter, every
		// server answering) before the next fault, so that no fault is charged with the
		// previous one's recovery.
		if err := waitReady(ctx, s, o.Workers, 60*time.Second); err != nil {
			return out, fmt.Errorf("demo: before fault %s: %w", f.name, err)
		}
		if err := waitGateway(ctx, s.GatewayURL(), o.Model, 60*time.Second); err != nil {
			return out, fmt.Errorf("demo: before fault %s: %w", f.name, err)
		}
		if reset, err := resetDiverged(ctx, s); err != nil {
			return out, fmt.Errorf("demo: before fault %s: %w", f.name, err)
		} else if len(reset) > 0 {
			o.logf("fault: servers %v reset (their index entries differed from their caches)", reset)
		}
		o.logf("fault: %s", f.name)
		r, err := runFault(ctx, s, target, w, o.Concurrency, f)
		if err != nil {
			return out, fmt.Errorf("demo: fault %s: %w", f.name, err)
		}
		o.logf("fault: %s: %d/%d failed (%d by the router), KV-aware after %.0f ms (%.0f from the start), peak RSS %.0f MB, %d goroutines, divergence %v",
			f.name, r.Failed, r.Requests, r.FailedRouter, r.KVAwareAfterMS, r.KVAwareFromStartMS, r.PeakRSSMB, r.PeakGoroutines, r.DivergenceByServer)
		out = append(out, r)
	}
	return out, nil
}

// startFaultStack starts a stack of processes, waits until every server answers through
// the gateway, and returns it with a kvbench target on the gateway; the caller closes it.
func startFaultStack(ctx context.Context, o *Options, po ProcessOptions, policy string) (*procStack, *kvbench.HTTPTarget, error) {
	start := Processes(po)
	st, err := startReady(ctx, func() (Stack, error) { return start(ctx, o, policy) },
		func(st Stack) error { return waitReady(ctx, st, o.Workers, 60*time.Second) }, o.logf)
	if err != nil {
		return nil, nil, err
	}
	s := st.(*procStack)
	target, err := kvbench.NewHTTPTarget(kvbench.HTTPConfig{URL: s.GatewayURL(), Model: o.Model, IgnoreEOS: true, Timeout: time.Minute})
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, target, nil
}

func runFault(ctx context.Context, s *procStack, target *kvbench.HTTPTarget, w *kvbench.Workload, conc int, f fault) (FaultResult, error) {
	r := FaultResult{Fault: f.name, RouterDown: f.routerDown, KVAwareAfterMS: -1, KVAwareFromStartMS: -1}
	sctx, stopSampling := context.WithCancel(ctx)
	var sampled sync.WaitGroup
	sampled.Go(func() { r.PeakRSSMB, r.PeakGoroutines = samplePeaks(sctx, s.RouterURL()) })

	type loadOut struct {
		run kvbench.RunOutput
		err error
	}
	load := make(chan loadOut, 1)
	loadStart := time.Now()
	go func() {
		run, err := target.Run(ctx, w, conc, nil)
		load <- loadOut{run, err}
	}()
	started := time.Now()
	note, err := f.inject(ctx, s)
	injected := time.Now()
	r.InjectMS = ms(injected.Sub(started))
	if err != nil {
		stopSampling()
		<-load
		sampled.Wait()
		return r, err
	}
	r.Note = note
	if waitKVAware(ctx, s, 30*time.Second) {
		r.KVAwareAfterMS, r.KVAwareFromStartMS = ms(time.Since(injected)), ms(time.Since(started))
	}
	lo := <-load
	stopSampling()
	sampled.Wait()
	if lo.err != nil {
		return r, lo.err
	}
	if d, by, ok := divergence(ctx, s, 3*time.Second); ok {
		r.DivergenceBlocks, r.DivergenceByServer = &d, by
	}
	stops := map[string]stopped{}
	for name, at := range s.stops {
		if !at.Before(started) {
			stops[name] = stopped{at: at}
		}
	}
	for i, m := range s.metrics {
		if st, ok := stops[fmt.Sprintf("vllm-sim %d", i)]; ok {
			st.addr = strings.TrimSuffix(strings.TrimPrefix(m, "http://"), "/metrics")
			stops[fmt.Sprintf("vllm-sim %d", i)] = st
		}
	}
	first := ""
	for _, res := range lo.run.Results {
		r.Requests++
		if res.Err == "" {
			continue
		}
		r.Failed++
		if cause := failureCause(res, loadStart.Add(res.Start), stops); cause != "" {
			if r.FailedBy == nil {
				r.FailedBy = map[string]int{}
			}
			r.FailedBy[cause]++
			continue
		}
		r.FailedRouter++
		if first == "" {
			first = res.Err
		}
	}
	if first != "" {
		r.Note = strings.TrimPrefix(r.Note+"; first failure the router caused: "+first, "; ")
	}
	return r, nil
}

// stopped is a process the fault stopped: when, and (a server) its HTTP address.
type stopped struct {
	at   time.Time
	addr string
}

// failureCause names what other than the router explains a failed request sent at sent,
// given the processes the fault stopped; "" charges it to the router. A request charged
// to a killed server must have been sent before the kill and, when the gateway named the
// endpoint serving it, served by that server.
func failureCause(res kvbench.Result, sent time.Time, stops map[string]stopped) string {
	for name, st := range stops {
		switch {
		case strings.HasPrefix(name, "kvrouter") && strings.Contains(res.Err, "ext_proc unavailable"):
			// Sent just before the stop, it may reach kvrouter draining (no new
			// streams); after the restart, the gateway retries its ext_proc
			// connection with a backoff. Both are kvrouter being down.
			return CauseRouterDown
		case strings.HasPrefix(name, "vllm-sim") && sent.Before(st.at) && (res.Server == "" || res.Server == st.addr):
			return CausePodKilled
		}
	}
	return ""
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func faults(fo FaultOptions) []fault {
	pod := "vllm-sim 0"
	rows := []fault{
		{name: "pod killed and restarted", inject: func(ctx context.Context, s *procStack) (string, error) {
			if err := s.stop(pod, syscall.SIGKILL); err != nil {
				return "", err
			}
			sleep(ctx, fo.Down)
			restarted := time.Now()
			if err := s.respawn(pod); err != nil {
				return "", err
			}
			// The injection ends when the new process answers: the time until routing
			// is KV-aware again is then kvrouter's part.
			base := strings.TrimSuffix(s.EngineMetricsURLs()[0], "/metrics")
			for time.Since(restarted) < 30*time.Second && ctx.Err() == nil {
				if resp, err := http.Get(base + "/health"); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						return fmt.Sprintf("server 0 answering %.0f ms after it was started again", ms(time.Since(restarted))), nil
					}
				}
				sleep(ctx, 20*time.Millisecond)
			}
			return "server 0 not answering 30 s after it was started again", nil
		}},
		{name: "metrics endpoint stalled", inject: func(ctx context.Context, s *procStack) (string, error) {
			// Server 0's /metrics answers nothing for 3 s (several scrape intervals).
			base := strings.TrimSuffix(s.EngineMetricsURLs()[0], "/metrics")
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/debug/stall-metrics?for=3s", nil)
			if err != nil {
				return "", err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return "", err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				return "", fmt.Errorf("stall-metrics: %s", resp.Status)
			}
			sleep(ctx, 3*time.Second)
			return "server 0's /metrics stalled 3 s", nil
		}},
		{name: "kvrouter restarted", routerDown: true, inject: func(ctx context.Context, s *procStack) (string, error) {
			// What the restarted kvrouter must rebuild: each server's batches so far
			// (vLLM's replay buffer keeps the last 10,000).
			var numbered []string
			for i := range s.metrics {
				numbered = append(numbered, fmt.Sprint(serverBatches(ctx, s, i)))
			}
			if err := s.stop("kvrouter", syscall.SIGTERM); err != nil {
				return "", err
			}
			return "batches the servers had published: " + strings.Join(numbered, ", "), s.respawn("kvrouter")
		}},
	}
	// After kvrouter's restart, which so finds every server's cache as the load left
	// it: the rows without replay leave their server diverged, and the suite then
	// resets that server's cache before the next row.
	rows = append(rows, eventFaults(fo)...)
	return append(rows, []fault{
		{name: "SIGHUP, good config", inject: func(ctx context.Context, s *procStack) (string, error) {
			return sighup(ctx, s, nil)
		}},
		{name: "SIGHUP, bad config", inject: func(ctx context.Context, s *procStack) (string, error) {
			return sighup(ctx, s, []byte("policy: {name: no-such-policy}\n"))
		}},
		{name: fmt.Sprintf("%d idle streams", fo.IdleStreams), inject: func(ctx context.Context, s *procStack) (string, error) {
			return idleStreams(ctx, s.extproc, fo.IdleStreams, fo.Down)
		}},
		{name: fmt.Sprintf("%d TCP connections", fo.Conns), inject: func(ctx context.Context, s *procStack) (string, error) {
			return tcpConns(ctx, s.extproc, fo.Conns, fo.Down)
		}},
		{name: fmt.Sprintf("%d parallel %d MB bodies", fo.Bodies, fo.BodyBytes>>20), inject: func(ctx context.Context, s *procStack) (string, error) {
			return bigBodies(ctx, s.GatewayURL(), fo.Model, fo.Bodies, fo.BodyBytes)
		}},
	}...)
}

// eventFaults are the KV-event rows: a connection to a live server reset, and batches
// dropped, each on server 0 (with a replay socket) and, when the stack has one, on the
// last server (without). vLLM's publisher lives in the engine process, so "a publisher
// restarted" without the pod restarting (and losing its cache) is, in practice, the
// connection between kvrouter and the pod being reset: vllm-sim reopens its PUB socket
// with its sequence and replay buffer kept.
func eventFaults(fo FaultOptions) []fault {
	servers := []int{0}
	if fo.Process.WithoutReplay > 0 {
		servers = append(servers, fo.Workers-1)
	}
	label := func(i int) string {
		if i < fo.Workers-fo.Process.WithoutReplay {
			return fmt.Sprintf("server %d, replay", i)
		}
		return fmt.Sprintf("server %d, no replay", i)
	}
	var rows []fault
	for _, i := range servers {
		rows = append(rows, fault{name: "KV-event connection reset (" + label(i) + ")", inject: func(ctx context.Context, s *procStack) (string, error) {
			return "", simPost(ctx, s, i, "/debug/reset-kv-connections", http.StatusNoContent)
		}})
	}
	for _, i := range servers {
		rows = append(rows, fault{name: fmt.Sprintf("%d KV-event batches dropped (%s)", fo.DropBatches, label(i)), inject: func(ctx context.Context, s *procStack) (string, error) {
			return dropEvents(ctx, s, i, fo.DropBatches, fo.Model)
		}})
	}
	return rows
}

// dropEvents makes server i drop its next n KV-event batches (numbered and buffered for
// replay, not sent) and sends it n+1 requests of its own, one at a time, so that the
// drops and the batch that shows kvrouter the gap happen during the injection whatever
// the routing does with the load.
func dropEvents(ctx context.Context, s *procStack, i, n int, model string) (string, error) {
	before := serverBatches(ctx, s, i)
	if err := simPost(ctx, s, i, fmt.Sprintf("/debug/drop-kv-events?batches=%d", n), http.StatusNoContent); err != nil {
		return "", err
	}
	defer simPost(ctx, s, i, "/debug/drop-kv-events?batches=0", http.StatusNoContent) // disarm what the load left
	base := strings.TrimSuffix(s.EngineMetricsURLs()[i], "/metrics")
	for k := 0; k <= n; k++ {
		ids := make([]string, 40) // 2 full blocks of 16 tokens, new ones each time
		for j := range ids {
			ids[j] = strconv.Itoa(1000 + (int(time.Now().UnixNano())+k*97+j*13)%20000)
		}
		body := fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":1}`, model, strings.Join(ids, ","))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("direct request to server %d: %s", i, resp.Status)
		}
	}
	return fmt.Sprintf("server %d numbered batches %d..%d meanwhile; the first %d not sent", i, before, serverBatches(ctx, s, i)-1, n), nil
}

// simPost posts to vllm-sim i's path and checks the status.
func simPost(ctx context.Context, s *procStack, i int, path string, want int) error {
	base := strings.TrimSuffix(s.EngineMetricsURLs()[i], "/metrics")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("server %d %s: %s %s", i, path, resp.Status, body)
	}
	return nil
}

// simCache is vllm-sim's GET /debug/cache.
type simCache struct {
	Cached  *int     `json:"cached_blocks"`
	Batches []uint64 `json:"kv_batches"`
}

func readSimCache(ctx context.Context, s *procStack, i int) (simCache, bool) {
	var c simCache
	base := strings.TrimSuffix(s.EngineMetricsURLs()[i], "/metrics")
	if json.Unmarshal([]byte(get(ctx, base+"/debug/cache")), &c) != nil || c.Cached == nil {
		return c, false
	}
	return c, true
}

// serverBatches is how many KV-event batches server i's (single) rank numbered so far.
func serverBatches(ctx context.Context, s *procStack, i int) int {
	c, ok := readSimCache(ctx, s, i)
	if !ok || len(c.Batches) == 0 {
		return 0
	}
	return int(c.Batches[0])
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// sighup sends kvrouter SIGHUP with its configuration replaced by bad (nil: unchanged),
// then puts the good file back. The note is kvrouter's reload counters afterwards.
func sighup(ctx context.Context, s *procStack, bad []byte) (string, error) {
	good, err := os.ReadFile(s.routerConfig)
	if err != nil {
		return "", err
	}
	if bad != nil {
		if err := os.WriteFile(s.routerConfig, bad, 0o644); err != nil {
			return "", err
		}
		defer os.WriteFile(s.routerConfig, good, 0o644)
	}
	before := reloadsTotal(ctx, s.RouterURL())
	if err := syscall.Kill(s.pid("kvrouter"), syscall.SIGHUP); err != nil {
		return "", err
	}
	// The reload loads the models' tokenizers as check-config does: wait for its count.
	for t0 := time.Now(); time.Since(t0) < 30*time.Second && reloadsTotal(ctx, s.RouterURL()) == before; {
		if p := s.find("kvrouter"); p != nil {
			select {
			case <-p.done:
				return "kvrouter exited on SIGHUP", s.respawn("kvrouter")
			default:
			}
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return metricLine(ctx, s.RouterURL(), "kvrouter_config_reloads_total"), nil
}

// reloadsTotal is kvrouter's kvrouter_config_reloads_total summed over results.
func reloadsTotal(ctx context.Context, routerURL string) float64 {
	total := 0.0
	for _, l := range strings.Split(get(ctx, routerURL+"/metrics"), "\n") {
		if strings.HasPrefix(l, "kvrouter_config_reloads_total{") {
			if _, v, ok := strings.Cut(l, "} "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return total
}

// idleStreams opens n ext_proc streams (TLS, kvrouter's self-signed default) that send
// nothing, holds them for d, and closes them.
func idleStreams(ctx context.Context, addr string, n int, d time.Duration) (string, error) {
	tc, err := tlscert.ClientConfig{}.TLS()
	if err != nil {
		return "", err
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return "", err
	}
	defer cc.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := extprocv3.NewExternalProcessorClient(cc)
	opened := 0
	for range n {
		if _, err := client.Process(sctx); err != nil {
			break
		}
		opened++
	}
	sleep(ctx, d)
	return fmt.Sprintf("%d opened", opened), nil
}

// tcpConns opens up to n raw TCP connections (bounded by this process's open-file
// limit, leaving 256 descriptors), holds them for d, and closes them.
func tcpConns(ctx context.Context, addr string, n int, d time.Duration) (string, error) {
	note := ""
	if limit := OpenFileLimit(); limit > 0 && limit-256 < n {
		note = fmt.Sprintf("scaled from %d to the open-file limit %d less 256; ", n, limit)
		n = max(limit-256, 0)
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dl := net.Dialer{Timeout: time.Second}
	for range n {
		c, err := dl.DialContext(ctx, "tcp", addr)
		if err != nil {
			note += "dial: " + err.Error() + "; "
			break
		}
		conns = append(conns, c)
	}
	sleep(ctx, d)
	return fmt.Sprintf("%s%d opened", note, len(conns)), nil
}

// bigBodies sends n parallel chat requests of about size bytes through the gateway.
func bigBodies(ctx context.Context, gw, model string, n, size int) (string, error) {
	content := strings.Repeat("lorem ipsum ", size/12)
	body, err := json.Marshal(map[string]any{"model": model, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	if err != nil {
		return "", err
	}
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()
			req, err := http.NewRequestWithContext(rctx, http.MethodPost, gw+"/v1/chat/completions", bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	byCode := map[int]int{}
	for _, c := range codes {
		byCode[c]++
	}
	return fmt.Sprintf("big bodies by status (0: no answer): %v", byCode), nil
}

// samplePeaks reads kvrouter's RSS and goroutines every 100 ms until ctx ends.
func samplePeaks(ctx context.Context, routerURL string) (rssMB float64, goroutines int) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		vals := metricValues(ctx, routerURL, "process_resident_memory_bytes", "go_goroutines")
		rssMB = max(rssMB, vals["process_resident_memory_bytes"]/(1<<20))
		goroutines = max(goroutines, int(vals["go_goroutines"]))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// metricValues reads unlabelled metrics from a /metrics page (missing ones are absent).
func metricValues(ctx context.Context, base string, names ...string) map[string]float64 {
	out := map[string]float64{}
	body := get(ctx, base+"/metrics")
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		for _, n := range names {
			if name == n {
				if v, err := strconv.ParseFloat(val, 64); err == nil {
					out[n] = v
				}
			}
		}
	}
	return out
}

// metricLine returns the samples of a labelled metric family, joined.
func metricLine(ctx context.Context, base, name string) string {
	var parts []string
	for _, l := range strings.Split(get(ctx, base+"/metrics"), "\n") {
		if strings.HasPrefix(l, name+"{") {
			parts = append(parts, strings.TrimPrefix(l, name))
		}
	}
	return name + " " + strings.Join(parts, " ")
}

func get(ctx context.Context, url string) string {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return string(b)
}

// kvView is the part of kvrouter's /debug/kv the suite reads.
type kvView []struct {
	Endpoint      string `json:"endpoint"`
	Connected     bool   `json:"connected"`
	EventsHealthy bool   `json:"events_healthy"`
	Indexed       int    `json:"indexed_blocks"`
	Ranks         []struct {
		LastSeq uint64 `json:"last_seq"`
		HasSeq  bool   `json:"has_seq"`
	} `json:"ranks"`
}

// waitKVAware waits (at most bound) until kvrouter's /debug/kv (on its debug port) shows
// every server's KV events connected and healthy, and caught up with the batches the
// server numbered (read before the view): kvrouter's last sequence number is the
// server's last, wherever kvrouter has applied a batch since connecting or has a replay
// socket to rebuild from (without either, it has nothing to catch up with).
func waitKVAware(ctx context.Context, s *procStack, bound time.Duration) bool {
	start := time.Now()
	for time.Since(start) < bound && ctx.Err() == nil {
		numbered := make([]int, len(s.metrics))
		for i := range s.metrics {
			numbered[i] = serverBatches(ctx, s, i)
		}
		var view kvView
		if json.Unmarshal([]byte(get(ctx, s.DebugURL()+"/debug/kv")), &view) == nil {
			ok := 0
			for i, m := range s.metrics {
				addr := strings.TrimSuffix(strings.TrimPrefix(m, "http://"), "/metrics")
				for _, e := range view {
					if e.Endpoint != addr || !e.Connected || !e.EventsHealthy || len(e.Ranks) == 0 {
						continue
					}
					r := e.Ranks[0]
					if numbered[i] > 0 && (r.HasSeq || s.hasReplay(i)) && (!r.HasSeq || int(r.LastSeq) < numbered[i]-1) {
						continue
					}
					ok++
				}
			}
			if ok == len(s.metrics) {
				return true
			}
		}
		sleep(ctx, 20*time.Millisecond)
	}
	return false
}

// divergenceSettled ends divergence's wait once no server's difference has changed for
// this long: it is called after the load has ended, so the caches no longer change and
// the index only takes the events already in flight, which arrive within milliseconds.
// A difference that stays (a server without a replay socket that missed events) is then
// final, and waiting out the whole bound for it only made the suite slower.
const divergenceSettled = time.Second

// divergence compares kvrouter's index with the servers' caches, waiting (at most bound,
// and no longer than divergenceSettled once nothing changes) for the events in flight to
// arrive: the sum of the per-server block-count differences, and each server's (index
// minus cache).
func divergence(ctx context.Context, s *procStack, bound time.Duration) (int, []int, bool) {
	start := time.Now()
	var last []int
	changed := start
	for {
		var view kvView
		if json.Unmarshal([]byte(get(ctx, s.DebugURL()+"/debug/kv")), &view) != nil {
			return 0, nil, false
		}
		indexed := map[string]int{}
		for _, e := range view {
			indexed[e.Endpoint] = e.Indexed
		}
		total, by := 0, make([]int, len(s.metrics))
		for i, m := range s.metrics {
			c, ok := readSimCache(ctx, s, i)
			if !ok {
				return 0, nil, false
			}
			by[i] = indexed[strings.TrimSuffix(strings.TrimPrefix(m, "http://"), "/metrics")] - *c.Cached
			total += max(by[i], -by[i])
		}
		if !slices.Equal(by, last) {
			last, changed = by, time.Now()
		}
		if total == 0 || time.Since(start) > bound || time.Since(changed) > divergenceSettled || ctx.Err() != nil {
			return total, by, true
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// waitGateway sends a one-token request through the gateway until one succeeds (at most
// bound): a gateway whose ext_proc connection failed while kvrouter was down retries it
// with a growing backoff, and waitReady does not go through the gateway.
func waitGateway(ctx context.Context, gw, model string, bound time.Duration) error {
	body := fmt.Sprintf(`{"model":%q,"prompt":"Are you there?","max_tokens":1}`, model)
	last := ""
	for start := time.Now(); time.Since(start) < bound && ctx.Err() == nil; sleep(ctx, 100*time.Millisecond) {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		req, err := http.NewRequestWithContext(rctx, http.MethodPost, gw+"/v1/completions", strings.NewReader(body))
		if err != nil {
			cancel()
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			last = err.Error()
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		resp.Body.Close()
		cancel()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%s %s", resp.Status, b)
	}
	return fmt.Errorf("demo: no request through the gateway succeeded within %v: %s", bound, last)
}

// resetDiverged empties the prefix cache (vLLM's POST /reset_prefix_cache, which
// publishes AllBlocksCleared) of every server whose index entries differ from its cache,
// so that no fault is charged with an earlier one's divergence. It returns the servers
// reset.
func resetDiverged(ctx context.Context, s *procStack) ([]int, error) {
	_, by, ok := divergence(ctx, s, 3*time.Second)
	if !ok {
		return nil, errors.New("demo: divergence not readable")
	}
	var reset []int
	for i, d := range by {
		if d == 0 {
			continue
		}
		var err error
		for try := 0; try < 50; try++ { // 409 while a request still holds blocks
			if err = simPost(ctx, s, i, "/reset_prefix_cache", http.StatusOK); err == nil {
				break
			}
			sleep(ctx, 100*time.Millisecond)
		}
		if err != nil {
			return reset, err
		}
		reset = append(reset, i)
	}
	if len(reset) > 0 {
		if d, _, _ := divergence(ctx, s, 5*time.Second); d != 0 {
			return reset, fmt.Errorf("demo: index still %d blocks from the caches after resetting servers %v", d, reset)
		}
	}
	return reset, nil
}

var errNoRows = errors.New("demo: no fault rows")

// WriteFaults prints the fault table.
func WriteFaults(w io.Writer, rows []FaultResult) error {
	if len(rows) == 0 {
		return errNoRows
	}
	fmt.Fprintf(w, "%-44s %5s %7s %-28s %9s %9s %8s %6s %-18s  %s\n", "fault", "sent", "router", "other failures",
		"aware ms", "(from 0)", "peak RSS", "gorout", "divergence", "note")
	for _, r := range rows {
		div := "n/m"
		if r.DivergenceBlocks != nil {
			div = strconv.Itoa(*r.DivergenceBlocks)
			if *r.DivergenceBlocks != 0 {
				div += fmt.Sprint(r.DivergenceByServer)
			}
		}
		fmt.Fprintf(w, "%-44s %5d %7d %-28s %9.0f %9.0f %5.0f MB %6d %-18s  %s\n", r.Fault, r.Requests, r.FailedRouter, causes(r.FailedBy),
			r.KVAwareAfterMS, r.KVAwareFromStartMS, r.PeakRSSMB, r.PeakGoroutines, div, r.Note)
	}
	fmt.Fprintln(w, "router: failed requests the router caused (goal 0); aware ms: until KV-aware again from the injection's end (from 0: its start); n/m: not measured")
	return nil
}

// causes formats FailedBy in a stable order.
func causes(by map[string]int) string {
	var parts []string
	for _, c := range []string{CauseRouterDown, CausePodKilled} {
		if by[c] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", by[c], c))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
