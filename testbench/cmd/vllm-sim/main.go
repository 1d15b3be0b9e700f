// Command vllm-sim is a stand-in for `vllm serve`: it takes vLLM's flag names, serves the
// OpenAI-compatible API, /metrics and KV events like vLLM, and simulates the engine (see
// package sim) instead of running a model.
package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/testbench/cmd/internal/exitcode"
	"github.com/kvrouter/kvrouter/testbench/sim"
	"github.com/kvrouter/kvrouter/testbench/sim/server"
)

func main() {
	os.Exit(exitCode(run(os.Args[1:], os.Stderr), os.Stderr))
}

// exitCode is vllm-sim's exit status for run's error, which it prints: 0 for none and
// for -h/--help, 1 otherwise (exitcode.Of).
func exitCode(err error, stderr io.Writer) int { return exitcode.Of("vllm-sim", err, stderr, 1) }

func run(args []string, stderr io.Writer) error {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("vllm-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	host := fs.String("host", "0.0.0.0", "address to listen on")
	port := fs.Int("port", 8000, "HTTP port")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model name or path")
	fs.StringVar(&cfg.ServedModelName, "served-model-name", "", "name clients use (default: --model)")
	fs.IntVar(&cfg.Engine.BlockSize, "block-size", cfg.Engine.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.Engine.MaxNumSeqs, "max-num-seqs", cfg.Engine.MaxNumSeqs, "maximum running requests")
	fs.IntVar(&cfg.Engine.MaxNumBatchedTokens, "max-num-batched-tokens", cfg.Engine.MaxNumBatchedTokens, "token budget per step")
	fs.IntVar(&cfg.Engine.MaxModelLen, "max-model-len", cfg.Engine.MaxModelLen, "maximum prompt + output tokens")
	fs.BoolVar(&cfg.Engine.ReserveFullISL, "scheduler-reserve-full-isl", cfg.Engine.ReserveFullISL, "admit a request only when its whole prompt fits")
	kvEvents := fs.String("kv-events-config", "", "vLLM's KV events JSON, e.g. {\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\"}")
	fs.BoolVar(&cfg.EnablePromptTokensDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	fs.IntVar(&cfg.DataParallelSize, "data-parallel-size", 1, "engines behind this port; rank r publishes on the events port + r")
	fs.Float64Var(&cfg.GPUMemoryUtilization, "gpu-memory-utilization", cfg.GPUMemoryUtilization, "reported in cache_config_info only")
	kvBytes := fs.Int64("kv-cache-bytes", 1<<30, "KV cache budget per engine in bytes (Qwen3-0.6B geometry)")
	override := fs.Int("num-gpu-blocks-override", 0, "number of KV blocks, overriding --kv-cache-bytes")
	fs.Float64Var(&cfg.Engine.Speed, "speed", 1, "engine speed factor (2 = steps take half as long)")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "run this many times faster than real time")
	fs.Float64Var(&cfg.Engine.Timing.Base, "step-base", cfg.Engine.Timing.Base, "step time: seconds per step")
	fs.Float64Var(&cfg.Engine.Timing.PrefillToken, "step-prefill-token", cfg.Engine.Timing.PrefillToken, "step time: seconds per prefill token")
	fs.Float64Var(&cfg.Engine.Timing.DecodeSeq, "step-decode-seq", cfg.Engine.Timing.DecodeSeq, "step time: seconds per decoding sequence")
	fs.Float64Var(&cfg.Engine.Timing.Attention, "step-attention", cfg.Engine.Timing.Attention, "step time: seconds per 1e6 attention token pairs")
	hashSeed := fs.Int64("hash-seed", -1, "block hash root seed (like PYTHONHASHSEED); -1 = random per process")
	fs.BoolVar(&cfg.LegacyErrors, "legacy-errors", false, "flat {\"object\":\"error\",...} error bodies as older vLLM")
	replicas := fs.Int("replicas", 1, "independent servers in this process (not a vLLM flag): replica i serves HTTP on --port + i and KV events on the configured ports + i x --data-parallel-size, with its own engines, cache, metrics and hash seed; all share one loaded tokenizer")
	tokDir := fs.String("tokenizer", "", "directory with the model's tokenizer.json and tokenizer_config.json: enables text prompts, chat completions and /tokenize (as vLLM computes them)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if cfg.KVEvents, err = server.ParseKVEventsConfig(*kvEvents); err != nil {
		return err
	}
	cfg.Engine.NumGPUBlocks = sim.Qwen3_0_6B.NumBlocks(*kvBytes, cfg.Engine.BlockSize)
	if *override > 0 {
		cfg.Engine.NumGPUBlocks = *override
	}
	if *hashSeed >= 0 {
		cfg.Engine.HashSeed = uint64(*hashSeed)
		cfg.HashSeeded = true
	}
	if *replicas < 1 {
		return fmt.Errorf("--replicas must be at least 1, got %d", *replicas)
	}

	log, err := zap.NewProduction()
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	opts := server.Options{Logger: log}
	if *tokDir != "" {
		b, err := prompt.LoadDir(*tokDir, prompt.LoadOptions{})
		if err != nil {
			return fmt.Errorf("--tokenizer: %w", err)
		}
		// The router's own tokenizer and chat templates reproduce vLLM's ids, so the
		// simulated server hashes the same tokens vLLM would.
		opts.Tokenizer, opts.Chat = b, b
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	g, ctx := errgroup.WithContext(ctx)
	for i := range *replicas {
		rc, err := replicaConfig(cfg, i, *hashSeed < 0)
		if err != nil {
			return err
		}
		ro := opts
		if *replicas > 1 {
			ro.Logger = log.With(zap.Int("replica", i))
		}
		srv, err := server.New(rc, ro)
		if err != nil {
			return err
		}
		hs := &http.Server{Addr: net.JoinHostPort(*host, fmt.Sprint(*port+i)), Handler: srv.Handler(),
			ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error { return srv.Run(ctx) })
		g.Go(func() error {
			ro.Logger.Info("serving", zap.String("addr", hs.Addr), zap.String("model", rc.Model),
				zap.Int("num_gpu_blocks", rc.Engine.NumGPUBlocks), zap.Int("data_parallel_size", rc.DataParallelSize))
			if err := hs.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return hs.Shutdown(sctx)
		})
	}
	return g.Wait()
}

// replicaConfig is replica i's configuration: its KV-event ports offset by i x the
// data-parallel size (so ranks and replicas never share a port) and, unless seeded,
// a random hash seed of its own, as separate vLLM processes would have.
func replicaConfig(cfg server.Config, i int, randomSeed bool) (server.Config, error) {
	off := i * cfg.DataParallelSize
	cfg.KVEvents.Endpoint = server.OffsetEndpoint(cfg.KVEvents.Endpoint, off)
	cfg.KVEvents.ReplayEndpoint = server.OffsetEndpoint(cfg.KVEvents.ReplayEndpoint, off)
	if randomSeed {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return cfg, err
		}
		cfg.Engine.HashSeed = binary.LittleEndian.Uint64(b[:])
	}
	return cfg, nil
}
