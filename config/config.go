package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/peersync"
	"github.com/kvrouter/kvrouter/placement"
	"github.com/kvrouter/kvrouter/policy"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/tlscert"
)

// Config is kvrouter's whole configuration file. Each section is owned by the package
// that uses it; later features add sections or fields, never reshape existing ones.
type Config struct {
	// Listen holds the addresses kvrouter serves on.
	Listen ListenConfig `yaml:"listen"`
	// Endpoints is the static list of vLLM servers.
	Endpoints []fleet.EndpointConfig `yaml:"endpoints"`
	// Models maps a base model's served name to how the router tokenizes for it. A model
	// served by some endpoint but absent here is routed by load only.
	Models map[string]ModelConfig `yaml:"models"`
	// Policy chooses and tunes the placement policy.
	Policy PolicyConfig `yaml:"policy"`
	// Limits bounds sizes and times.
	Limits LimitsConfig `yaml:"limits"`
	// KV tunes the KV-cache path: the block index, the KV-event subscriber and the state
	// the kv and approximate policies keep.
	KV KVConfig `yaml:"kv"`
	// Discovery finds endpoints at run time (Kubernetes API or DNS), beside the static
	// list.
	Discovery discovery.Config `yaml:"discovery"`
	// Replicas is how kvrouter replicas find each other and share their in-flight
	// requests, so that they route as one (off without peers).
	Replicas peersync.Config `yaml:"replicas"`
}

// Default returns the configuration with every default and no endpoint.
func Default() Config {
	return Config{
		Listen:    DefaultListenConfig(),
		Policy:    DefaultPolicyConfig(),
		Limits:    DefaultLimitsConfig(),
		KV:        DefaultKVConfig(),
		Discovery: discovery.DefaultConfig(),
		Replicas:  peersync.DefaultConfig(),
	}
}

// Fleet returns the fleet's part of the configuration.
func (c *Config) Fleet() fleet.Config {
	return fleet.Config{Endpoints: c.Endpoints, Scrape: c.Limits.Scrape}
}

// Validate checks every section and the rules across sections. Paths in the returned
// field.Errors are those of the YAML file.
func (c *Config) Validate() error {
	var errs field.Errors
	errs.Nest("listen", c.Listen.Validate())
	if len(c.Endpoints) == 0 && !c.Discovery.Enabled() {
		errs.Addf("endpoints", "at least one endpoint is required (or configure discovery)")
	}
	errs.Nest("endpoints", fleet.ValidateEndpoints(c.Endpoints))
	for i, ep := range c.Endpoints {
		if err := CheckRankPorts(ep.KVEvents); err != nil {
			errs.Addf(field.Join(field.Index("endpoints", i), "kv_events.endpoints"), "%v", err)
		}
		if len(ep.KVEvents.CentralRanks) > 0 && c.Discovery.KVEvents.Mode != discovery.ModeCentral {
			errs.Addf(field.Join(field.Index("endpoints", i), "kv_events.central_ranks"),
				"needs discovery.kv_events.mode: %s (and its bind address)", discovery.ModeCentral)
		}
	}
	adapters := map[string]string{}
	for _, ep := range c.Endpoints {
		for _, a := range ep.LoRAAdapters {
			adapters[a.Name] = a.BaseModel
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Models)) {
		m := c.Models[name]
		p := field.Key("models", name)
		if base, ok := adapters[name]; ok {
			errs.Addf(p, "%q is a LoRA adapter of %q; configure the base model instead", name, base)
		}
		errs.Nest(p, m.Validate())
	}
	errs.Nest("policy", c.Policy.Validate())
	errs.Nest("limits", c.Limits.Validate())
	errs.Nest("kv", c.KV.Validate())
	errs.Nest("discovery", c.Discovery.Validate())
	errs.Nest("replicas", c.Replicas.Validate())
	return errs.Err()
}

