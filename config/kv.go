package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/config/field"
	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/scoring"
)

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
			errs.Addf(field.Join("events", d.name), "%v is out of range (0, 1h]", d.v)
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
