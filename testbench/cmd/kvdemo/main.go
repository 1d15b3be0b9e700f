// Command kvdemo is `make demo`: it runs kvrouter on a local simulated fleet (vllm-sim
// processes with KV events over ZeroMQ) behind Envoy (when an envoy binary is on PATH) or
// the dev gateway, sends the reference workload through the gateway once per policy with
// kvbench's URL mode, prints the comparison, and leaves nothing running.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/policy"
	"github.com/kvrouter/kvrouter/testbench/cmd/internal/exitcode"
	"github.com/kvrouter/kvrouter/testbench/demo"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/tlscert"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := exitCode(run(ctx, os.Args[1:], os.Stdout, os.Stderr), os.Stderr)
	stop()
	os.Exit(code)
}

// exitCode is kvdemo's exit status for run's error, which it prints: 0 for none and
// for -h/--help, 1 otherwise (exitcode.Of).
func exitCode(err error, stderr io.Writer) int { return exitcode.Of("kvdemo", err, stderr, 1) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "latency" {
		return latency(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "faults" {
		return faults(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "replicas" {
		return replicas(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "trivial-extproc" {
		return trivialExtProc(ctx, args[1:], stderr)
	}
	start := time.Now()
	o := demo.DefaultOptions()
	fs := flag.NewFlagSet("kvdemo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin", "directory with the vllm-sim, kvrouter and devgateway binaries (make build)")
	gw := fs.String("gateway", "auto", "auto (Envoy when an envoy binary is on PATH, else the dev gateway), envoy or dev")
	envoyCfg := fs.String("envoy-config", "envoy/envoy.yaml", "the Envoy bootstrap to run (its ports are rewritten to the demo's)")
	policies := fs.String("policies", strings.Join(o.Policies, ","), "policies to compare, each on a fresh fleet")
	speeds := fs.String("speed-factors", "", "per-server engine speeds, comma list, one per worker (e.g. kvbench's 1,1,0.7,0.7,0.7,0.7); empty: all 1")
	jsonOut := fs.String("json", "", "also write the results as JSON records (kvbench's, mode full-stack, with the gateway, kill and fallbacks) to this file")
	keep := fs.Bool("keep-logs", false, "keep the generated configurations and the processes' logs")
	fs.StringVar(&o.TokenizerDir, "tokenizer", o.TokenizerDir, "the model's tokenizer directory (make models)")
	fs.StringVar(&o.Model, "model", o.Model, "served model name")
	fs.IntVar(&o.Workers, "workers", o.Workers, "simulated vLLM servers")
	fs.Int64Var(&o.KVBytes, "kv-cache-bytes", o.KVBytes, "KV cache per server (Qwen3-0.6B geometry)")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "run the simulated engines this many times faster than real time")
	fs.IntVar(&o.Prefixes, "prefixes", o.Prefixes, "N, shared prefixes")
	fs.IntVar(&o.PrefixTokens, "prefix-tokens", o.PrefixTokens, "tokens per shared prefix")
	fs.IntVar(&o.TailTokens, "tail-tokens", o.TailTokens, "unique tokens per request")
	fs.IntVar(&o.OutputTokens, "output-tokens", o.OutputTokens, "output tokens per request")
	fs.IntVar(&o.Requests, "requests", o.Requests, "requests per policy")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "closed-loop clients")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "workload seed")
	fs.DurationVar(&o.KillWorkerAfter, "kill-worker-after", 0, "kill server 0 (SIGKILL) this long into each policy's load and count the failed requests; 0: no kill")
	fs.IntVar(&o.MaxFallbacks, "max-fallbacks", 0, "kvrouter's limits.max_fallbacks (fallback endpoints the gateway retries a failed connect on)")
	fs.IntVar(&o.Routers, "router-replicas", 1, "kvrouter replicas behind the dev gateway, which spreads the requests over them")
	fs.BoolVar(&o.Unsynced, "no-replica-sync", false, "with --router-replicas > 1: replicas do not share their in-flight state (no replicas section)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.Policies = strings.Split(*policies, ",")
	if *speeds != "" {
		for _, f := range strings.Split(*speeds, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				return fmt.Errorf("--speed-factors: %w", err)
			}
			o.SpeedFactors = append(o.SpeedFactors, v)
		}
	}
	o.Log = stderr

	work, err := os.MkdirTemp("", "kvdemo-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(stderr, "kvdemo: configurations and logs in %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	po := demo.ProcessOptions{BinDir: *bin, WorkDir: work}
	switch *gw {
	case "auto", "envoy":
		if o.Routers > 1 && *gw == "auto" {
			break // replicas run behind the dev gateway
		}
		if path, err := exec.LookPath("envoy"); err == nil {
			po.Envoy, po.EnvoyConfig = path, *envoyCfg
		} else if *gw == "envoy" {
			return errors.New("--gateway envoy: no envoy binary on PATH")
		}
	case "dev":
	default:
		return fmt.Errorf("--gateway %q: want auto, envoy or dev", *gw)
	}
	gateway := "dev"
	if po.Envoy != "" {
		gateway = "envoy"
		fmt.Fprintf(stderr, "kvdemo: gateway: Envoy (%s) with %s\n", po.Envoy, *envoyCfg)
	} else {
		fmt.Fprintln(stderr, "kvdemo: gateway: the dev gateway (no envoy binary on PATH)")
	}
	results, err := demo.Compare(ctx, o, demo.Processes(po))
	if err != nil {
		if !*keep {
			fmt.Fprintln(stderr, "kvdemo: rerun with --keep-logs to keep the processes' logs")
		}
		return err
	}
	if err := demo.WriteTable(stdout, o, results); err != nil {
		return err
	}
	if o.Routers > 1 {
		if err := demo.WriteReplicaCost(stdout, results); err != nil {
			return err
		}
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(demo.Records(o, gateway, results), "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nkvdemo: done in %.1fs; nothing left running.\n", time.Since(start).Seconds())
	return nil
}

// latency is `kvdemo latency`: kvrouter's ext_proc round trip against a trivial ext_proc
// server's, side by side (issue 6).
func latency(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := demo.DefaultLatencyOptions()
	fs := flag.NewFlagSet("kvdemo latency", flag.ContinueOnError)
	fs.SetOutput(stderr)
	eps := fs.String("endpoints", "6,64", "fleet sizes, comma list")
	fs.StringVar(&o.BinDir, "bin", o.BinDir, "directory with the kvrouter and vllm-sim binaries (make build)")
	routerEnv := fs.String("router-env", "GOGC=400", "environment variables for kvrouter, comma list (default: the Helm chart's GOGC; \"\" for Go's defaults)")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "open-loop ext_proc exchanges per second")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "length of each measured round")
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds per server, alternating kvrouter and trivial")
	fs.StringVar(&o.Policy, "policy", o.Policy, "kvrouter's policy: "+strings.Join(policy.Builtin().Names(), ", "))
	fs.StringVar(&o.TokenizerDir, "tokenizer", o.TokenizerDir, "the model's tokenizer directory (make models)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (the fake Envoy) to this file")
	fs.StringVar(&o.TrivialPprof, "trivial-pprof", "", "serve the trivial server's /debug/pprof/ on this address (kvrouter's is on its debug port)")
	keep := fs.Bool("keep-logs", false, "keep the generated configurations and the processes' logs")
	fs.BoolVar(&o.Plaintext, "plaintext", false, "serve both ext_proc ports without TLS (default: TLS on both, self-signed, as kvrouter's default)")
	jsonOut := fs.String("json", "", "also write the rounds as JSON to this file (docs/data/latency/, rendered by scripts/docs.py)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if !slices.Contains(policy.Builtin().Names(), o.Policy) {
		return fmt.Errorf("--policy: %q is not one of %s", o.Policy, strings.Join(policy.Builtin().Names(), ", "))
	}
	o.Endpoints = nil
	for _, f := range strings.Split(*eps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("--endpoints: %q is not a positive count", f)
		}
		o.Endpoints = append(o.Endpoints, n)
	}
	if *routerEnv != "" {
		o.RouterEnv = strings.Split(*routerEnv, ",")
	}
	o.Log = stderr
	dir, err := os.MkdirTemp("", "kvdemo-latency-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(stderr, "kvdemo latency: configurations and logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	load := demo.LoadAverage()
	rounds, err := demo.MeasureLatency(ctx, o, dir)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(demo.NewLatencyReport(o, load, rounds), "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return demo.WriteLatency(stdout, o, rounds)
}

// faults is `kvdemo faults`: the fault suite (issue 12) on one stack of child processes
// and the dev gateway; it prints the table and, with --json, writes the rows.
func faults(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fo := demo.DefaultFaultOptions()
	fs := flag.NewFlagSet("kvdemo faults", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&fo.Process.BinDir, "bin", "bin", "directory with the vllm-sim, kvrouter and devgateway binaries (make build)")
	fs.StringVar(&fo.TokenizerDir, "tokenizer", fo.TokenizerDir, "the model's tokenizer directory (make models)")
	short := fs.Bool("short", false, "the short version (make test): fewer requests, streams, connections and smaller bodies")
	jsonOut := fs.String("json", "", "write the rows as JSON to this file")
	keep := fs.Bool("keep-logs", false, "keep the generated configurations and the processes' logs")
	replicas := fs.Bool("replicas", false, "the replica faults instead (issue 13): 3 kvrouter replicas behind the dev gateway; one killed, one restarted, one partitioned off")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *replicas {
		return replicaFaults(ctx, fo.Process.BinDir, fo.TokenizerDir, *short, *jsonOut, *keep, stdout, stderr)
	}
	if *short {
		tok, bin := fo.TokenizerDir, fo.Process.BinDir
		fo = demo.ShortFaultOptions()
		fo.TokenizerDir, fo.Process.BinDir = tok, bin
	}
	fo.Log = stderr
	dir, err := os.MkdirTemp("", "kvdemo-faults-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(stderr, "kvdemo faults: configurations and logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	fo.Process.WorkDir = dir
	rows, err := demo.RunFaults(ctx, fo)
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		rep := demo.FaultReport{Workers: fo.Workers, Requests: fo.Requests, Concurrency: fo.Concurrency, Policy: fo.Policies[0],
			Short: *short, OpenFileLimit: demo.OpenFileLimit(), WithoutReplay: fo.Process.WithoutReplay, Rows: rows}
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return demo.WriteFaults(stdout, rows)
}

// replicas is `kvdemo replicas`: the demo's workload through one kvrouter, --routers
// replicas sharing their in-flight state and as many that do not (issue 13), per policy and seed; it
// prints each run and, with --json, writes the report docs/results-replicas.md renders.
func replicas(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := demo.DefaultOptions()
	o.Policies = []string{"placement", "kv"}
	fs := flag.NewFlagSet("kvdemo replicas", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin", "directory with the vllm-sim, kvrouter and devgateway binaries (make build)")
	policies := fs.String("policies", strings.Join(o.Policies, ","), "policies to compare")
	seeds := fs.String("seeds", "1,2,3", "workload seeds, comma list: each setup and policy runs once per seed")
	routers := fs.Int("routers", 2, "replicas in the synced and unsynced setups (against one router)")
	jsonOut := fs.String("json", "", "write the report as JSON to this file")
	keep := fs.Bool("keep-logs", false, "keep the generated configurations and the processes' logs")
	fs.StringVar(&o.TokenizerDir, "tokenizer", o.TokenizerDir, "the model's tokenizer directory (make models)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "requests per run")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "closed-loop clients")
	fs.IntVar(&o.Prefixes, "prefixes", o.Prefixes, "N, shared prefixes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Policies = strings.Split(*policies, ",")
	var ss []uint64
	for _, f := range strings.Split(*seeds, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("--seeds: %w", err)
		}
		ss = append(ss, v)
	}
	o.Log = stderr
	work, err := os.MkdirTemp("", "kvdemo-replicas-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(stderr, "kvdemo replicas: configurations and logs in %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	rep, err := demo.CompareReplicas(ctx, o, demo.ProcessOptions{BinDir: *bin, WorkDir: work}, demo.ReplicaSetups(*routers), ss)
	if err != nil {
		return err
	}
	for _, r := range rep.Runs {
		c := demo.SumRouters(r.Routers)
		fmt.Fprintf(stdout, "%-22s %-10s seed %d: ratio %.3f, TTFT p50 %.0f p99 %.0f ms, %.1f req/s, %d errors, routed %.0f, CPU %.2f ms/req, decision mean %.0f us\n",
			r.Setup, r.Policy, r.Seed, r.Summary.CachedRatio, r.Summary.TTFTP50Ms, r.Summary.TTFTP99Ms, r.Summary.Throughput, r.Summary.Errors,
			c.Routed, 1000*c.CPUSeconds/max(c.Routed, 1), r.DecisionMeanUs)
	}
	if *jsonOut == "" {
		return nil
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
}

// replicaFaults is `kvdemo faults --replicas`.
func replicaFaults(ctx context.Context, bin, tok string, short bool, jsonOut string, keep bool, stdout, stderr io.Writer) error {
	fo := demo.DefaultReplicaFaultOptions()
	if short {
		fo = demo.ShortReplicaFaultOptions()
	}
	fo.TokenizerDir, fo.Process.BinDir, fo.Log = tok, bin, stderr
	dir, err := os.MkdirTemp("", "kvdemo-faults-replicas-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Fprintf(stderr, "kvdemo faults: configurations and logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	fo.Process.WorkDir = dir
	rep, err := demo.RunReplicaFaults(ctx, fo)
	if err != nil {
		return err
	}
	rep.Short = short
	if jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return demo.WriteReplicaFaults(stdout, rep)
}

// trivialExtProc is `kvdemo trivial-extproc` (not in the usage: kvdemo latency starts
// it): fakeenvoy.Trivial, an ext_proc server that names a fixed endpoint without parsing
// or scoring, served with kvrouter's gRPC server options in a process of its own, so
// that it shares no heap, GC or scheduler with kvrouter or the fake Envoy.
func trivialExtProc(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvdemo trivial-extproc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9002", "ext_proc gRPC address")
	endpoint := fs.String("endpoint", "127.0.0.1:8000", "the endpoint every request is routed to")
	pprofAddr := fs.String("pprof", "", "serve Go's /debug/pprof/ on this address (to profile the trivial server as kvrouter's debug port allows)")
	plaintext := fs.Bool("plaintext", false, "serve without TLS (default: TLS with a self-signed certificate, as kvrouter's default)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	if *pprofAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", httppprof.Index)
		mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
		ps := &http.Server{Addr: *pprofAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = ps.ListenAndServe() }()
		defer ps.Close()
	}
	opts := extproc.ServerOptions()
	if !*plaintext {
		src, err := tlscert.New(tlscert.DefaultConfig(), tlscert.Options{})
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(src.ServerConfig())))
	}
	g := grpc.NewServer(opts...)
	fakeenvoy.NewTrivial(*endpoint).Register(g)
	go func() {
		<-ctx.Done()
		g.Stop()
	}()
	return g.Serve(lis)
}