// ListenConfig holds the addresses kvrouter listens on ("host:port"; port 0 picks a free
// port, for tests).
type ListenConfig struct {
	// ExtProc serves Envoy's ext_proc stream and the gRPC health service Envoy checks,
	// over TLS unless TLS.Mode is disabled.
	ExtProc string `yaml:"extproc"`
	// TLS is the ext_proc port's TLS: on by default with a self-signed certificate.
	TLS tlscert.Config `yaml:"tls"`
	// Health serves the gRPC health service for Kubernetes probes (plaintext: the
	// kubelet's gRPC probe does not speak TLS; it tells only SERVING or not).
	Health string `yaml:"health"`
	// Metrics serves HTTP /metrics, /healthz and /readyz.
	Metrics string `yaml:"metrics"`
	// Debug serves /debug/endpoints, /debug/kv, POST /debug/route and /debug/pprof/.
	// Loopback by default: reachable through `kubectl port-forward`, not from the pod
	// network. Empty: not served.
	Debug string `yaml:"debug"`
}

// DefaultListenConfig returns ":9002" (TLS, self-signed), ":9003", ":9090" and
// "127.0.0.1:9091" for the debug views.
func DefaultListenConfig() ListenConfig {
	return ListenConfig{ExtProc: ":9002", TLS: tlscert.DefaultConfig(), Health: ":9003", Metrics: ":9090", Debug: "127.0.0.1:9091"}
}

// Validate checks each address, that no two share a fixed port, and the TLS section.
func (c *ListenConfig) Validate() error {
	var errs field.Errors
	errs.Nest("tls", c.TLS.Validate())
	type bound struct{ name, host, port string }
	var seen []bound
	addrs := []struct{ name, addr string }{{"extproc", c.ExtProc}, {"health", c.Health}, {"metrics", c.Metrics}}
	if c.Debug != "" {
		addrs = append(addrs, struct{ name, addr string }{"debug", c.Debug})
	}
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			errs.Addf(a.name, "%q is not host:port", a.addr)
			continue
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil {
			errs.Addf(a.name, "%q: port must be 0..65535", a.addr)
			continue
		} else if n == 0 {
			continue
		}
		// Two listeners clash on one port when they name the same host or one binds
		// every address.
		for _, b := range seen {
			if b.port == port && (b.host == host || wildcard(b.host) || wildcard(host)) {
				errs.Addf(a.name, "%q is already used by %s", a.addr, b.name)
				break
			}
		}
		seen = append(seen, bound{a.name, host, port})
	}
	return errs.Err()
}

// ModelConfig says how the router tokenizes prompts for one base model: either a
// Hugging Face model directory, or the paths of its two tokenizer files. Relative paths
// are relative to the configuration file's directory.
type ModelConfig struct {
	// Tokenizer is a directory holding tokenizer.json and tokenizer_config.json.
	Tokenizer string `yaml:"tokenizer"`
	// TokenizerJSON and TokenizerConfig name the two files directly (both or neither).
	TokenizerJSON   string `yaml:"tokenizer_json"`
	TokenizerConfig string `yaml:"tokenizer_config"`
	// BlockSize is the number of tokens per KV block, as the model's vLLM servers run with
	// (default 16). An endpoint's scraped cache_config_info block_size takes precedence.
	BlockSize int `yaml:"block_size"`
	// DefaultChatTemplateKwargs mirrors the servers' --default-chat-template-kwargs: a
	// JSON object merged under every request's chat_template_kwargs (default: none).
	DefaultChatTemplateKwargs string `yaml:"default_chat_template_kwargs"`
}

// DefaultBlockSize is vLLM's default KV block size.
const DefaultBlockSize = 16

// SetDefaults fills the defaults of a model entry (block size 16).
func (m *ModelConfig) SetDefaults() { m.BlockSize = DefaultBlockSize }

