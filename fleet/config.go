package fleet

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/config/field"
)

// EndpointConfig describes one vLLM server (one pod, or one data-parallel group behind one
// HTTP address).
type EndpointConfig struct {
	// Address is the HTTP address Envoy connects to, "ip:port" (an IP, not a host name:
	// Envoy's ORIGINAL_DST cluster takes it verbatim).
	Address string `yaml:"address"`
	// Models are the served model names (vLLM's --served-model-name), at least one.
	Models []string `yaml:"models"`
	// LoRAAdapters are the adapters the server has loaded, each tied to one of Models.
	LoRAAdapters []LoRAAdapter `yaml:"lora_adapters"`
	// MetricsURL is the server's Prometheus endpoint, e.g. "http://10.0.0.5:8000/metrics".
	// Empty: the endpoint is never scraped and stays eligible, routed on the router's own
	// in-flight count only.
	MetricsURL string `yaml:"metrics_url"`
	// KVEvents is where the server publishes its KV cache events.
	KVEvents KVEventsConfig `yaml:"kv_events"`
}

// LoRAAdapter is one LoRA adapter an endpoint serves.
type LoRAAdapter struct {
	// Name is the adapter's served name, the "model" clients send.
	Name string `yaml:"name"`
	// BaseModel is the served name of the model the adapter applies to; it must be one of
	// the endpoint's models.
	BaseModel string `yaml:"base_model"`
}

// KVEventsConfig is where one endpoint publishes vLLM KV events over ZeroMQ.
type KVEventsConfig struct {
	// Endpoints are the ZeroMQ PUB endpoints, one per data-parallel rank, in rank order,
	// e.g. "tcp://10.0.0.5:5557". Empty: the endpoint publishes no events.
	Endpoints []string `yaml:"endpoints"`
	// Topic is the topic vLLM publishes on (its kv_events_config.topic; default empty).
	Topic string `yaml:"topic"`
	// ReplayEndpoints are the optional ZeroMQ ROUTER replay endpoints, one per rank in the
	// same order as Endpoints (or CentralRanks). Empty: no replay.
	ReplayEndpoints []string `yaml:"replay_endpoints"`
	// CentralRanks, when set, says the endpoint's vLLM is not dialled: its publishers
	// connect to kvrouter's bound socket (discovery.kv_events.mode: central), rank r
	// connecting to the bind port + r with the topic "kv@<address>@<model>". It lists
	// the data-parallel ranks this endpoint serves, consecutive ([0, 1] for a pod with
	// two ranks, [3] for rank 3 serving HTTP on its own port); Endpoints and Topic are
	// then empty.
	CentralRanks []int `yaml:"central_ranks"`
}

// MaxCentralRank bounds CentralRanks.
const MaxCentralRank = 1023

// Validate checks one endpoint on its own. Paths in the returned field.Errors are
// relative to the endpoint ("address", "lora_adapters[0].base_model").
func (c *EndpointConfig) Validate() error {
	var errs field.Errors
	if c.Address == "" {
		errs.Addf("address", "is required (ip:port)")
	} else if _, err := ParseAddress(c.Address); err != nil {
		errs.Addf("address", "%v", err)
	}
	if len(c.Models) == 0 {
		errs.Addf("models", "at least one served model name is required")
	}
	models := make(map[string]bool, len(c.Models))
	for i, m := range c.Models {
		p := field.Index("models", i)
		switch {
		case strings.TrimSpace(m) == "":
			errs.Addf(p, "model name is empty")
		case models[m]:
			errs.Addf(p, "model %q is listed twice", m)
		}
		models[m] = true
	}
	adapters := make(map[string]bool, len(c.LoRAAdapters))
	for i, a := range c.LoRAAdapters {
		p := field.Index("lora_adapters", i)
		switch {
		case strings.TrimSpace(a.Name) == "":
			errs.Addf(field.Join(p, "name"), "is required")
		case models[a.Name]:
			errs.Addf(field.Join(p, "name"), "adapter %q has the name of a served model", a.Name)
		case adapters[a.Name]:
			errs.Addf(field.Join(p, "name"), "adapter %q is listed twice", a.Name)
		}
		adapters[a.Name] = true
		switch {
		case a.BaseModel == "":
			errs.Addf(field.Join(p, "base_model"), "is required")
		case !models[a.BaseModel]:
			errs.Addf(field.Join(p, "base_model"), "%q is not one of this endpoint's models", a.BaseModel)
		}
	}
	if c.MetricsURL != "" {
		if err := checkHTTPURL(c.MetricsURL); err != nil {
			errs.Addf("metrics_url", "%v", err)
		}
	}
	errs.Nest("kv_events", c.KVEvents.Validate())
	return errs.Err()
}

