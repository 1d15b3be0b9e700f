// Command kvbench reproduces the reference experiment against an OpenAI-compatible URL or
// an in-process simulated fleet. Run `kvbench -h` for the flags and kvbench/README.md for
// the method.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/peersync"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/testbench/cmd/internal/exitcode"
	"github.com/kvrouter/kvrouter/testbench/kvbench"
	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := exitCode(run(ctx, os.Args[1:], os.Stdout, os.Stderr), os.Stderr)
	stop()
	os.Exit(code)
}

// exitCode is kvbench's exit status for run's error, which it prints: 0 for none and
// for -h/--help, 2 otherwise (exitcode.Of).
func exitCode(err error, stderr io.Writer) int { return exitcode.Of("kvbench", err, stderr, 2) }

// defaultTokenizerDir is where `make models` puts the Qwen3 tokenizer files: under
// $KVROUTER_MODELS_DIR, else .cache/models at the repository root, as the Makefile and
// scripts/fetch-models.sh decide (testmodels.Root is that rule).
func defaultTokenizerDir() string { return filepath.Join(testmodels.Root(), "qwen3") }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wl := kvbench.DefaultWorkloadConfig()
	sc := kvbench.DefaultSimConfig()
	var (
		url           = fs.String("url", "", "OpenAI-compatible base URL to benchmark (URL mode)")
		simMode       = fs.Bool("sim", false, "benchmark an in-process simulated fleet (sim mode)")
		model         = fs.String("model", sc.Model, "model name sent in requests")
		api           = fs.String("api", string(wl.API), "request API: completions or chat")
		workers       = fs.Int("workers", len(sc.Servers), "servers in the fleet (sim mode; in URL mode, for the bound)")
		prefixes      = fs.String("prefixes", "", "N, shared prefixes (comma list allowed; default 7, sweep 2,7,12,24)")
		prefixTokens  = fs.Int("prefix-tokens", wl.PrefixTokens, "P, tokens per shared prefix")
		tailTokens    = fs.Int("tail-tokens", wl.TailTokens, "T, unique tokens per request")
		outputTokens  = fs.Int("output-tokens", wl.OutputTokens, "O, output tokens per request")
		concurrency   = fs.String("concurrency", "", "C, closed-loop clients (comma list allowed; default 8, sweep 4,8,16)")
		requests      = fs.Int("requests", wl.Requests, "measured requests per run")
		warmup        = fs.Int("warmup", wl.Warmup, "requests sent (and drained) before measuring; 0 = from empty caches")
		seed          = fs.Uint64("seed", wl.Seed, "workload seed: same seed, same requests in the same order")
		zipf          = fs.Float64("zipf", 0, "Zipf exponent s of prefix popularity; 0 = uniform")
		policy        = fs.String("policy", "", "policy (sim mode; comma list allowed; default "+defaultPolicy+", sweep: every registered policy); in URL mode a label")
		reps          = fs.Int("reps", 0, "repetitions per cell, median reported (default 1, sweep 3)")
		sweep         = fs.Bool("sweep", false, "run the reference grid and print its tables")
		jsonPath      = fs.String("json", "", "write one JSON record per cell to this file")
		plotPath      = fs.String("plot", "", "draw cached-token ratio vs N to this .svg or .png file")
		plotConc      = fs.Int("plot-concurrency", 8, "concurrency the plot shows")
		kvBytes       = fs.String("kv-bytes", "1GiB", "KV cache per server (sim mode)")
		speeds        = fs.String("speed-factors", joinFloats(sc.Servers), "per-server speed factors, comma list (sim mode; default: the calibrated heterogeneous fleet)")
		servers       = fs.String("servers", "", `per-server spec overriding --workers/--kv-bytes/--speed-factors, e.g. "kv=1GiB,speed=1;kv=512MiB,speed=0.5"`)
		churn         = fs.String("churn", "", `servers leaving and joining (sim mode), e.g. "20s:-2,40s:+2" (virtual time, 0-based server)`)
		replicas      = fs.Int("replicas", 1, "router replicas (sim mode); each sees every KV event and its own in-flight requests, and its peers' through the state sync (--sync-interval)")
		syncInterval  = fs.Duration("sync-interval", peersync.DefaultConfig().Interval, "how often router replicas send their changed state to each other (sim mode, --replicas > 1; 0 = no sync: each sees only its own requests)")
		syncDelay     = fs.Duration("sync-delay", time.Millisecond, "network delay of the replicas' state messages (sim mode)")
		eventLag      = fs.Duration("event-lag", sc.EventLag, "KV event delivery lag (sim mode)")
		scrape        = fs.Duration("scrape-interval", sc.ScrapeInterval, "how stale the router's view of server metrics may be (sim mode; 0 = live)")
		maxHold       = fs.Duration("max-hold", sc.MaxHold, "longest the router holds a request when its policy asks (sim mode; 0 = never hold)")
		rtt           = fs.Duration("rtt", sc.RTT, "client round trip to the fleet (sim mode)")
		tokDir        = fs.String("tokenizer", "", "directory with the model's tokenizer.json and tokenizer_config.json (default: qwen3 in $KVROUTER_MODELS_DIR, else in .cache/models at the repository root); none = the embedded Qwen3 ids")
		metricsURLs   = fs.String("metrics-urls", "", "engines' /metrics URLs, comma list (URL mode)")
		kvBlocks      = fs.Int("kv-blocks", 585, "KV blocks per server for the bound when /metrics does not say (URL mode)")
		blockSize     = fs.Int("block-size", 16, "tokens per KV block (URL mode, for hit_full and the bound)")
		ignoreEOS     = fs.Bool("ignore-eos", true, "ask vLLM for exactly --output-tokens tokens (URL mode)")
		resetCache    = fs.Bool("reset-prefix-cache", false, "POST /reset_prefix_cache to every --metrics-urls engine before each run (URL mode; vLLM needs VLLM_SERVER_DEV_MODE=1)")
		timeout       = fs.Duration("timeout", 5*time.Minute, "per-request timeout (URL mode)")
		parallel      = fs.Int("parallel", runtime.GOMAXPROCS(0), "sim runs at once")
		placement     = fs.String("placement", "", `placement policy overrides, e.g. "saturated=3,spill_load=6,fill=0.75" (sim mode)`)
		progress      = fs.String("progress", "auto", "progress bar on stderr: auto, always or never")
		traceFile     = fs.String("trace", "", "replay a Mooncake-format trace (JSON lines of timestamp ms, input_length, output_length, hash_ids) open loop")
		speedup       = fs.Float64("speedup", 1, "divide the trace's timestamps by this factor")
		traceReqs     = fs.Int("trace-requests", 0, "replay only the trace's first N requests (0 = all); with --gen-trace, how many to write (default 400)")
		genTrace      = fs.String("gen-trace", "", "write a synthetic Mooncake-format trace (shaped by --gen-trace-shape, seeded by --seed) to this file and exit")
		genShape      = fs.String("gen-trace-shape", string(kvbench.TraceShapeDefault), "--gen-trace's shape: default (the committed traces'), conversation (Mooncake's conversation trace: ~12k input, ~343 output) or toolagent (long shared tool prefixes, short steps and outputs, one-shot requests)")
		workload      = fs.String("workload", "", "an open-loop workload instead of the reference's closed loop: chat (multi-turn conversations), agent (long shared contexts, short steps) or mixed")
		systemPrompts = fs.Int("system-prompts", kvbench.DefaultChatConfig().SystemPrompts, "chat workload: shared system prompts conversations draw from (0 = none)")
		conversations = fs.Int("conversations", kvbench.DefaultChatConfig().Conversations, "chat workload: conversations started over its 30 s window (more is a higher arrival rate)")
		maxModelLen   = fs.Int("max-model-len", sc.Engine.MaxModelLen, "servers' max_model_len: longer prompt + output is refused with 400 (sim mode)")
		routeLog      = fs.String("route-log", "", "write every routing decision (each server's state then), first token and finish (prompt and cached tokens) as JSON lines to this file (sim mode)")
	)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: kvbench (--sim | --url URL) [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *genTrace != "" {
		c, err := kvbench.TraceShapeConfig(kvbench.TraceShape(*genShape))
		if err != nil {
			return err
		}
		c.Seed = *seed
		if *traceReqs > 0 {
			c.Requests = *traceReqs
		}
		if set["max-model-len"] {
			c.MaxTokens = *maxModelLen
		}
		return writeGeneratedTrace(*genTrace, c)
	}
	if set["gen-trace-shape"] {
		return errors.New("--gen-trace-shape shapes --gen-trace's trace only")
	}
	scripted := *traceFile != "" || *workload != ""
	if *traceFile != "" && *workload != "" {
		return errors.New("choose one of --trace and --workload")
	}
	if scripted {
		// These shape the reference's closed loop; a trace or a scripted workload fixes
		// its own prompts, outputs and arrivals, and would ignore them silently.
		for _, name := range referenceOnly {
			if set[name] {
				return fmt.Errorf("--%s shapes the reference workload only: --trace and --workload fix their own", name)
			}
		}
	}

	wl.PrefixTokens, wl.TailTokens, wl.OutputTokens = *prefixTokens, *tailTokens, *outputTokens
	wl.Requests, wl.Warmup, wl.Seed, wl.Zipf, wl.API = *requests, *warmup, *seed, *zipf, kvbench.API(*api)
	o := kvbench.Options{
		Workload: wl, Workers: *workers, Sweep: *sweep, JSONPath: *jsonPath, PlotPath: *plotPath,
		PlotConcurrency: *plotConc, KVPolicy: "kv", Parallel: *parallel,
		BlockSize: *blockSize, BlocksPerServer: *kvBlocks,
	}
	var err error
	defN, defC, defReps := "7", "8", 1
	if *sweep {
		defN, defC, defReps = "2,7,12,24", "4,8,16", 3
	}
	if o.Prefixes, err = intList(or(*prefixes, defN), "prefixes"); err != nil {
		return err
	}
	if o.Concurrency, err = intList(or(*concurrency, defC), "concurrency"); err != nil {
		return err
	}
	o.Reps = defReps
	if set["reps"] {
		o.Reps = *reps
	}
	o.Workload.Prefixes = o.Prefixes[0]

	switch {
	case *url != "" && *simMode:
		return errors.New("choose one of --url and --sim")
	case *url != "":
		o.HTTP = &kvbench.HTTPConfig{URL: *url, Model: *model, IgnoreEOS: *ignoreEOS, Timeout: *timeout, ResetPrefixCache: *resetCache}
		if *metricsURLs != "" {
			o.HTTP.MetricsURLs = strings.Split(*metricsURLs, ",")
			if !set["workers"] {
				o.Workers = len(o.HTTP.MetricsURLs)
			}
		}
		o.Policies = []string{or(*policy, "url")}
	case *simMode:
		sc.Model, sc.EventLag, sc.ScrapeInterval, sc.RTT, sc.Replicas = *model, *eventLag, *scrape, *rtt, *replicas
		sc.MaxHold = *maxHold
		sc.Engine.MaxModelLen = *maxModelLen
		if sc.Servers, err = serverSpecs(*servers, *workers, *kvBytes, *speeds, set); err != nil {
			return err
		}
		if sc.Churn, err = kvbench.ParseChurn(*churn); err != nil {
			return err
		}
		o.Workers = len(sc.Servers)
		rs, err := newRouters()
		if err != nil {
			return err
		}
		if err := parsePlacement(*placement, &rs.cfg.Placement); err != nil {
			return err
		}
		sc.Sync = kvbench.SyncConfig{Interval: *syncInterval, Delay: *syncDelay}
		rs.sync, rs.expiry, rs.interval = *syncInterval > 0 && *replicas > 1, peersync.DefaultConfig().Expiry, *syncInterval
		sc.Policies = rs.router
		o.Sim = &sc
		switch {
		case *policy != "":
			o.Policies = strings.Split(*policy, ",")
		case *sweep:
			o.Policies = rs.reg.Names()
		default:
			o.Policies = []string{defaultPolicy}
		}
		for _, p := range o.Policies {
			if _, ok := rs.reg.Lookup(p); !ok {
				return fmt.Errorf("unknown policy %q (registered: %s)", p, strings.Join(rs.reg.Names(), ", "))
			}
		}
	default:
		fs.Usage()
		return errors.New("choose --url URL or --sim")
	}

	var tok kvbench.Tokenizer
	if !set["tokenizer"] {
		*tokDir = defaultTokenizerDir()
	}
	var prompts kvbench.RequestTokenizer
	if *tokDir != "none" { // none: the embedded Qwen3 ids, on request
		t, err := tokenizer.LoadDir(*tokDir)
		switch {
		case err == nil:
			tok = encoder{t}
			if wl.API == kvbench.APIChat || *workload != "" {
				tmpl, err := loadTemplate(*tokDir)
				if err != nil {
					return fmt.Errorf("loading the chat template: %w", err)
				}
				prompts = requestTokenizer{prompt.New(t, tmpl, nil)}
			}
		case set["tokenizer"]:
			return fmt.Errorf("loading the tokenizer: %w", err)
		default:
			fmt.Fprintf(stderr, "kvbench: no tokenizer in %s (run `make models`): using the embedded Qwen3 token ids, unchecked\n", *tokDir)
		}
	}
	o.Tokenizer = tok
	if o.Sim != nil {
		o.Sim.Tokenizer, o.Sim.Prompts = tok, prompts
	}

	switch *progress {
	case "always":
		o.Progress = stderr
	case "auto":
		o.Progress = stderr
		if f, ok := stderr.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
				o.ProgressTerminal = true
			}
		}
	case "never":
	default:
		return fmt.Errorf("--progress must be auto, always or never, got %q", *progress)
	}
	closeLog := func() error { return nil }
	if *routeLog != "" {
		if o.Sim == nil {
			return errors.New("--route-log needs --sim")
		}
		f, err := os.Create(*routeLog)
		if err != nil {
			return err
		}
		defer f.Close()
		o.Sim.RouteLog = kvbench.NewRouteLog(f)
		closeLog = func() error {
			if err := o.Sim.RouteLog.Err(); err != nil {
				return fmt.Errorf("--route-log: %w", err)
			}
			return f.Close()
		}
	}
	start := time.Now()
	if scripted {
		s, err := buildScript(*traceFile, *traceReqs, *speedup, *workload, *seed, *systemPrompts, *conversations, tok)
		if err != nil {
			return err
		}
		if o.Sim != nil && s.API == kvbench.APIChat && prompts == nil {
			return errors.New("the chat workloads need the model's tokenizer and chat template (--tokenizer; run `make models`)")
		}
		so := kvbench.ScriptOptions{Script: s, Policies: o.Policies, Reps: o.Reps, Sim: o.Sim, HTTP: o.HTTP,
			Parallel: *parallel, JSONPath: *jsonPath}
		if _, err := kvbench.ExecuteScript(ctx, so, stdout); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "kvbench: done in %s\n", time.Since(start).Round(time.Millisecond))
		return closeLog()
	}
	if _, err := kvbench.Execute(ctx, o, stdout); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "kvbench: done in %s\n", time.Since(start).Round(time.Millisecond))
	return closeLog()
}