// Validate checks that the tokenizer is named exactly one way and the block size.
func (m *ModelConfig) Validate() error {
	var errs field.Errors
	files := m.TokenizerJSON != "" || m.TokenizerConfig != ""
	switch {
	case m.Tokenizer != "" && files:
		errs.Addf("tokenizer", "set either tokenizer (a directory) or tokenizer_json and tokenizer_config, not both")
	case m.Tokenizer == "" && !files:
		errs.Addf("tokenizer", "is required (a directory), or set tokenizer_json and tokenizer_config")
	case files && m.TokenizerJSON == "":
		errs.Addf("tokenizer_json", "is required with tokenizer_config")
	case files && m.TokenizerConfig == "":
		errs.Addf("tokenizer_config", "is required with tokenizer_json")
	}
	if m.BlockSize < 1 || m.BlockSize > 4096 {
		errs.Addf("block_size", "%d is out of range [1, 4096]", m.BlockSize)
	}
	if m.DefaultChatTemplateKwargs != "" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(m.DefaultChatTemplateKwargs), &obj); err != nil || obj == nil {
			errs.Addf("default_chat_template_kwargs", "must be a JSON object")
		}
	}
	return errs.Err()
}

// PolicyConfig chooses the routing policy and tunes it, one typed section per policy
// that has knobs (policy.kv, policy.placement; see policy.Config).
type PolicyConfig struct {
	// Name is the policy used when the request's tokens are known (policy.Builtin's names).
	Name string `yaml:"name"`
	// Fallback is the policy used when they are not (no tokenizer for the model,
	// unparsable body); it must be load-only.
	Fallback string `yaml:"fallback"`
	// Weights is the former untyped map of every policy's knobs, replaced by the typed
	// sections: any entry is refused with the name it now has.
	Weights map[string]float64 `yaml:"weights"`
	// Config holds the typed sections, kv and placement.
	policy.Config `yaml:",inline"`
}

// DefaultPolicyConfig returns placement (requests the router cannot tokenize are placed
// by load) with least-load as the fallback, and every section's defaults.
func DefaultPolicyConfig() PolicyConfig {
	return PolicyConfig{Name: "placement", Fallback: "least-load", Config: policy.DefaultConfig()}
}

// movedWeight maps a former policy.weights names to their place in the typed sections.
func movedWeight(name string) string {
	switch name {
	case "prefill_load_scale", "overlap_credit", "decode_active_request_weight", "temperature":
		return "policy.kv." + name
	case "hold_fraction":
		return "policy.placement.holder_share"
	case "hold_max_ms", "hold_step_ms":
		return "policy.placement." + strings.TrimSuffix(name, "_ms") + " (a duration, e.g. 120ms)"
	case "block_size":
		return "models.*.block_size (the model's block size)"
	}
	if slices.Contains(placement.KnobNames(), name) {
		return "policy.placement." + name
	}
	return ""
}

// Validate checks the names against the policy registry and every section.
func (c *PolicyConfig) Validate() error {
	var errs field.Errors
	reg := policy.Builtin()
	if _, ok := reg.Lookup(c.Name); !ok {
		errs.Addf("name", "unknown policy %q (known: %s)", c.Name, strings.Join(reg.Names(), ", "))
	}
	if fb := reg.FallbackNames(); !slices.Contains(fb, c.Fallback) {
		errs.Addf("fallback", "policy %q cannot be the fallback (allowed: %s)", c.Fallback, strings.Join(fb, ", "))
	}
	for _, k := range slices.Sorted(maps.Keys(c.Weights)) {
		if to := movedWeight(k); to != "" {
			errs.Addf(field.Key("weights", k), "policy.weights was replaced by typed sections: set %s", to)
		} else {
			errs.Addf(field.Key("weights", k), "policy.weights was replaced by typed sections (policy.kv, policy.placement), which have no %q", k)
		}
	}
	errs.Nest(policy.SectionKV, c.KV.Validate())
	errs.Nest(policy.SectionPlacement, c.Placement.Validate())
	return errs.Err()
}

