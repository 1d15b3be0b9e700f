package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/prompt"
)

const usage = `kvrouter: a KV-cache-aware router for vLLM fleets, serving Envoy's ext_proc.

Usage:
  kvrouter --config FILE [--log-level LEVEL]   serve; SIGHUP or a change of FILE reloads it
  kvrouter check-config FILE                   report every problem in FILE, exit 1 if any
  kvrouter tokenize --model-dir DIR            read request bodies (JSON lines) on stdin, print
                                               {"ids":[...]} or {"error":...} per line, as vLLM's /tokenize
  kvrouter COMMAND --help                      a command's usage
  kvrouter --version                           the build: module version and VCS revision

Everything else is in FILE, one YAML document (examples/kvrouter.yaml in the repository shows
every field, its README the reference): listen addresses, the endpoints or their discovery,
models and tokenizers, policy, limits. The Inference Extension picker's flags are fields
there: --pool-name, --pool-namespace: discovery.kubernetes.inference_pool, .namespace;
--grpc-port: listen.extproc (:9002); --grpc-health-port: listen.health (:9003, plaintext);
--metrics-port: listen.metrics (:9090); --secure-serving, --cert-path: listen.tls.

Flags:
`

// subcommands maps a first argument to its command. Each takes the remaining
// arguments and returns the exit code.
func subcommands(stdin io.Reader, stdout, stderr io.Writer) map[string]func(args []string) int {
	return map[string]func(args []string) int{
		"check-config": func(args []string) int { return checkConfig(args, stdout, stderr) },
		"tokenize":     func(args []string) int { return tokenize(args, stdin, stdout, stderr) },
	}
}

// newFlagSet returns the flag set of one kvrouter command: errors and usage go to
// stderr, the usage text first, then the flags' defaults.
func newFlagSet(usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvrouter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags is every command's parse: it parses args with fs and wants nargs
// positional arguments. When ok is false the command ends with code: 0 after -h or
// --help (usage printed), 2 after a bad flag or a wrong number of arguments (usage
// printed). A file named like a flag goes after "--".
func parseFlags(fs *flag.FlagSet, args []string, nargs int) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() != nargs {
		fs.Usage()
		return 2, false
	}
	return 0, true
}

// Main is the kvrouter command line; cmd/kvrouter calls it with os.Args[1:]. It
// returns the process exit code. SIGTERM and SIGINT start a drain; the exit code is 0
// when the drain completes.
func Main(args []string, stdout, stderr io.Writer) int {
	return MainIO(args, os.Stdin, stdout, stderr)
}

// MainIO is Main with the standard input given (for `kvrouter tokenize`).
func MainIO(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if cmd, ok := subcommands(stdin, stdout, stderr)[args[0]]; ok {
			return cmd(args[1:])
		}
	}
	fs := newFlagSet(usage, stderr)
	cfgPath := fs.String("config", "", "path of the YAML configuration `FILE` (required); reloaded on SIGHUP and when it changes")
	checkEvery := fs.Duration("config-check-interval", DefaultConfigCheckInterval, "how often to look for a change of the configuration file (0: only on SIGHUP)")
	level := zapcore.InfoLevel
	fs.Var(&level, "log-level", "`LEVEL` of the JSON logs on stderr: debug, info, warn or error (default info)")
	version := fs.Bool("version", false, "print the build (module version and VCS revision, inference_extension_info's build_ref and commit) and exit")
	if code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	if *version {
		ref, commit := buildInfo()
		fmt.Fprintf(stdout, "kvrouter %s (commit %s)\n", ref, commit)
		return 0
	}
	if *cfgPath == "" {
		fs.Usage()
		return 2
	}
	log, err := newLogger(level, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvrouter: %v\n", err)
		return 1
	}
	defer func() { _ = log.Sync() }()

	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return 1
	}
	interval := *checkEvery
	if interval <= 0 {
		interval = -1
	}
	a, err := New(cfg, Options{Logger: log, ConfigPath: *cfgPath, ConfigCheckInterval: interval, SoftMemoryLimit: true})
	if err != nil {
		log.Error("cannot start", zap.Error(err))
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// SIGHUP reloads the configuration (its default action would end the process
	// without a drain).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Info("SIGHUP: reloading the configuration", zap.String("file", *cfgPath))
				_, _ = a.Reload()
			}
		}
	}()
	if err := a.Run(ctx); err != nil {
		log.Error("stopped", zap.Error(err))
		return 1
	}
	return 0
}