// Validate checks the ZeroMQ endpoints.
func (c *KVEventsConfig) Validate() error {
	var errs field.Errors
	seen := map[string]bool{}
	for i, e := range c.Endpoints {
		p := field.Index("endpoints", i)
		if err := CheckZMQEndpoint(e); err != nil {
			errs.Addf(p, "%v", err)
		} else if seen[e] {
			errs.Addf(p, "%q is listed twice", e)
		}
		seen[e] = true
	}
	streams, per := len(c.Endpoints), "events endpoint"
	if len(c.CentralRanks) > 0 {
		streams, per = len(c.CentralRanks), "central rank"
		if len(c.Endpoints) > 0 {
			errs.Addf("central_ranks", "set either endpoints (kvrouter dials them) or central_ranks (they connect to kvrouter), not both")
		}
		if c.Topic != "" {
			errs.Addf("topic", "must be empty with central_ranks: the topic is kv@<address>@<model>")
		}
		for i, r := range c.CentralRanks {
			switch {
			case r < 0 || r > MaxCentralRank:
				errs.Addf(field.Index("central_ranks", i), "%d is out of range [0, %d]", r, MaxCentralRank)
			case i > 0 && r != c.CentralRanks[0]+i:
				errs.Addf(field.Index("central_ranks", i), "%d: ranks must be consecutive (%d)", r, c.CentralRanks[0]+i)
			}
		}
	}
	if len(c.ReplayEndpoints) > 0 && len(c.ReplayEndpoints) != streams {
		errs.Addf("replay_endpoints", "has %d entries; want one per %s (%d)",
			len(c.ReplayEndpoints), per, streams)
	}
	for i, e := range c.ReplayEndpoints {
		if err := CheckZMQEndpoint(e); err != nil {
			errs.Addf(field.Index("replay_endpoints", i), "%v", err)
		}
	}
	return errs.Err()
}

// ValidateEndpoints checks a static endpoint list: each endpoint, then the rules across
// endpoints (unique addresses; an adapter name tied to one base model everywhere).
// Paths are relative to the list ("[2].address").
func ValidateEndpoints(eps []EndpointConfig) error {
	var errs field.Errors
	addrs := map[string]int{}
	type origin struct {
		base string
		ep   int
	}
	adapters := map[string]origin{}
	models := map[string]int{}
	for i := range eps {
		for _, m := range eps[i].Models {
			if _, ok := models[m]; !ok {
				models[m] = i
			}
		}
	}
	for i := range eps {
		ep := &eps[i]
		p := field.Index("", i)
		errs.Nest(p, ep.Validate())
		if ep.Address != "" {
			if j, dup := addrs[ep.Address]; dup {
				errs.Addf(field.Join(p, "address"), "%s is also endpoint [%d]", ep.Address, j)
			} else {
				addrs[ep.Address] = i
			}
		}
		for k, a := range ep.LoRAAdapters {
			if a.Name == "" || a.BaseModel == "" {
				continue
			}
			if j, ok := models[a.Name]; ok && !slices.Contains(ep.Models, a.Name) {
				errs.Addf(field.Join(field.Index(field.Join(p, "lora_adapters"), k), "name"),
					"adapter %q has the name of a model served by endpoint [%d]", a.Name, j)
			} else if o, ok := adapters[a.Name]; ok && o.base != a.BaseModel {
				errs.Addf(field.Join(field.Index(field.Join(p, "lora_adapters"), k), "base_model"),
					"adapter %q has base model %q here but %q on endpoint [%d]", a.Name, a.BaseModel, o.base, o.ep)
			} else if !ok {
				adapters[a.Name] = origin{a.BaseModel, i}
			}
		}
	}
	return errs.Err()
}

