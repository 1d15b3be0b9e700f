package discovery

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/fleet"
)

// Config is the discovery section of kvrouter's configuration file. At most one of
// Kubernetes and DNS is set; both unset means the static endpoint list only.
type Config struct {
	// Kubernetes finds vLLM pods through the Kubernetes API.
	Kubernetes *KubernetesConfig `yaml:"kubernetes"`
	// DNS finds vLLM pods from the A/AAAA records of a headless Service.
	DNS *DNSConfig `yaml:"dns"`
	// KVEvents says how the pods found publish their KV events.
	KVEvents KVEventsConfig `yaml:"kv_events"`
}

// DefaultConfig returns no discovery and per-pod KV events on port 5557.
func DefaultConfig() Config { return Config{KVEvents: DefaultKVEventsConfig()} }

// Enabled reports whether a discovery source is configured.
func (c *Config) Enabled() bool { return c.Kubernetes != nil || c.DNS != nil }

// Validate checks the section. Paths are relative to it ("kubernetes.port").
func (c *Config) Validate() error {
	var errs field.Errors
	if c.Kubernetes != nil && c.DNS != nil {
		errs.Addf("dns", "set either kubernetes or dns, not both")
	}
	if c.Kubernetes != nil {
		errs.Nest("kubernetes", c.Kubernetes.Validate())
	}
	if c.DNS != nil {
		errs.Nest("dns", c.DNS.Validate())
	}
	errs.Nest("kv_events", c.KVEvents.Validate())
	return errs.Err()
}

// Pod annotations read by the selector and inference_pool modes. Each overrides the
// configured default for its pod.
const (
	// AnnotationModels lists the served model names, comma-separated
	// ("Qwen/Qwen3-0.6B,Qwen/Qwen3-0.6B-fp8").
	AnnotationModels = "kvrouter.io/models"
	// AnnotationLoRAAdapters lists the loaded LoRA adapters as name=base_model pairs,
	// comma-separated ("sql-lora=Qwen/Qwen3-0.6B").
	AnnotationLoRAAdapters = "kvrouter.io/lora-adapters"
	// AnnotationDataParallelSize is the pod's vLLM --data-parallel-size: the pod
	// publishes KV events on ports kv_events.port + rank for each rank.
	AnnotationDataParallelSize = "kvrouter.io/data-parallel-size"
)

// TargetConfig is what every source needs to turn a pod address into an endpoint.
type TargetConfig struct {
	// Port is the vLLM HTTP port (the container port). With inference_pool it must be
	// left 0: the pool's targetPorts name the ports.
	Port int `yaml:"port"`
	// Models are the served model names of pods that carry no kvrouter.io/models
	// annotation (the only source of model names for service and dns).
	Models []string `yaml:"models"`
	// LoRAAdapters are the adapters of pods without a kvrouter.io/lora-adapters
	// annotation.
	LoRAAdapters []fleet.LoRAAdapter `yaml:"lora_adapters"`
	// MetricsPath is the path of vLLM's Prometheus endpoint on the HTTP port (default
	// "/metrics"); "-" means do not scrape.
	MetricsPath string `yaml:"metrics_path"`
	// UnreadyGrace is how long a pod that turned unready keeps its KV state (index
	// entries, event subscription) before it is removed; it receives no request
	// meanwhile. 0 removes it at once. Default 30s.
	UnreadyGrace time.Duration `yaml:"unready_grace"`
}

func defaultTargetConfig() TargetConfig {
	return TargetConfig{MetricsPath: "/metrics", UnreadyGrace: 30 * time.Second}
}