// LimitsConfig bounds sizes and times.
type LimitsConfig struct {
	// MaxBodyBytes is the largest request body the router reads to route; a larger body
	// is routed by load (default 16 MiB).
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// DrainTimeout bounds how long in-flight streams may run on after SIGTERM.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// MaxHold bounds how long the router may take to answer a request the policy asks to
	// hold (placement's hold_max), counted from the start of the decision: parsing,
	// tokenization and earlier holds count (0 never holds). Envoy's ext_proc
	// message_timeout (200ms unless set) runs meanwhile in every body mode but
	// FULL_DUPLEX_STREAMED, so it must stay well under it (at most 500ms). Default 120ms
	// (extproc.DefaultMaxHold): 80ms under Envoy's default message_timeout.
	MaxHold time.Duration `yaml:"max_hold"`
	// BodyBudgetBytes bounds the request-body bytes all ext_proc streams together hold
	// for parsing; a body that would pass it is routed by load, streamed through unparsed
	// and counted (kvrouter_request_parse_errors_total{reason="body_budget"}). Parsing,
	// rendering and tokenizing a body take a few times its size, so this bounds memory
	// per request by config rather than by clients. Default 64 MiB: four bodies of the
	// default max_body_bytes, or some 16,000 typical 4 KiB chat bodies, at once.
	BodyBudgetBytes int64 `yaml:"body_budget_bytes"`
	// MaxConnections bounds the ext_proc port's accepted connections; more wait in the
	// kernel's backlog, so file descriptors stay for the admin port, KV events and
	// scrapes. Default 4096: Envoy opens one HTTP/2 connection per worker thread, so
	// this serves 256 gateways of 16 workers.
	MaxConnections int `yaml:"max_connections"`
	// MaxStreams bounds the open ext_proc streams (one per HTTP request, generation
	// included); one more is refused with RESOURCE_EXHAUSTED. It is also each
	// connection's HTTP/2 stream limit. Default 16384: 500 req/s of 30 s requests; an
	// open stream costs some 20 KiB, so at most ~330 MiB.
	MaxStreams int `yaml:"max_streams"`
	// StreamIdleTimeout ends an ext_proc stream that sends no message this long after
	// it opened; a drain ends such streams at once. Default 10s: Envoy opens a stream
	// with the request headers, so a stream silent this long is not a request.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// ShedQueueDepth > 0 sheds load: a request is answered 429 (with Retry-After) when
	// every endpoint eligible for it has more than this many requests waiting in its
	// queue (vllm:num_requests_waiting, from fresh scrapes). Default 0: never shed.
	ShedQueueDepth int `yaml:"shed_queue_depth"`
	// RetryAfter is the Retry-After of 429 and 503 answers, in whole seconds (rounded up).
	// Default 1s (extproc.DefaultRetryAfter): one scrape interval, after which the
	// router's view of the queues is new.
	RetryAfter time.Duration `yaml:"retry_after"`
	// Scrape tunes the scraping of each endpoint's /metrics.
	Scrape fleet.ScrapeConfig `yaml:",inline"`
}

// DefaultLimitsConfig returns 16 MiB bodies, a 64 MiB body budget, 4096 connections,
// 16384 streams, a 10s stream idle timeout, a 30s drain, 120ms holds and the scrape
// defaults.
func DefaultLimitsConfig() LimitsConfig {
	return LimitsConfig{
		MaxBodyBytes:      16 << 20,
		BodyBudgetBytes:   64 << 20,
		MaxConnections:    4096,
		MaxStreams:        16384,
		StreamIdleTimeout: 10 * time.Second,
		DrainTimeout:      30 * time.Second,
		MaxHold:           extproc.DefaultMaxHold,
		RetryAfter:        extproc.DefaultRetryAfter,
		Scrape:            fleet.DefaultScrapeConfig(),
	}
}