func newLogger(level zapcore.Level, w io.Writer) (*zap.Logger, error) {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	enc.EncodeDuration = zapcore.StringDurationEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), level)
	return zap.New(core, zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(w)))), nil
}

// checkConfig implements `kvrouter check-config FILE`.
func checkConfig(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("usage: kvrouter check-config FILE\n", stderr)
	if code, ok := parseFlags(fs, args, 1); !ok {
		return code
	}
	path := fs.Arg(0)
	cfg, err := loadChecked(path, stdout)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", path)
	if ev := cfg.Discovery.KVEvents; ev.Mode == discovery.ModeCentral {
		fmt.Fprintf(stdout, "kv events: central mode: pods connect to %s (rank r to port + r) and publish on kv@<pod-ip:port>@<model>; "+
			"run ONE kvrouter replica: a pod's events reach only the replica it connected to (see discovery/README.md)\n", ev.Bind)
	} else {
		fmt.Fprintf(stdout, "kv events: per-pod mode: kvrouter dials every pod's publisher; any number of replicas\n")
	}
	return 0
}

// loadChecked loads a configuration file with every check of check-config; its error's
// text is what check-config prints (a configuration reload logs the same lines). It also
// loads every tokenizer and chat template with start-up's own code, so that what would
// stop the process at start (a missing tokenizer_config.json, a truncated
// tokenizer.json) fails here too; their notes (a model routed by load, the template
// engine) go to notes.
func loadChecked(path string, notes io.Writer) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if len(cfg.Models) > 0 {
		if _, err := newTokenizer(cfg, newCheckLogger(notes), nil, nil); err != nil {
			var le *prompt.LoadError
			if errors.As(err, &le) {
				return nil, fmt.Errorf("%s: models.%s: %w", path, le.Model, le.Err)
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return cfg, nil
}

// newCheckLogger prints start-up's log lines for check-config: level and message, then
// the fields, one line each, no timestamps.
func newCheckLogger(w io.Writer) *zap.Logger {
	enc := zap.NewDevelopmentEncoderConfig()
	enc.TimeKey, enc.CallerKey, enc.NameKey = "", "", ""
	enc.EncodeLevel = zapcore.LowercaseLevelEncoder
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), zapcore.InfoLevel))
}

// tokenize implements `kvrouter tokenize --model-dir DIR`.
func tokenize(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("usage: kvrouter tokenize --model-dir DIR [--default-chat-template-kwargs JSON] < bodies.jsonl\n", stderr)
	dir := fs.String("model-dir", "", "directory with tokenizer.json, tokenizer_config.json (and chat_template.jinja when the model has one)")
	kwargs := fs.String("default-chat-template-kwargs", "", "JSON object merged under every request's chat_template_kwargs, as vLLM's flag")
	if code, ok := parseFlags(fs, args, 0); !ok {
		return code
	}
	if *dir == "" {
		fs.Usage()
		return 2
	}
	var o prompt.LoadOptions
	if *kwargs != "" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(*kwargs), &obj); err != nil || obj == nil {
			fmt.Fprintln(stderr, "kvrouter tokenize: --default-chat-template-kwargs must be a JSON object")
			return 2
		}
		o.DefaultChatTemplateKwargs = json.RawMessage(*kwargs)
	}
	b, err := prompt.LoadDir(*dir, o)
	if err != nil {
		fmt.Fprintf(stderr, "kvrouter tokenize: %v\n", err)
		return 1
	}
	if err := prompt.TokenizeLines(stdin, stdout, b); err != nil {
		fmt.Fprintf(stderr, "kvrouter tokenize: %v\n", err)
		return 1
	}
	return 0
}
