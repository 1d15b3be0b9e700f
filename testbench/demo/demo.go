// Package demo runs kvrouter's full path on one machine: a simulated vLLM fleet (vllm-sim
// servers with real ZeroMQ KV events and vLLM metrics), the kvrouter service, and a
// gateway (Envoy, or the repository's dev gateway) in front; then it sends kvbench's
// reference workload through the gateway once per policy and compares the results.
//
// Two ways to start the stack share everything else: Processes starts the built
// binaries as child processes (`make demo`, testbench/cmd/kvdemo), InProcess starts the same
// servers as goroutines on loopback sockets (the end-to-end test). Each policy gets a
// fresh stack, so every run starts from empty caches.
//
// Concurrency: a Stack is used by one goroutine; Compare runs policies one after another.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/testbench/kvbench"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// Options describe the fleet and the workload of a comparison.
type Options struct {
	// Workers is the number of simulated vLLM servers.
	Workers int
	// Model is the served model name; TokenizerDir holds its tokenizer.json and
	// tokenizer_config.json (the servers and the router both tokenize with it).
	Model        string
	TokenizerDir string
	// KVBytes is each server's KV cache (Qwen3-0.6B geometry: 1 GiB = 585 blocks).
	KVBytes int64
	// TimeScale runs the simulated engines this many times faster than real time.
	TimeScale float64
	// SpeedFactors are the servers' engine speeds (vllm-sim --speed), one per worker;
	// empty: every server at speed 1.
	SpeedFactors []float64
	// Policies are compared in this order, each on a fresh stack.
	Policies []string
	// Workload: N prefixes of PrefixTokens, unique tails of TailTokens, OutputTokens
	// generated, Requests at Concurrency closed-loop clients, from Seed.
	Prefixes, PrefixTokens, TailTokens, OutputTokens int
	Requests, Concurrency                            int
	Seed                                             uint64
	// KillWorkerAfter, when set, kills worker 0 (SIGKILL: no FIN on its event stream's
	// behalf beyond what the kernel sends) this long into each policy's load, to count
	// the requests a dying pod costs the clients. Process stacks only. The engines'
	// metrics are then not read (the dead one has none).
	KillWorkerAfter time.Duration
	// MaxFallbacks is kvrouter's limits.max_fallbacks: fallback endpoints the gateway may
	// retry a failed connect on.
	MaxFallbacks int
	// Routers is the number of kvrouter replicas (0: one) behind the gateway, which
	// spreads the requests over them; they share their in-flight state (peersync, a
	// static peer list on loopback) unless Unsynced. Process stacks only.
	Routers  int
	Unsynced bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Prompt is the model's tokenizer and chat template; nil: Compare loads it from
	// TokenizerDir once and shares it with in-process stacks.
	Prompt *prompt.Builder
}

// DefaultOptions is the demo: 6 servers of 1 GiB KV cache (the reference's fleet),
// 12 prefixes of the reference's shape at concurrency 8: round-robin, kv (Dynamo's cost) and
// placement (kvrouter's default).
func DefaultOptions() Options {
	return Options{
		Workers: 6, Model: "Qwen/Qwen3-0.6B", TokenizerDir: DefaultTokenizerDir(), KVBytes: 1 << 30, TimeScale: 4,
		Policies: []string{"round-robin", "kv", "placement"},
		Prefixes: 12, PrefixTokens: 2032, TailTokens: 339, OutputTokens: 32, Requests: 144, Concurrency: 8, Seed: 1,
	}
}

// DefaultTokenizerDir is where `make models` puts the Qwen3 tokenizer files the demo's
// model needs: under $KVROUTER_MODELS_DIR, else .cache/models at the repository root
// (testmodels.Root, the rule the Makefile and kvbench follow).
func DefaultTokenizerDir() string { return filepath.Join(testmodels.Root(), "qwen3") }