func (c *TargetConfig) validate(errs *field.Errors, portRequired bool) {
	switch {
	case portRequired && c.Port == 0:
		errs.Addf("port", "is required (the vLLM container's HTTP port)")
	case c.Port < 0 || c.Port > 65535:
		errs.Addf("port", "%d is out of range [1, 65535]", c.Port)
	}
	seen := map[string]bool{}
	for i, m := range c.Models {
		p := field.Index("models", i)
		switch {
		case strings.TrimSpace(m) == "" || strings.Contains(m, ","):
			errs.Addf(p, "%q is not a model name", m)
		case seen[m]:
			errs.Addf(p, "model %q is listed twice", m)
		}
		seen[m] = true
	}
	for i, a := range c.LoRAAdapters {
		p := field.Index("lora_adapters", i)
		if strings.TrimSpace(a.Name) == "" {
			errs.Addf(field.Join(p, "name"), "is required")
		}
		if a.BaseModel == "" {
			errs.Addf(field.Join(p, "base_model"), "is required")
		} else if len(c.Models) > 0 && !seen[a.BaseModel] {
			errs.Addf(field.Join(p, "base_model"), "%q is not one of models", a.BaseModel)
		}
	}
	if c.MetricsPath != "-" && !strings.HasPrefix(c.MetricsPath, "/") {
		errs.Addf("metrics_path", "%q must start with \"/\" (or be \"-\" for no scraping)", c.MetricsPath)
	}
	if c.UnreadyGrace < 0 || c.UnreadyGrace > time.Hour {
		errs.Addf("unready_grace", "%v is out of range [0, 1h]", c.UnreadyGrace)
	}
}

// KubernetesConfig finds pods through the Kubernetes API (in-cluster credentials, or
// Kubeconfig). Exactly one of Service, Selector and InferencePool is set.
type KubernetesConfig struct {
	// Namespace holds the Service, pods or InferencePool.
	Namespace string `yaml:"namespace"`
	// Service names a Service whose EndpointSlices list the pods.
	Service string `yaml:"service"`
	// Selector selects the pods by labels.
	Selector map[string]string `yaml:"selector"`
	// InferencePool names an InferencePool (inference.networking.k8s.io/v1): its label
	// selector picks the pods and its targetPorts the HTTP ports.
	InferencePool string `yaml:"inference_pool"`
	// Kubeconfig is a kubeconfig file for running outside the cluster; empty means the
	// in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig"`
	// TargetConfig is shared with dns.
	TargetConfig `yaml:",inline"`
}

// SetDefaults fills the defaults (metrics on /metrics, 30s grace).
func (c *KubernetesConfig) SetDefaults() { c.TargetConfig = defaultTargetConfig() }