// Validate checks the ranges.
func (c *LimitsConfig) Validate() error {
	var errs field.Errors
	if c.MaxBodyBytes < 1<<10 || c.MaxBodyBytes > 1<<30 {
		errs.Addf("max_body_bytes", "%d is out of range [1 KiB, 1 GiB]", c.MaxBodyBytes)
	}
	if c.BodyBudgetBytes < int64(c.MaxBodyBytes) || c.BodyBudgetBytes > 64<<30 {
		errs.Addf("body_budget_bytes", "%d is out of range [max_body_bytes (%d), 64 GiB] (a body of max_body_bytes must fit)", c.BodyBudgetBytes, c.MaxBodyBytes)
	}
	if c.MaxConnections < 1 || c.MaxConnections > 1<<20 {
		errs.Addf("max_connections", "%d is out of range [1, 1048576]", c.MaxConnections)
	}
	if c.MaxStreams < 1 || c.MaxStreams > 1<<20 {
		errs.Addf("max_streams", "%d is out of range [1, 1048576]", c.MaxStreams)
	}
	if c.StreamIdleTimeout < 100*time.Millisecond || c.StreamIdleTimeout > time.Hour {
		errs.Addf("stream_idle_timeout", "%v is out of range [100ms, 1h]", c.StreamIdleTimeout)
	}
	if c.DrainTimeout < 0 || c.DrainTimeout > time.Hour {
		errs.Addf("drain_timeout", "%v is out of range [0, 1h]", c.DrainTimeout)
	}
	if c.MaxHold < 0 || c.MaxHold > 500*time.Millisecond {
		errs.Addf("max_hold", "%v is out of range [0, 500ms] (Envoy's ext_proc message_timeout runs while a request is held)", c.MaxHold)
	}
	if c.ShedQueueDepth < 0 || c.ShedQueueDepth > 1_000_000 {
		errs.Addf("shed_queue_depth", "%d is out of range [0, 1000000] (0 never sheds)", c.ShedQueueDepth)
	}
	if c.RetryAfter < time.Second || c.RetryAfter > time.Hour {
		errs.Addf("retry_after", "%v is out of range [1s, 1h] (Retry-After counts whole seconds)", c.RetryAfter)
	}
	errs.Nest("", c.Scrape.Validate())
	return errs.Err()
}

// Problem is one thing wrong with a configuration file.
type Problem struct {
	// Line is the 1-based line the problem is on (the line of the field, or of its
	// closest enclosing field when the field is missing).
	Line int
	// Path names the field, e.g. "endpoints[1].address"; empty for a syntax error.
	Path string
	// Msg says what is wrong.
	Msg string
}

// Error lists every problem found in one file. Load returns it (use errors.As) when the
// file is unreadable as YAML or breaks any rule.
type Error struct {
	File     string
	Problems []Problem
}

// Error prints the problems one per line as "FILE:LINE: field.path: message".
func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s:%d: ", e.File, p.Line)
		if p.Path != "" {
			b.WriteString(p.Path + ": ")
		}
		b.WriteString(p.Msg)
	}
	return b.String()
}

// Load reads, decodes and validates the file at path, and checks that the files it
// names exist (relative paths are resolved against the file's directory). Every problem
// is reported, not just the first: the error is an *Error unless the file cannot be read.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	base, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parse(data, path, base)
}