// ParseAddress parses an endpoint address "ip:port" (IPv6 in brackets).
func ParseAddress(s string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q is not ip:port", s)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q: host must be an IP address, not a name (Envoy's ORIGINAL_DST cluster needs ip:port)", s)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return netip.AddrPort{}, fmt.Errorf("%q: port must be 1..65535", s)
	}
	return netip.AddrPortFrom(ip, uint16(n)), nil
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a URL", s)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: scheme must be http or https", s)
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", s)
	}
	return nil
}

// CheckZMQEndpoint checks a ZeroMQ endpoint the router connects to: "tcp://host:port"
// (a concrete host, not "*") or "ipc://path".
func CheckZMQEndpoint(s string) error {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return fmt.Errorf("%q is not a ZeroMQ endpoint (tcp://host:port or ipc://path)", s)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil || host == "" {
			return fmt.Errorf("%q: want tcp://host:port", s)
		}
		if host == "*" {
			return fmt.Errorf("%q: \"*\" is a bind address; name the host the router connects to", s)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("%q: port must be 1..65535", s)
		}
	case "ipc":
		if rest == "" {
			return fmt.Errorf("%q: ipc endpoint has no path", s)
		}
	default:
		return fmt.Errorf("%q: unsupported transport %q (tcp or ipc)", s, scheme)
	}
	return nil
}

// Config is what New needs: the static endpoints and the scrape settings.
type Config struct {
	Endpoints []EndpointConfig
	Scrape    ScrapeConfig
}

// Validate checks the endpoints and the scrape settings.
func (c *Config) Validate() error {
	var errs field.Errors
	errs.Nest("endpoints", ValidateEndpoints(c.Endpoints))
	errs.Nest("scrape", c.Scrape.Validate())
	return errs.Err()
}

// ScrapeConfig tunes how the fleet reads each endpoint's vLLM /metrics. It is part of
// the limits section of the configuration file.
type ScrapeConfig struct {
	// Interval between two scrapes of one endpoint.
	Interval time.Duration `yaml:"metrics_scrape_interval"`
	// Timeout bounds one scrape; at most Interval.
	Timeout time.Duration `yaml:"metrics_scrape_timeout"`
	// StalenessLimit is how old the last good scrape may be before policies stop seeing
	// its figures (scoring.Metrics.Valid false); at least Interval.
	StalenessLimit time.Duration `yaml:"metrics_staleness_limit"`
	// FailuresBeforeIneligible is how many scrapes in a row must fail before the endpoint
	// stops receiving requests; it is eligible again after one good scrape.
	FailuresBeforeIneligible int `yaml:"metrics_failures_before_ineligible"`
	// MaxBytes bounds the size of one /metrics response.
	MaxBytes int64 `yaml:"metrics_max_bytes"`
}

// DefaultScrapeConfig returns the defaults: every 1s, 900ms timeout, 5s staleness,
// 3 failures, 8 MiB.
func DefaultScrapeConfig() ScrapeConfig {
	return ScrapeConfig{
		Interval:                 time.Second,
		Timeout:                  900 * time.Millisecond,
		StalenessLimit:           5 * time.Second,
		FailuresBeforeIneligible: 3,
		MaxBytes:                 8 << 20,
	}
}

// Validate checks the ranges and the relations between the durations. Paths are the
// YAML field names.
func (c *ScrapeConfig) Validate() error {
	var errs field.Errors
	if c.Interval < 10*time.Millisecond || c.Interval > time.Hour {
		errs.Addf("metrics_scrape_interval", "%v is out of range [10ms, 1h]", c.Interval)
	}
	switch {
	case c.Timeout <= 0:
		errs.Addf("metrics_scrape_timeout", "must be positive")
	case c.Timeout > c.Interval:
		errs.Addf("metrics_scrape_timeout", "%v exceeds metrics_scrape_interval %v", c.Timeout, c.Interval)
	}
	if c.StalenessLimit < c.Interval {
		errs.Addf("metrics_staleness_limit", "%v is shorter than metrics_scrape_interval %v", c.StalenessLimit, c.Interval)
	}
	if c.FailuresBeforeIneligible < 1 || c.FailuresBeforeIneligible > 1000 {
		errs.Addf("metrics_failures_before_ineligible", "%d is out of range [1, 1000]", c.FailuresBeforeIneligible)
	}
	if c.MaxBytes < 1<<10 || c.MaxBytes > 1<<30 {
		errs.Addf("metrics_max_bytes", "%d is out of range [1 KiB, 1 GiB]", c.MaxBytes)
	}
	return errs.Err()
}