var (
	dnsLabel    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelValue  = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`)
	labelName   = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	dnsSubdomai = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// IsObjectName reports whether s is a Kubernetes object name (metadata.name: a DNS
// subdomain of at most 253 characters).
func IsObjectName(s string) bool { return len(s) <= 253 && dnsSubdomai.MatchString(s) }

// Validate checks the mode and names.
func (c *KubernetesConfig) Validate() error {
	var errs field.Errors
	if c.Namespace == "" {
		errs.Addf("namespace", "is required")
	} else if !dnsLabel.MatchString(c.Namespace) || len(c.Namespace) > 63 {
		errs.Addf("namespace", "%q is not a namespace name", c.Namespace)
	}
	n := 0
	if c.Service != "" {
		n++
		if !dnsLabel.MatchString(c.Service) || len(c.Service) > 63 {
			errs.Addf("service", "%q is not a Service name", c.Service)
		}
	}
	if c.Selector != nil {
		n++
		if len(c.Selector) == 0 {
			errs.Addf("selector", "needs at least one label")
		}
		for _, k := range slices.Sorted(maps.Keys(c.Selector)) {
			if msg := checkLabel(k, c.Selector[k]); msg != "" {
				errs.Addf(field.Key("selector", k), "%s", msg)
			}
		}
	}
	if c.InferencePool != "" {
		n++
		if !IsObjectName(c.InferencePool) {
			errs.Addf("inference_pool", "%q is not an object name", c.InferencePool)
		}
	}
	if n != 1 {
		errs.Addf("", "set exactly one of service, selector and inference_pool (%d set)", n)
	}
	c.TargetConfig.validate(&errs, c.InferencePool == "")
	if c.InferencePool != "" && c.Port != 0 {
		errs.Addf("port", "must be left unset with inference_pool: the pool's targetPorts name the ports")
	}
	return errs.Err()
}

func checkLabel(k, v string) string {
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if !dnsSubdomai.MatchString(prefix) || len(prefix) > 253 {
			return fmt.Sprintf("label key %q has an invalid prefix", k)
		}
		name = rest
	}
	if len(name) > 63 || !labelName.MatchString(name) {
		return fmt.Sprintf("%q is not a label key", k)
	}
	if len(v) > 63 || !labelValue.MatchString(v) {
		return fmt.Sprintf("%q is not a label value", v)
	}
	return ""
}

// DNSConfig finds pods from the A and AAAA records of a headless Service, for
// deployments without access to the Kubernetes API. An address that leaves the answer
// is treated as unready (a headless Service publishes ready pods only): it keeps its KV
// state for unready_grace, then is removed.
type DNSConfig struct {
	// Name is the host name to resolve, e.g. "vllm-headless.default.svc.cluster.local".
	Name string `yaml:"name"`
	// Interval between two resolutions (default 5s).
	Interval time.Duration `yaml:"interval"`
	// TargetConfig is shared with kubernetes; Port and Models are required.
	TargetConfig `yaml:",inline"`
}

// SetDefaults fills the defaults (5s interval, metrics on /metrics, 30s grace).
func (c *DNSConfig) SetDefaults() {
	c.TargetConfig = defaultTargetConfig()
	c.Interval = 5 * time.Second
}

// Validate checks the name, interval, port and models.
func (c *DNSConfig) Validate() error {
	var errs field.Errors
	host := strings.TrimSuffix(c.Name, ".")
	switch {
	case c.Name == "":
		errs.Addf("name", "is required (the headless Service's DNS name)")
	case net.ParseIP(host) != nil || !dnsSubdomai.MatchString(host) || len(host) > 253:
		errs.Addf("name", "%q is not a DNS name", c.Name)
	}
	if c.Interval < time.Second || c.Interval > time.Hour {
		errs.Addf("interval", "%v is out of range [1s, 1h]", c.Interval)
	}
	c.TargetConfig.validate(&errs, true)
	if len(c.Models) == 0 {
		errs.Addf("models", "at least one served model name is required (DNS carries no annotations)")
	}
	return errs.Err()
}

// Events modes.
const (
	// ModePerPod: kvrouter dials every pod's ZeroMQ PUB socket (one SUB per pod and
	// rank). Works with any number of kvrouter replicas.
	ModePerPod = "per-pod"
	// ModeCentral: kvrouter binds one SUB socket that every pod's vLLM connects to,
	// each publishing the topic "kv@<pod-ip:port>@<model>" (kvevents.CentralTopic). Only
	// one kvrouter replica can receive a pod's events: see the package README.
	ModeCentral = "central"
)

// KVEventsConfig says how discovered pods publish KV events.
type KVEventsConfig struct {
	// Mode is "per-pod" (default) or "central".
	Mode string `yaml:"mode"`
	// Port is the PUB port of data-parallel rank 0 (vLLM's kv_events_config endpoint,
	// default 5557); rank r publishes on Port + r. Per-pod mode; 0 means the pods
	// publish no events.
	Port int `yaml:"port"`
	// ReplayPort is the ROUTER replay port of rank 0 on the pod (vLLM's
	// replay_endpoint, which it always binds); rank r uses ReplayPort + r. Both modes.
	// 0: no replay.
	ReplayPort int `yaml:"replay_port"`
	// Topic is the topic vLLM publishes on in per-pod mode (default empty). In central
	// mode the topic is fixed: kv@<pod-ip:port>@<model>.
	Topic string `yaml:"topic"`
	// DataParallelSize is the ranks per pod of pods without the
	// kvrouter.io/data-parallel-size annotation (default 1).
	DataParallelSize int `yaml:"data_parallel_size"`
	// Bind is the address kvrouter's SUB socket binds in central mode, "tcp://*:5557" or
	// "tcp://<ip>:5557"; rank r's publishers connect to its port + r, which kvrouter
	// binds too.
	Bind string `yaml:"bind"`
	// AnySource (central mode) accepts a message whose topic names an IP other than the
	// connection's source. Off by default: a connection may only speak for its own
	// address. Turn it on when a proxy hides the pods' addresses (an Istio sidecar on
	// kvrouter makes every connection come from 127.0.0.6).
	AnySource bool `yaml:"any_source"`
}

// DefaultKVEventsConfig returns per-pod mode on port 5557, one rank, no replay.
func DefaultKVEventsConfig() KVEventsConfig {
	return KVEventsConfig{Mode: ModePerPod, Port: 5557, DataParallelSize: 1}
}

// MaxDataParallelSize bounds data_parallel_size and the annotation.
const MaxDataParallelSize = 256

// Validate checks the mode and ports.
func (c *KVEventsConfig) Validate() error {
	var errs field.Errors
	switch c.Mode {
	case ModePerPod:
		if c.Bind != "" {
			errs.Addf("bind", "is only used with mode %q", ModeCentral)
		}
		if c.AnySource {
			errs.Addf("any_source", "is only used with mode %q", ModeCentral)
		}
		if c.ReplayPort != 0 && c.Port == 0 {
			errs.Addf("replay_port", "needs port (replay serves the events published there)")
		}
	case ModeCentral:
		if err := checkBind(c.Bind, c.DataParallelSize); err != nil {
			errs.Addf("bind", "%v", err)
		}
		if c.Topic != "" {
			errs.Addf("topic", "must be empty in central mode: pods publish on kv@<pod-ip:port>@<model>")
		}
	default:
		errs.Addf("mode", "unknown mode %q (%s or %s)", c.Mode, ModePerPod, ModeCentral)
	}
	for _, p := range []struct {
		name string
		v    int
	}{{"port", c.Port}, {"replay_port", c.ReplayPort}} {
		if p.v < 0 || p.v > 65535 {
			errs.Addf(p.name, "%d is out of range [1, 65535] (0: none)", p.v)
		}
	}
	if c.DataParallelSize < 1 || c.DataParallelSize > MaxDataParallelSize {
		errs.Addf("data_parallel_size", "%d is out of range [1, %d]", c.DataParallelSize, MaxDataParallelSize)
	}
	return errs.Err()
}

// checkBind checks central mode's bind address: "tcp://*:port" or "tcp://ip:port", with
// room for ranks ports from there. Not ipc://: vLLM binds (never connects) an ipc
// endpoint, so no pod could connect to it.
func checkBind(s string, ranks int) error {
	if s == "" {
		return fmt.Errorf("is required in central mode, e.g. \"tcp://*:5557\"")
	}
	scheme, rest, ok := strings.Cut(s, "://")
	switch {
	case !ok:
		return fmt.Errorf("%q is not a ZeroMQ address (tcp://*:port)", s)
	case scheme == "ipc":
		return fmt.Errorf("%q: vLLM binds an ipc:// endpoint instead of connecting to it: use tcp://*:port", s)
	case scheme != "tcp":
		return fmt.Errorf("%q: unsupported transport %q (tcp)", s, scheme)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return fmt.Errorf("%q: want tcp://*:port", s)
	}
	if host != "*" {
		if ip, err := netip.ParseAddr(host); err != nil || ip.Zone() != "" {
			return fmt.Errorf("%q: bind to \"*\" or an IP address", s)
		}
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("%q: port must be 1..65535", s)
	}
	if ranks > 1 && int(n)+ranks-1 > 65535 {
		return fmt.Errorf("%q: rank %d would connect to port %d, over 65535", s, ranks-1, int(n)+ranks-1)
	}
	return nil
}
