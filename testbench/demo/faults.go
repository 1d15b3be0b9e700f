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
}

// DefaultFaultOptions is `make faults`: the sizes on 3 servers.
func DefaultFaultOptions() FaultOptions {
	o := DefaultOptions()
	o.Workers, o.Policies, o.Requests, o.Concurrency, o.Prefixes = 3, []string{"kv"}, 48, 4, 6
	return FaultOptions{Options: o, IdleStreams: 5000, Conns: 20000, Bodies: 24, BodyBytes: 15 << 20, Down: time.Second}
}

// ShortFaultOptions is the version run inside `make test` (well under a minute).
func ShortFaultOptions() FaultOptions {
	f := DefaultFaultOptions()
	f.Requests, f.Prefixes, f.IdleStreams, f.Conns, f.Bodies, f.BodyBytes, f.Down = 12, 3, 200, 500, 4, 2<<20, 300*time.Millisecond
	return f
}

// FaultResult is one fault's row.
type FaultResult struct {
	Fault string `json:"fault"`
	// Requests were sent through the gateway while the fault was injected; Failed of them
	// did not get a 200 (RouterDown: the fault stops kvrouter itself).
	Requests   int  `json:"requests"`
	Failed     int  `json:"failed"`
	RouterDown bool `json:"router_down"`
	// KVAwareAfterMS is the time from the end of the injection until every endpoint's KV
	// events were connected and healthy again in kvrouter's /debug/kv; -1: not within
	// the suite's 30 s bound.
	KVAwareAfterMS float64 `json:"kv_aware_after_ms"`
	// PeakRSSMB and PeakGoroutines are kvrouter's, sampled every 100 ms from its /metrics.
	PeakRSSMB      float64 `json:"peak_rss_mb"`
	PeakGoroutines int     `json:"peak_goroutines"`
	// DivergenceBlocks is, after the fault and its load, the sum over the servers of the
	// difference between the blocks kvrouter's index holds for the server (/debug/kv
	// indexed_blocks) and the distinct blocks the server's prefix cache holds (vllm-sim's
	// /debug/cache); nil: not measured (a view could not be read).
	DivergenceBlocks *int   `json:"divergence_blocks"`
	Note             string `json:"note,omitempty"`
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
	OpenFileLimit int           `json:"open_file_limit"`
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
	policy := o.Policies[0]
	start := Processes(fo.Process)
	st, err := startReady(ctx, func() (Stack, error) { return start(ctx, o, policy) },
		func(st Stack) error { return waitReady(ctx, st, o.Workers, 60*time.Second) }, o.logf)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := st.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	s := st.(*procStack)
	target, err := kvbench.NewHTTPTarget(kvbench.HTTPConfig{URL: s.GatewayURL(), Model: o.Model, IgnoreEOS: true, Timeout: time.Minute})
	if err != nil {
		return nil, err
	}
	var out []FaultResult
	for _, f := range faults(fo) {
		// The stack as at start (the gateway reconnected to a restarted kvrouter, every
		// server answering) before the next fault, so that no fault is charged with the
		// previous one's recovery.
		if err := waitReady(ctx, st, o.Workers, 60*time.Second); err != nil {
			return out, fmt.Errorf("demo: before fault %s: %w", f.name, err)
		}
		o.logf("fault: %s", f.name)
		r, err := runFault(ctx, s, target, w, o.Concurrency, f)
		if err != nil {
			return out, fmt.Errorf("demo: fault %s: %w", f.name, err)
		}
		o.logf("fault: %s: %d/%d failed, KV-aware after %.0f ms, peak RSS %.0f MB, %d goroutines", f.name, r.Failed, r.Requests,
			r.KVAwareAfterMS, r.PeakRSSMB, r.PeakGoroutines)
		out = append(out, r)
	}
	return out, nil
}