// Parse decodes and validates a configuration document; file names it in errors. It
// touches no file system path (Load does).
func Parse(data []byte, file string) (*Config, error) {
	return parse(data, file, "")
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parse decodes and validates; when base is not empty it also resolves and checks the
// model file paths.
func parse(data []byte, file, base string) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		p := Problem{Line: 1, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			p.Line, _ = strconv.Atoi(m[1])
			p.Msg = m[2]
		}
		return nil, &Error{File: file, Problems: []Problem{p}}
	}
	cfg := Default()
	d := &decoder{lines: map[string]int{}}
	if len(root.Content) == 0 {
		d.addf(1, "", "the file is empty")
		return nil, &Error{File: file, Problems: d.problems}
	}
	d.decode(&root, reflect.ValueOf(&cfg).Elem(), "")

	// A field that failed to decode keeps its default; validating that default would
	// report a second, misleading problem, so rules on such fields are skipped.
	bad := map[string]bool{}
	for _, p := range d.problems {
		bad[p.Path] = true
	}
	var errs field.Errors
	errs.Nest("", cfg.Validate())
	if base != "" {
		errs = append(errs, resolveFiles(&cfg, base)...)
	}
	for _, e := range errs {
		if underBad(e.Path, bad) {
			continue
		}
		d.problems = append(d.problems, Problem{Line: d.lineOf(e.Path), Path: e.Path, Msg: e.Msg})
	}
	if len(d.problems) > 0 {
		slices.SortStableFunc(d.problems, func(a, b Problem) int { return a.Line - b.Line })
		return nil, &Error{File: file, Problems: d.problems}
	}
	return &cfg, nil
}

func underBad(path string, bad map[string]bool) bool {
	for p := path; p != ""; p = parent(p) {
		if bad[p] {
			return true
		}
	}
	return false
}

// resolveFiles makes the model and TLS file paths absolute against base and checks they
// exist (and that the TLS files load).
func resolveFiles(cfg *Config, base string) field.Errors {
	var errs field.Errors
	for _, name := range slices.Sorted(maps.Keys(cfg.Models)) {
		m := cfg.Models[name]
		p := field.Key("models", name)
		for _, f := range []struct {
			path string
			val  *string
			dir  bool
		}{{"tokenizer", &m.Tokenizer, true}, {"tokenizer_json", &m.TokenizerJSON, false}, {"tokenizer_config", &m.TokenizerConfig, false}} {
			if *f.val == "" {
				continue
			}
			if !filepath.IsAbs(*f.val) {
				*f.val = filepath.Join(base, *f.val)
			}
			if msg := checkPath(*f.val, f.dir); msg != "" {
				errs.Addf(field.Join(p, f.path), "%s", msg)
			}
		}
		cfg.Models[name] = m
	}
	// The ext_proc port's certificate files: resolved, then loaded as start-up does (a
	// key of another certificate, a CA bundle without a certificate).
	t := &cfg.Listen.TLS
	missing := false
	for _, f := range []struct {
		path string
		val  *string
	}{{"cert_file", &t.CertFile}, {"key_file", &t.KeyFile}, {"client_ca_file", &t.ClientCAFile}} {
		if *f.val == "" {
			continue
		}
		if !filepath.IsAbs(*f.val) {
			*f.val = filepath.Join(base, *f.val)
		}
		if msg := checkPath(*f.val, false); msg != "" {
			errs.Addf(field.Join("listen.tls", f.path), "%s", msg)
			missing = true
		}
	}
	if !missing && t.Validate() == nil {
		errs.Nest("listen.tls", t.Check())
	}
	return errs
}

func checkPath(p string, dir bool) string {
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("%s does not exist", p)
	case err != nil:
		return err.Error()
	case dir && !st.IsDir():
		return fmt.Sprintf("%s is not a directory", p)
	case !dir && st.IsDir():
		return fmt.Sprintf("%s is a directory, want a file", p)
	}
	return ""
}

