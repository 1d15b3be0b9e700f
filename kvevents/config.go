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
	// Watchdog (per-pod mode): after Watchdog/2 without a byte from a ZMTP 3.1 publisher
	// (libzmq 4.2+; 3.0 peers such as zmq4 are never pinged) the subscriber sends a ZMTP
	// PING; a connection whose peer has answered PINGs before and that then receives
	// nothing, not even a PONG, for Watchdog is closed and redialled. It also sets TCP keepalive (idle Watchdog, 4 probes
	// Watchdog/4 apart) for peers that do not answer PINGs.
	Watchdog time.Duration `yaml:"watchdog"`
	// BackoffMin and BackoffMax bound the delay between dial attempts: a connection
	// that completed its handshake (and did not end in a protocol error) is redialled
	// after BackoffMin; each fruitless attempt doubles the delay up to BackoffMax.
	BackoffMin time.Duration `yaml:"backoff_min"`
	BackoffMax time.Duration `yaml:"backoff_max"`
	// ReplayIdle ends a replay round when no reply arrives for this long (vLLM's replay
	// socket often loses the END marker).
	ReplayIdle time.Duration `yaml:"replay_idle"`
	// ReplayTimeout bounds one whole recovery (all rounds).
	ReplayTimeout time.Duration `yaml:"replay_timeout"`
	// ReplayMaxRounds bounds the rounds of one recovery.
	ReplayMaxRounds int `yaml:"replay_max_rounds"`

	// Bind turns on central mode: the subscriber listens on this address,
	// "tcp://*:port" or "tcp://ip:port", for vLLM publishers that connect to it, rank r
	// of a pod connecting to port + r (vLLM offsets its endpoint's port by the
	// data-parallel rank). Each publisher names itself in its topic,
	// CentralTopic(address, model). Listening starts with Run (port + r once an
	// endpoint with rank r is added); only endpoints added as Central are fed.
	Bind string `yaml:"bind"`
	// AnySource accepts a central-mode message whose topic names an IP other than the
	// connection's source IP. By default such a message is dropped, so that a peer can
	// speak only for itself; set it when a proxy (an Istio sidecar, a NAT) hides the
	// publisher's address.
	AnySource bool `yaml:"any_source"`
	// MaxMessageBytes bounds one message, in both modes and on replay connections; a
	// longer one is read past (never buffered), dropped and counted, and its stream sees
	// a gap; one announcing more than 1 GiB (or MaxMessageBytes if larger) ends the
	// connection. Default 16 MiB.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// HandshakeTimeout bounds a ZMTP handshake: a dialled publisher's or replay socket's
	// (connect included), or a central-mode peer's. Default 10s.
	HandshakeTimeout time.Duration `yaml:"handshake_timeout"`
	// MaxPeers bounds the central-mode connections open at once; more are closed on
	// arrival. Default 4096.
	MaxPeers int `yaml:"max_peers"`
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
	// Topic is this endpoint's subscription prefix, overriding Config.Topic (per-pod
	// mode; vLLM's kv_events_config topic).
	Topic string `yaml:"topic"`
	// Central says the endpoint's publishers connect to the subscriber's Bind socket
	// instead of being dialled: Address is then empty and Name must be the ip:port its
	// topics carry. Its stream r (the Sink's rank r, r < DPRanks) is the publisher that
	// connects to Bind's port + FirstRank + r; replay is still dialled, at ReplayAddress
	// (plus r), since vLLM always binds its replay socket on the pod.
	Central bool `yaml:"central"`
	// FirstRank is the data-parallel rank of the endpoint's first stream in central
	// mode (non-zero for a pod whose ranks serve HTTP on separate ports).
	FirstRank int `yaml:"first_rank"`
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

		MaxMessageBytes:  16 << 20,
		HandshakeTimeout: 10 * time.Second,
		MaxPeers:         4096,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	defaultIfUnset(&c.Watchdog, d.Watchdog)
	defaultIfUnset(&c.BackoffMin, d.BackoffMin)
	defaultIfUnset(&c.BackoffMax, d.BackoffMax)
	defaultIfUnset(&c.ReplayIdle, d.ReplayIdle)
	defaultIfUnset(&c.ReplayTimeout, d.ReplayTimeout)
	defaultIfUnset(&c.ReplayMaxRounds, d.ReplayMaxRounds)
	defaultIfUnset(&c.MaxMessageBytes, d.MaxMessageBytes)
	defaultIfUnset(&c.HandshakeTimeout, d.HandshakeTimeout)
	defaultIfUnset(&c.MaxPeers, d.MaxPeers)
	return c
}

// defaultIfUnset sets *v to d when it is zero or negative (unset or meaningless).
func defaultIfUnset[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	if c.BackoffMin > 0 && c.BackoffMax > 0 && c.BackoffMin > c.BackoffMax {
		return errors.New("kvevents: backoff_min exceeds backoff_max")
	}
	if c.Bind != "" {
		if _, err := bindAddress(c.Bind, 0); err != nil {
			return err
		}
	}
	seen := map[string]bool{}
	for _, e := range c.Endpoints {
		if err := e.Validate(); err != nil {
			return err
		}
		if e.Central && c.Bind == "" {
			return fmt.Errorf("kvevents: endpoint %q is central but no bind address is set", e.Name)
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
	if e.Central {
		if e.Address != "" {
			return fmt.Errorf("kvevents: endpoint %q: a central endpoint has no address to dial", e.Name)
		}
		if _, err := parseAddrPort(e.Name); err != nil {
			return fmt.Errorf("kvevents: central endpoint %q: the name must be the ip:port its topics carry: %w", e.Name, err)
		}
		if e.FirstRank < 0 || e.FirstRank+e.ranks() > 1024 {
			return fmt.Errorf("kvevents: endpoint %q: first_rank %d out of range", e.Name, e.FirstRank)
		}
	} else if e.FirstRank != 0 {
		return fmt.Errorf("kvevents: endpoint %q: first_rank is for central endpoints", e.Name)
	} else if _, err := rankAddress(e.Address, e.ranks()-1); err != nil {
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
		// ipc:// is dialled as a Unix socket; inproc:// exists only inside one process.
		if rank == 0 && strings.HasPrefix(addr, "ipc://") && len(addr) > len("ipc://") {
			return addr, nil
		}
		return "", fmt.Errorf("address %q: want tcp://host:port (or ipc://path without data-parallel ranks)", addr)
	}
	i := strings.LastIndexByte(addr, ':')
	port, err := strconv.Atoi(addr[i+1:])
	if i < len("tcp://") || err != nil || port <= 0 || port+rank > 65535 {
		return "", fmt.Errorf("address %q: want tcp://host:port", addr)
	}
	return addr[:i+1] + strconv.Itoa(port+rank), nil
}
