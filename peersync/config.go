package peersync

import (
	"net"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/config/field"
)

// Config is the `replicas:` section: how kvrouter replicas find each other and share
// their in-flight state. Sharing is on when Peers is not empty.
type Config struct {
	// Peers are the other replicas' gossip addresses, host:port. A DNS name resolves to
	// all its addresses, so the kvrouter headless Service's name (the chart's default)
	// finds every replica; this replica's own address is skipped. Default none (off).
	Peers []string `yaml:"peers"`
	// Name is this replica's name among its peers, unique (the chart passes the pod
	// name). Default: the host name.
	Name string `yaml:"name"`
	// Bind is the gossip listen address (UDP for state and probes, TCP for joins).
	// Default ":7946", memberlist's port.
	Bind string `yaml:"bind"`
	// Advertise is the address peers reach this replica on. Default: derived from Bind
	// (the first private address when Bind is unspecified).
	Advertise string `yaml:"advertise"`
	// Interval is how often the replica sends its state to its peers when it has
	// changed. Default 10ms: a fifth of a reference request's decode, so a peer's view
	// lags one in-flight change by ~5 ms on average.
	Interval time.Duration `yaml:"interval"`
	// Expiry is how long a peer's state counts after its last message: a replica that
	// goes silent (killed, partitioned) leaves no phantom load beyond it; an unchanged
	// state is repeated every Expiry/4. Default 2s: longer than a GC pause or a
	// scheduling hiccup, shorter than a restart.
	Expiry time.Duration `yaml:"expiry"`
	// JoinInterval is how often the replica joins Peers again while it has fewer members
	// than addresses they resolve to, which heals a partition and finds scaled-up
	// replicas. Default 5s, discovery.dns's interval.
	JoinInterval time.Duration `yaml:"join_interval"`
}

// DefaultConfig returns the defaults above (sharing off).
func DefaultConfig() Config {
	return Config{Bind: ":7946", Interval: 10 * time.Millisecond, Expiry: 2 * time.Second, JoinInterval: 5 * time.Second}
}

// Enabled reports whether replicas share state.
func (c *Config) Enabled() bool { return len(c.Peers) > 0 }

// Validate reports every invalid field.
func (c *Config) Validate() error {
	var errs field.Errors
	for i, p := range c.Peers {
		if _, err := hostPort(p); err != nil {
			errs.Addf(field.Index("peers", i), "%q: %v", p, err)
		}
	}
	if _, err := hostPort(c.Bind); err != nil {
		errs.Addf("bind", "%q: %v", c.Bind, err)
	}
	if c.Advertise != "" {
		if h, err := hostPort(c.Advertise); err != nil {
			errs.Addf("advertise", "%q: %v", c.Advertise, err)
		} else if net.ParseIP(h) == nil {
			errs.Addf("advertise", "%q: the host must be an IP address", c.Advertise)
		}
	}
	if c.Interval < time.Millisecond || c.Interval > time.Second {
		errs.Addf("interval", "%v is out of range [1ms, 1s]", c.Interval)
	}
	if c.Expiry < 4*c.Interval || c.Expiry > time.Minute {
		errs.Addf("expiry", "%v is out of range [4 x interval, 1m]", c.Expiry)
	}
	if c.JoinInterval < time.Second || c.JoinInterval > time.Hour {
		errs.Addf("join_interval", "%v is out of range [1s, 1h]", c.JoinInterval)
	}
	return errs.Err()
}

func hostPort(s string) (string, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", err
	}
	if n, err := strconv.Atoi(p); err != nil || n < 0 || n > 65535 {
		return "", strconv.ErrRange
	}
	return h, nil
}