// KVConfig tunes the KV-cache path. Every field has a default.
type KVConfig struct {
	// Index bounds the block index's memory per endpoint rank.
	Index index.Config `yaml:"index"`
	// Events tunes the ZeroMQ KV-event subscriber (reconnects and replay).
	Events EventsConfig `yaml:"events"`
	// ApproxBlocks sizes an endpoint's predicted cache (approximate policy, and kv for an
	// endpoint without healthy events) until its num_gpu_blocks is scraped.
	ApproxBlocks int `yaml:"approx_blocks"`
	// MaxTracked bounds the requests the kv and approximate policies follow between
	// routing and completion.
	MaxTracked int `yaml:"max_tracked"`
	// HealthRefresh is how often the kv policy re-reads which endpoints' event streams
	// are connected.
	HealthRefresh time.Duration `yaml:"health_refresh"`
	// EventsStaleAfter: an endpoint busy with requests whose event stream has been silent
	// this long is treated as not publishing (scored by prediction) until a batch arrives.
	EventsStaleAfter time.Duration `yaml:"events_stale_after"`
}

// EventsConfig tunes the KV-event subscriber; see kvevents.Config.
type EventsConfig struct {
	Watchdog        time.Duration `yaml:"watchdog"`
	BackoffMin      time.Duration `yaml:"backoff_min"`
	BackoffMax      time.Duration `yaml:"backoff_max"`
	ReplayIdle      time.Duration `yaml:"replay_idle"`
	ReplayTimeout   time.Duration `yaml:"replay_timeout"`
	ReplayMaxRounds int           `yaml:"replay_max_rounds"`
	// MaxMessageBytes bounds one event message (live or replayed): a longer one is
	// dropped and counted and its stream sees a gap.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// HandshakeTimeout bounds connecting to a publisher or replay socket and its ZMTP
	// handshake (and, in central mode, a connecting publisher's handshake).
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
}

// DefaultKVConfig returns the index, subscriber and policy defaults.
func DefaultKVConfig() KVConfig {
	k := scoring.DefaultKVConfig()
	e := kvevents.DefaultConfig()
	return KVConfig{
		Index: index.DefaultConfig(),
		Events: EventsConfig{Watchdog: e.Watchdog, BackoffMin: e.BackoffMin, BackoffMax: e.BackoffMax,
			ReplayIdle: e.ReplayIdle, ReplayTimeout: e.ReplayTimeout, ReplayMaxRounds: e.ReplayMaxRounds,
			MaxMessageBytes: e.MaxMessageBytes, HandshakeTimeout: e.HandshakeTimeout},
		ApproxBlocks:     k.ApproxBlocks,
		MaxTracked:       k.MaxTracked,
		HealthRefresh:    250 * time.Millisecond,
		EventsStaleAfter: 10 * time.Second,
	}
}

// Subscriber returns the subscriber's configuration (no endpoints: the runner adds them
// from the fleet).
func (c *KVConfig) Subscriber() kvevents.Config {
	e := c.Events
	return kvevents.Config{Watchdog: e.Watchdog, BackoffMin: e.BackoffMin, BackoffMax: e.BackoffMax,
		ReplayIdle: e.ReplayIdle, ReplayTimeout: e.ReplayTimeout, ReplayMaxRounds: e.ReplayMaxRounds,
		MaxMessageBytes: e.MaxMessageBytes, HandshakeTimeout: e.HandshakeTimeout}
}

// Subscriber returns the KV-event subscriber's whole configuration: KV.Subscriber()
// plus, in central mode, the bound socket from discovery.kv_events.
func (c *Config) Subscriber() kvevents.Config {
	sc := c.KV.Subscriber()
	if ev := c.Discovery.KVEvents; ev.Mode == discovery.ModeCentral {
		sc.Bind, sc.AnySource = ev.Bind, ev.AnySource
	}
	return sc
}