// Validate checks the options.
func (o *Options) Validate() error {
	switch {
	case o.Workers < 1 || o.Workers > 64:
		return fmt.Errorf("demo: workers must be in [1, 64], got %d", o.Workers)
	case o.Model == "" || o.TokenizerDir == "":
		return errors.New("demo: a model name and a tokenizer directory are required")
	case o.KVBytes <= 0 || o.TimeScale <= 0:
		return errors.New("demo: kv bytes and time scale must be positive")
	case len(o.Policies) == 0:
		return errors.New("demo: at least one policy is required")
	case len(o.SpeedFactors) != 0 && len(o.SpeedFactors) != o.Workers:
		return fmt.Errorf("demo: %d speed factors for %d workers", len(o.SpeedFactors), o.Workers)
	case o.Requests < 1 || o.Concurrency < 1:
		return errors.New("demo: requests and concurrency must be at least 1")
	case o.Routers < 0 || o.Routers > maxRouters:
		return fmt.Errorf("demo: routers must be in [0, %d], got %d", maxRouters, o.Routers)
	}
	for _, f := range o.SpeedFactors {
		if !(f > 0) {
			return fmt.Errorf("demo: speed factors must be positive, got %v", f)
		}
	}
	return nil
}

// speed is server i's engine speed.
func (o *Options) speed(i int) float64 {
	if len(o.SpeedFactors) == 0 {
		return 1
	}
	return o.SpeedFactors[i]
}

func (o *Options) logf(format string, a ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "kvdemo: "+format+"\n", a...)
	}
}

// Stack is a running fleet, router and gateway.
type Stack interface {
	// GatewayURL is the base URL clients send OpenAI requests to.
	GatewayURL() string
	// EngineMetricsURLs are the servers' /metrics URLs.
	EngineMetricsURLs() []string
	// RouterURL is kvrouter's metrics port (/metrics, /readyz).
	RouterURL() string
	// DebugURL is kvrouter's debug port (/debug/kv, /debug/route).
	DebugURL() string
	// Close stops everything the stack started and waits for it.
	Close() error
}

// Starter starts a fresh stack whose router uses policy.
type Starter func(ctx context.Context, o *Options, policy string) (Stack, error)

// Result is one policy's measured run.
type Result struct {
	Policy  string
	Gateway string
	Summary kvbench.Summary
	// Elapsed is the benchmark's wall time (stack start-up excluded).
	Elapsed time.Duration
	// EventLag is kvrouter's KV-event lag histogram after the run (every batch since the
	// stack started); nil when its /metrics page could not be read.
	EventLag *LagHistogram
	// Routers are each kvrouter replica's counters and CPU time over the load (process
	// stacks).
	Routers []RouterStats
}

// workload validates o, loads its tokenizer when o.Prompt is nil, and builds the
// reference workload it describes (cold: no warm-up), as Compare and RunFaults send it.
func (o *Options) workload() (*kvbench.Workload, kvbench.WorkloadConfig, error) {
	if err := o.Validate(); err != nil {
		return nil, kvbench.WorkloadConfig{}, err
	}
	if o.Prompt == nil {
		b, err := prompt.LoadDir(o.TokenizerDir, prompt.LoadOptions{})
		if err != nil {
			return nil, kvbench.WorkloadConfig{}, fmt.Errorf("demo: tokenizer: %w (run `make models`)", err)
		}
		o.Prompt = b
	}
	wl := kvbench.DefaultWorkloadConfig()
	wl.Prefixes, wl.PrefixTokens, wl.TailTokens, wl.OutputTokens = o.Prefixes, o.PrefixTokens, o.TailTokens, o.OutputTokens
	wl.Requests, wl.Warmup, wl.Seed = o.Requests, 0, o.Seed
	w, err := kvbench.NewWorkload(wl, encoder{o.Prompt})
	return w, wl, err
}