func runFault(ctx context.Context, s *procStack, target *kvbench.HTTPTarget, w *kvbench.Workload, conc int, f fault) (FaultResult, error) {
	r := FaultResult{Fault: f.name, RouterDown: f.routerDown, KVAwareAfterMS: -1}
	sctx, stopSampling := context.WithCancel(ctx)
	var sampled sync.WaitGroup
	sampled.Go(func() { r.PeakRSSMB, r.PeakGoroutines = samplePeaks(sctx, s.RouterURL()) })

	type loadOut struct {
		run kvbench.RunOutput
		err error
	}
	load := make(chan loadOut, 1)
	go func() {
		run, err := target.Run(ctx, w, conc, nil)
		load <- loadOut{run, err}
	}()
	note, err := f.inject(ctx, s)
	injected := time.Now()
	if err != nil {
		stopSampling()
		<-load
		sampled.Wait()
		return r, err
	}
	r.Note = note
	if waitKVAware(ctx, s.DebugURL(), len(s.EngineMetricsURLs()), 30*time.Second) {
		r.KVAwareAfterMS = float64(time.Since(injected).Microseconds()) / 1000
	}
	lo := <-load
	stopSampling()
	sampled.Wait()
	if lo.err != nil {
		return r, lo.err
	}
	if d, ok := divergence(ctx, s, 3*time.Second); ok {
		r.DivergenceBlocks = &d
	}
	first := ""
	for _, res := range lo.run.Results {
		r.Requests++
		if res.Err != "" {
			r.Failed++
			if first == "" {
				first = res.Err
			}
		}
	}
	if first != "" {
		r.Note = strings.TrimPrefix(r.Note+"; first failure: "+first, "; ")
	}
	return r, nil
}

func faults(fo FaultOptions) []fault {
	pod := "vllm-sim 0"
	return []fault{
		{name: "pod killed and restarted", inject: func(ctx context.Context, s *procStack) (string, error) {
			if err := s.stop(pod, syscall.SIGKILL); err != nil {
				return "", err
			}
			sleep(ctx, fo.Down)
			return "", s.respawn(pod)
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
			if err := s.stop("kvrouter", syscall.SIGTERM); err != nil {
				return "", err
			}
			return "", s.respawn("kvrouter")
		}},
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
	}
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

// waitKVAware waits (at most bound) until kvrouter's /debug/kv (on its debug port) shows
// n endpoints whose KV events are connected and healthy.
func waitKVAware(ctx context.Context, debugURL string, n int, bound time.Duration) bool {
	start := time.Now()
	for time.Since(start) < bound && ctx.Err() == nil {
		var view []struct {
			Connected     bool `json:"connected"`
			EventsHealthy bool `json:"events_healthy"`
		}
		if json.Unmarshal([]byte(get(ctx, debugURL+"/debug/kv")), &view) == nil {
			ok := 0
			for _, e := range view {
				if e.Connected && e.EventsHealthy {
					ok++
				}
			}
			if ok == n {
				return true
			}
		}
		sleep(ctx, 20*time.Millisecond)
	}
	return false
}

// divergence compares kvrouter's index with the servers' caches, waiting (at most bound)
// for the events in flight to arrive: the sum of the per-server block-count differences.
func divergence(ctx context.Context, s *procStack, bound time.Duration) (int, bool) {
	start := time.Now()
	for {
		var view []struct {
			Endpoint string `json:"endpoint"`
			Indexed  int    `json:"indexed_blocks"`
		}
		if json.Unmarshal([]byte(get(ctx, s.DebugURL()+"/debug/kv")), &view) != nil {
			return 0, false
		}
		indexed := map[string]int{}
		for _, e := range view {
			indexed[e.Endpoint] = e.Indexed
		}
		total := 0
		for _, m := range s.EngineMetricsURLs() {
			base := strings.TrimSuffix(m, "/metrics")
			var c struct {
				Cached *int `json:"cached_blocks"`
			}
			if json.Unmarshal([]byte(get(ctx, base+"/debug/cache")), &c) != nil || c.Cached == nil {
				return 0, false
			}
			d := indexed[strings.TrimPrefix(base, "http://")] - *c.Cached
			total += max(d, -d)
		}
		if total == 0 || time.Since(start) > bound || ctx.Err() != nil {
			return total, true
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

var errNoRows = errors.New("demo: no fault rows")

// WriteFaults prints the fault table.
func WriteFaults(w io.Writer, rows []FaultResult) error {
	if len(rows) == 0 {
		return errNoRows
	}
	fmt.Fprintf(w, "%-28s %9s %8s %13s %9s %10s %11s  %s\n", "fault", "requests", "failed", "kv-aware ms", "peak RSS", "goroutines", "divergence", "note")
	for _, r := range rows {
		div := "n/m"
		if r.DivergenceBlocks != nil {
			div = strconv.Itoa(*r.DivergenceBlocks)
		}
		failed := strconv.Itoa(r.Failed)
		if r.RouterDown {
			failed += "*"
		}
		fmt.Fprintf(w, "%-28s %9d %8s %13.0f %6.0f MB %10d %11s  %s\n", r.Fault, r.Requests, failed, r.KVAwareAfterMS, r.PeakRSSMB,
			r.PeakGoroutines, div, r.Note)
	}
	fmt.Fprintln(w, "* kvrouter itself was down during the fault; n/m: not measured")
	return nil
}