// Validate checks the ranges.
func (c *KVConfig) Validate() error {
	var errs field.Errors
	ix := c.Index
	if ix.DefaultBlocksPerRank < 1 {
		errs.Addf("index.default_blocks_per_rank", "%d must be at least 1", ix.DefaultBlocksPerRank)
	}
	if !(ix.Headroom >= 1) {
		errs.Addf("index.headroom", "%v must be at least 1", ix.Headroom)
	}
	if ix.MaxBlocksPerRank < 1 {
		errs.Addf("index.max_blocks_per_rank", "%d must be at least 1", ix.MaxBlocksPerRank)
	} else if ix.DefaultBlocksPerRank > ix.MaxBlocksPerRank {
		errs.Addf("index.default_blocks_per_rank", "%d exceeds max_blocks_per_rank (%d)", ix.DefaultBlocksPerRank, ix.MaxBlocksPerRank)
	}
	if ix.DefaultBlocksPerRank >= 1 && ix.Headroom >= 1 && ix.MaxBlocksPerRank >= ix.DefaultBlocksPerRank {
		if err := ix.Validate(); err != nil {
			errs.Addf("index", "%v", err)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"watchdog", c.Events.Watchdog}, {"backoff_min", c.Events.BackoffMin}, {"backoff_max", c.Events.BackoffMax},
		{"replay_idle", c.Events.ReplayIdle}, {"replay_timeout", c.Events.ReplayTimeout},
		{"handshake_timeout", c.Events.HandshakeTimeout}} {
		if d.v <= 0 || d.v > time.Hour {
			errs.Addf("events."+d.name, "%v is out of range (0, 1h]", d.v)
		}
	}
	if c.Events.BackoffMin > c.Events.BackoffMax {
		errs.Addf("events.backoff_min", "%v exceeds backoff_max (%v)", c.Events.BackoffMin, c.Events.BackoffMax)
	}
	if c.Events.ReplayMaxRounds < 1 {
		errs.Addf("events.replay_max_rounds", "%d must be at least 1", c.Events.ReplayMaxRounds)
	}
	// vLLM batches a few hundred events (tens of KB); 64 KiB leaves no room for a large
	// batch, 1 GiB is where the client ends the connection anyway.
	if c.Events.MaxMessageBytes < 64<<10 || c.Events.MaxMessageBytes > 1<<30 {
		errs.Addf("events.max_message_bytes", "%d is out of range [64 KiB, 1 GiB]", c.Events.MaxMessageBytes)
	}
	if c.ApproxBlocks < 1 {
		errs.Addf("approx_blocks", "%d must be at least 1", c.ApproxBlocks)
	}
	if c.MaxTracked < 1 {
		errs.Addf("max_tracked", "%d must be at least 1", c.MaxTracked)
	}
	if c.HealthRefresh < time.Millisecond || c.HealthRefresh > time.Minute {
		errs.Addf("health_refresh", "%v is out of range [1ms, 1m]", c.HealthRefresh)
	}
	if c.EventsStaleAfter < 10*time.Millisecond || c.EventsStaleAfter > time.Hour {
		errs.Addf("events_stale_after", "%v is out of range [10ms, 1h]", c.EventsStaleAfter)
	}
	return errs.Err()
}

// CheckRankPorts checks that an endpoint's per-rank KV-event addresses follow vLLM's
// data-parallel layout, rank r on the first address's port + r (and the same for the
// replay addresses), which is what the subscriber dials.
func CheckRankPorts(c fleet.KVEventsConfig) error {
	for _, list := range [][]string{c.Endpoints, c.ReplayEndpoints} {
		if len(list) < 2 {
			continue
		}
		host, port, ok := splitTCP(list[0])
		if !ok {
			continue // reported by the endpoint's own validation
		}
		for r, a := range list[1:] {
			h, p, ok := splitTCP(a)
			if ok && (h != host || p != port+r+1) {
				return fmt.Errorf("rank %d is %q; vLLM's rank %d publishes on %s:%d (first rank's port + rank)", r+1, a, r+1, host, port+r+1)
			}
		}
	}
	return nil
}

func splitTCP(a string) (string, int, bool) {
	rest, ok := strings.CutPrefix(a, "tcp://")
	if !ok {
		return "", 0, false
	}
	h, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, false
	}
	n, err := strconv.Atoi(p)
	return h, n, err == nil
}