// referenceOnly lists the flags that shape only the reference workload (kvbench.Workload).
var referenceOnly = []string{"prefixes", "prefix-tokens", "tail-tokens", "output-tokens", "concurrency",
	"requests", "warmup", "zipf", "sweep", "plot", "plot-concurrency"}

// buildScript builds the open-loop workload the flags ask for.
func buildScript(traceFile string, limit int, speedup float64, workload string, seed uint64, systemPrompts, conversations int, tok kvbench.Tokenizer) (*kvbench.Script, error) {
	if traceFile != "" {
		f, err := os.Open(traceFile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		recs, err := kvbench.DecodeTrace(f, limit)
		if err != nil {
			return nil, err
		}
		return kvbench.NewTraceScript(recs, speedup, tok)
	}
	switch workload {
	case "chat":
		c := kvbench.DefaultChatConfig()
		c.Seed, c.SystemPrompts, c.Conversations = seed, systemPrompts, conversations
		return kvbench.NewChatScript(c, tok)
	case "agent":
		c := kvbench.DefaultAgentConfig()
		c.Seed = seed
		return kvbench.NewAgentScript(c, tok)
	case "mixed":
		c := kvbench.DefaultMixedConfig()
		c.Chat.Seed, c.Agent.Seed, c.OneShot.Seed = seed, seed, seed
		return kvbench.NewMixedScript(c, tok)
	}
	return nil, fmt.Errorf("--workload must be chat, agent or mixed, got %q", workload)
}

// writeGeneratedTrace writes kvbench's synthetic trace of config c to path.
func writeGeneratedTrace(path string, c kvbench.TraceGenConfig) error {
	recs, err := kvbench.GenerateTrace(c)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := kvbench.WriteTrace(f, recs); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// encoder adapts the tokenizer to kvbench: completions add special tokens (none for Qwen3).
type encoder struct{ t *tokenizer.Tokenizer }

func (e encoder) Encode(text string) ([]uint32, error) { return e.t.Encode(text, true), nil }

// loadTemplate compiles the chat template of the model in dir (its tokenizer_config.json),
// as prompt.LoadDir does, without loading the tokenizer a second time.
func loadTemplate(dir string) (*chattemplate.Template, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	cfg, err := chattemplate.ParseTokenizerConfig(raw)
	if err != nil {
		return nil, err
	}
	return chattemplate.CompileConfig(cfg, chattemplate.Options{})
}

// requestTokenizer is the router's path for a chat body: parse it, render the chat
// template, tokenize.
type requestTokenizer struct{ b *prompt.Builder }

func (r requestTokenizer) PromptTokens(path string, body []byte) ([]uint32, error) {
	req, err := openai.Parse(path, body)
	if err != nil {
		return nil, err
	}
	return r.b.PromptTokens(req)
}

func serverSpecs(spec string, workers int, kvBytes, speeds string, set map[string]bool) ([]kvbench.ServerSpec, error) {
	b, err := kvbench.ParseBytes(kvBytes)
	if err != nil {
		return nil, err
	}
	if spec != "" {
		return kvbench.ParseServers(spec, kvbench.ServerSpec{KVBytes: b, Speed: 1})
	}
	var fs []float64
	for _, s := range strings.Split(speeds, ",") {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || f <= 0 {
			return nil, fmt.Errorf("--speed-factors: %q is not a positive number", s)
		}
		fs = append(fs, f)
	}
	if workers < 1 {
		return nil, fmt.Errorf("--workers must be at least 1, got %d", workers)
	}
	if set["workers"] && !set["speed-factors"] && len(fs) != workers {
		fs = []float64{1} // a fleet of another size: homogeneous unless speeds are given
	}
	out := make([]kvbench.ServerSpec, workers)
	for i := range out {
		out[i] = kvbench.ServerSpec{KVBytes: b, Speed: fs[i%len(fs)]}
	}
	if set["speed-factors"] && len(fs) != workers {
		return nil, fmt.Errorf("--speed-factors has %d values for %d workers", len(fs), workers)
	}
	return out, nil
}

func joinFloats(s []kvbench.ServerSpec) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatFloat(v.Speed, 'g', -1, 64)
	}
	return strings.Join(parts, ",")
}

func intList(s, name string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("--%s: %q is not an integer", name, p)
		}
		out = append(out, n)
	}
	return out, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