// Compare starts a stack per policy, sends the workload through its gateway with kvbench
// (URL mode), and returns the results in policy order. Every stack is closed before
// Compare returns.
func Compare(ctx context.Context, o Options, start Starter) ([]Result, error) {
	w, wl, err := o.workload()
	if err != nil {
		return nil, err
	}
	var out []Result
	for _, policy := range o.Policies {
		r, err := runOne(ctx, &o, start, policy, w, wl)
		if err != nil {
			return out, fmt.Errorf("demo: %s: %w", policy, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func runOne(ctx context.Context, o *Options, start Starter, policy string, w *kvbench.Workload, wl kvbench.WorkloadConfig) (res Result, err error) {
	o.logf("starting %d simulated vLLM servers, %d kvrouter (policy %s) and the gateway", o.Workers, o.routers(), policy)
	st, err := startReady(ctx, func() (Stack, error) { return start(ctx, o, policy) },
		func(st Stack) error { return waitReady(ctx, st, o.Workers, 60*time.Second) }, o.logf)
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := st.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	o.logf("%s: sending %d requests (N=%d, concurrency %d) through %s", policy, wl.Requests, wl.Prefixes, o.Concurrency, st.GatewayURL())
	metricsURLs := st.EngineMetricsURLs()
	if o.KillWorkerAfter > 0 {
		k, ok := st.(interface{ KillWorker(i int) error })
		if !ok {
			return res, errors.New("demo: this stack cannot kill a worker (use processes)")
		}
		metricsURLs = nil
		timer := time.AfterFunc(o.KillWorkerAfter, func() {
			o.logf("%s: killing worker 0 (SIGKILL)", policy)
			if err := k.KillWorker(0); err != nil {
				o.logf("%s: kill: %v", policy, err)
			}
		})
		defer timer.Stop()
	}
	target, err := kvbench.NewHTTPTarget(kvbench.HTTPConfig{URL: st.GatewayURL(), Model: o.Model,
		MetricsURLs: metricsURLs, IgnoreEOS: true, Timeout: 2 * time.Minute})
	if err != nil {
		return res, err
	}
	before := sampleRouters(ctx, st)
	t0 := time.Now()
	run, err := target.Run(ctx, w, o.Concurrency, nil)
	if err != nil {
		return res, err
	}
	res.Elapsed = time.Since(t0)
	res.Routers = routerStats(st, before, sampleRouters(ctx, st))
	bound := kvbench.ComputeBound(run.Blocks, run.BlockSize, wl.Prefixes, wl.PrefixTokens, wl.TailTokens)
	res.Policy, res.Gateway = policy, st.GatewayURL()
	res.Summary = kvbench.Summarize(run.Results, kvbench.SummaryInput{PrefixTokens: wl.PrefixTokens,
		BlockSize: run.BlockSize, Bound: bound, EngineHitRate: run.EngineHitRate})
	o.logf("%s: cached-token ratio %.3f, %d errors, %.1fs", policy, res.Summary.CachedRatio, res.Summary.Errors, res.Elapsed.Seconds())
	if h, err := routerLag(ctx, st.RouterURL()); err != nil {
		o.logf("%s: KV-event lag unknown: %v", policy, err)
	} else {
		res.EventLag = h
		o.logf("%s: KV-event lag over %d batches: mean %.2f ms, p50 <= %g ms, p99 <= %g ms", policy, h.Count, h.MeanMs(),
			h.QuantileBoundMs(0.5), h.QuantileBoundMs(0.99))
	}
	return res, nil
}

// routerLag reads kvrouter's KV-event lag histogram from its metrics port.
func routerLag(ctx context.Context, routerURL string) (*LagHistogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, routerURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("demo: %s/metrics: HTTP %d", routerURL, resp.StatusCode)
	}
	return ParseLagHistogram(resp.Body)
}

// waitReady waits until the gateway accepts connections, kvrouter is ready (an endpoint
// is eligible) and every server's KV-event stream is connected.
func waitReady(ctx context.Context, st Stack, workers int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	last := "nothing checked yet"
	for {
		if e, ok := st.(interface{ exited() error }); ok {
			if err := e.exited(); err != nil {
				return err
			}
		}
		ok, why := ready(ctx, client, st, workers)
		if ok {
			ok, why = replicasReady(ctx, client, st)
		}
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: stack not ready after %v: %s", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ready(ctx context.Context, client *http.Client, st Stack, workers int) (bool, string) {
	get := func(url string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s: HTTP %d %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
		}
		return b, err
	}
	if _, err := get(st.RouterURL() + "/readyz"); err != nil {
		return false, err.Error()
	}
	b, err := get(st.DebugURL() + "/debug/kv")
	if err != nil {
		return false, err.Error()
	}
	var kv []struct {
		Endpoint     string `json:"endpoint"`
		Connected    bool   `json:"connected"`
		NumGPUBlocks int    `json:"num_gpu_blocks"`
	}
	if err := json.Unmarshal(b, &kv); err != nil {
		return false, err.Error()
	}
	n := 0
	for _, e := range kv {
		if e.Connected && e.NumGPUBlocks > 0 {
			n++
		}
	}
	if n < workers {
		return false, fmt.Sprintf("%d of %d servers scraped with KV events connected", n, workers)
	}
	host := strings.TrimPrefix(strings.TrimPrefix(st.GatewayURL(), "http://"), "https://")
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", host)
	if err != nil {
		return false, "gateway: " + err.Error()
	}
	conn.Close()
	return true, ""
}

// encoder adapts the prompt builder to kvbench: completions add special tokens (none for
// Qwen3).
type encoder struct{ b *prompt.Builder }

func (e encoder) Encode(text string) ([]uint32, error) { return e.b.Encode(text, true) }

// WriteTable prints the comparison as a Markdown table.
func WriteTable(w io.Writer, o Options, results []Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d simulated vLLM servers (%d MiB KV cache each), N=%d prefixes of %d tokens + %d-token tails, %d requests at concurrency %d\n\n",
		o.Workers, o.KVBytes>>20, o.Prefixes, o.PrefixTokens, o.TailTokens, o.Requests, o.Concurrency)
	b.WriteString("| policy | cached-token ratio | hit any | hit full | TTFT p50 / p99 ms | req/s | servers/prefix | engine hit rate | errors |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		s := r.Summary
		spp, ehr := "-", "-"
		if s.ServersPerPrefix != nil {
			spp = fmt.Sprintf("%.2f", *s.ServersPerPrefix)
		}
		if s.EngineHitRate != nil {
			ehr = fmt.Sprintf("%.1f%%", 100**s.EngineHitRate)
		}
		fmt.Fprintf(&b, "| %s | %.3f | %.1f%% | %.1f%% | %.0f / %.0f | %.1f | %s | %s | %d |\n", r.Policy, s.CachedRatio,
			100*s.HitAny, 100*s.HitFull, s.TTFTP50Ms, s.TTFTP99Ms, s.Throughput, spp, ehr, s.Errors)
	}
	if len(results) > 0 {
		fmt.Fprintf(&b, "\nbound: cached-token ratio %.3f (prefixes partitioned across servers)\n", results[0].Summary.BoundCachedRatio)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Record is one policy's run as JSON: kvbench's record (its fields at the top level, so
// full-stack runs read beside `kvbench --json` output), and the fault the run injected.
type Record struct {
	kvbench.Record
	// Gateway is the proxy the requests went through: "envoy" or "dev".
	Gateway string `json:"gateway,omitempty"`
	// KillWorkerAfterS is Options.KillWorkerAfter in seconds (0: no pod killed); the
	// requests the kill failed are in errors.
	KillWorkerAfterS float64 `json:"kill_worker_after_s,omitempty"`
	// MaxFallbacks is Options.MaxFallbacks.
	MaxFallbacks int `json:"max_fallbacks"`
}

// Records turns a comparison through gateway ("envoy" or "dev") into JSON records (mode
// "full-stack", one repetition each).
func Records(o Options, gateway string, results []Result) []Record {
	out := make([]Record, len(results))
	for i, r := range results {
		out[i] = Record{Record: kvbench.Record{
			Cell: kvbench.Cell{Policy: r.Policy, Workers: o.Workers, Prefixes: o.Prefixes, Concurrency: o.Concurrency},
			Mode: "full-stack", Reps: 1,
			PrefixTokens: o.PrefixTokens, TailTokens: o.TailTokens, OutputTokens: o.OutputTokens,
			Seed: o.Seed, API: kvbench.APICompletions,
			Summary: r.Summary,
		}, Gateway: gateway, KillWorkerAfterS: o.KillWorkerAfter.Seconds(), MaxFallbacks: o.MaxFallbacks}
	}
	return out
}
