package kvevents

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Config is the subscriber's behaviour. Zero durations take the defaults of
// DefaultConfig when passed to NewSubscriber.
type Config struct {
	// Endpoints are subscribed from the start; more can be added at run time with Add.
	Endpoints []EndpointConfig `yaml:"endpoints"`
	// Topic is the subscription prefix ("" subscribes to everything, vLLM's default topic).
	Topic string `yaml:"topic"`
	// Watchdog: a stream whose peer went away (or was never reached) and that receives
	// nothing for this long is torn down and redialled on a fresh socket.
	Watchdog time.Duration `yaml:"watchdog"`
	// BackoffMin and BackoffMax bound the delay between dial attempts; it doubles after
	// every watchdog redial that brings no message and resets on the first message.
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
	// ReplayIdle ends a replay round when no reply arrives for this long (vLLM's replay
	// socket often loses the END marker).
	ReplayIdle time.Duration `yaml:"replay_idle"`
	// ReplayTimeout bounds one whole recovery (all rounds).
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// ReplayMaxRounds bounds the rounds of one recovery.
	ReplayMaxRounds int `yaml:"replay_max_rounds"`
}

// EndpointConfig is one vLLM pod's event publisher.
type EndpointConfig struct {
	// Name identifies the endpoint to the Sink (for example the pod's serving address,
	// "10.0.0.7:8000"); unique per subscriber.
	Name string `yaml:"name"`
	// Address is the PUB socket to dial, "tcp://host:port" (vLLM's default port 5557).
	Address string `yaml:"address"`
	// ReplayAddress is vLLM's replay ROUTER socket, "tcp://host:port"; empty when the pod
	// runs without replay_endpoint.
	ReplayAddress string `yaml:"replay_address"`
	// DPRanks is the number of data-parallel ranks (default 1). Rank r publishes on the
	// port of Address plus r, and replays on the port of ReplayAddress plus r.
	DPRanks int `yaml:"dp_ranks"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Watchdog:        10 * time.Second,
		BackoffMin:      250 * time.Millisecond,
		BackoffMax:      30 * time.Second,
		ReplayIdle:      300 * time.Millisecond,
		ReplayTimeout:   10 * time.Second,
		ReplayMaxRounds: 50,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Watchdog <= 0 {
		c.Watchdog = d.Watchdog
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = d.BackoffMin
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = d.BackoffMax
	}
	if c.ReplayIdle <= 0 {
		c.ReplayIdle = d.ReplayIdle
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = d.ReplayTimeout
	}
	if c.ReplayMaxRounds <= 0 {
		c.ReplayMaxRounds = d.ReplayMaxRounds
	}
	return c
}

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	if c.BackoffMin > 0 && c.BackoffMax > 0 && c.BackoffMin > c.BackoffMax {
		return errors.New("kvevents: backoff_min exceeds backoff_max")
	}
	seen := map[string]bool{}
	for _, e := range c.Endpoints {
		if err := e.Validate(); err != nil {
			return err
		}
		if seen[e.Name] {
			return fmt.Errorf("kvevents: endpoint %q listed twice", e.Name)
		}
		seen[e.Name] = true
	}
	return nil
}

// Validate reports an unusable endpoint.
func (e EndpointConfig) Validate() error {
	if e.Name == "" {
		return errors.New("kvevents: endpoint without a name")
	}
	if e.DPRanks < 0 || e.DPRanks > 1024 {
		return fmt.Errorf("kvevents: endpoint %q: dp_ranks %d out of range", e.Name, e.DPRanks)
	}
	if _, err := rankAddress(e.Address, e.ranks()-1); err != nil {
		return fmt.Errorf("kvevents: endpoint %q: %w", e.Name, err)
	}
	if e.ReplayAddress != "" {
		if _, err := rankAddress(e.ReplayAddress, e.ranks()-1); err != nil {
			return fmt.Errorf("kvevents: endpoint %q: replay: %w", e.Name, err)
		}
	}
	return nil
}

func (e EndpointConfig) ranks() int {
	if e.DPRanks <= 0 {
		return 1
	}
	return e.DPRanks
}

// rankAddress offsets the port of a tcp address by rank, as vLLM does for its
// data-parallel publishers.
func rankAddress(addr string, rank int) (string, error) {
	if !strings.HasPrefix(addr, "tcp://") {
		if rank == 0 && (strings.HasPrefix(addr, "ipc://") || strings.HasPrefix(addr, "inproc://")) {
			return addr, nil
		}
		return "", fmt.Errorf("address %q: want tcp://host:port", addr)
	}
	i := strings.LastIndexByte(addr, ':')
	port, err := strconv.Atoi(addr[i+1:])
	if i < len("tcp://") || err != nil || port <= 0 || port+rank > 65535 {
		return "", fmt.Errorf("address %q: want tcp://host:port", addr)
	}
	return addr[:i+1] + strconv.Itoa(port+rank), nil
}
