package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Sink consumes the events of every endpoint and data-parallel rank. The subscriber calls
// it from one goroutine per (endpoint, rank), so calls for one pair are sequential and in
// the publisher's order; calls for different pairs may be concurrent.
type Sink interface {
	// Apply delivers a batch's events in order. AllBlocksCleared never appears in b: the
	// subscriber turns it into Clear at its place in the stream. b and everything it
	// points to are valid only during the call: copy what you keep.
	Apply(endpoint string, rank int, b *Batch)
	// Clear drops everything known for the endpoint's rank: the stream lost events that
	// cannot be recovered, the publisher restarted, or the endpoint was removed.
	Clear(endpoint string, rank int)
}

// Clock is the time source; time.Now in production.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// SystemClock is the wall clock.
var SystemClock Clock = systemClock{}

// StreamStatus is a snapshot of one (endpoint, rank) stream, for the debug view (JSON
// field names in tags; LastLag in nanoseconds).
type StreamStatus struct {
	Endpoint string `json:"endpoint"`
	Rank     int    `json:"rank"`
	// Address is the PUB socket dialled, or in central mode the address listened on.
	Address       string `json:"address"`
	ReplayAddress string `json:"replay_address,omitempty"`
	// Central is true for a stream fed through the bound socket; Peer is then the
	// address of the connection currently speaking for it.
	Central bool   `json:"central,omitempty"`
	Peer    string `json:"peer,omitempty"`
	// Model is the model named by the stream's topic (central mode).
	Model string `json:"model,omitempty"`
	// Connected is true from a completed ZMTP handshake with the publisher until that
	// connection fails (closed, reset, a protocol error, or silent for the watchdog
	// while the peer answers PINGs). In central mode: since the stream's first message,
	// while that connection stays open.
	Connected bool `json:"connected"`
	// LastError says what last went wrong with the stream: a dial, handshake or
	// connection failure (per-pod mode), a gap, a failed replay, a clear, an undecodable
	// batch or a batch on another topic; empty if nothing has. LastErrorAt is when.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// ForeignTopic is the topic of the last message dropped because it does not start
	// with the configured topic (per-pod mode): a publisher configured with another
	// topic shows here, and in the drops with reason "topic".
	ForeignTopic string `json:"foreign_topic,omitempty"`
	// LastSeq is the last sequence number applied; HasSeq is false before the first.
	LastSeq uint64 `json:"last_seq"`
	HasSeq  bool   `json:"has_seq"`
	Batches uint64 `json:"batches"`
	Events  uint64 `json:"events"`
	Gaps    uint64 `json:"gaps"`
	// Replays counts recoveries attempted; ReplayFailures those that did not recover
	// everything (evicted, unreachable or garbled).
	Replays        uint64 `json:"replays"`
	ReplayFailures uint64 `json:"replay_failures"`
	// ReplayRounds counts replay requests sent: more than Replays when the publisher's
	// replay socket truncated a reply.
	ReplayRounds uint64 `json:"replay_rounds"`
	// Clears counts Clear calls by reason (ClearGap, ClearRestart, ...).
	Clears map[string]uint64 `json:"clears"`
	// Drops counts messages dropped before decoding (wrong frame count, sequence frame
	// size, topic, over max_message_bytes, a connection ended by a protocol error).
	Drops uint64 `json:"drops"`
	// DecodeErrors counts undecodable payloads by reason.
	DecodeErrors map[Reason]uint64 `json:"decode_errors"`
	Redials      uint64            `json:"redials"`
	// LastBatchAt is when the last batch was applied; LastLag is that time minus the
	// batch's timestamp.
	LastBatchAt time.Time     `json:"last_batch_at"`
	LastLag     time.Duration `json:"last_lag_ns"`
}

// Subscriber subscribes to the KV events of a set of vLLM endpoints and feeds a Sink.
type Subscriber struct {
	cfg   Config
	sink  Sink
	log   *zap.Logger
	m     *metrics
	clock Clock

	mu        sync.Mutex
	endpoints map[string]*endpoint
	runCtx    context.Context // nil until Run
	// stopping is set (under mu) once Run's context has ended, before Run waits for the
	// streams: Add starts no stream after it, so no wg.Add can race with wg.Wait.
	stopping bool
	wg       sync.WaitGroup

	// Central mode: the endpoints fed through the bound sockets, by address, and the
	// sockets by rank (both under mu); the connections open.
	central   map[netip.AddrPort]*endpoint
	listeners map[int]net.Listener
	peers     atomic.Int64

	// lost, set by OnConnectionLost before Run, hears of connections that ended.
	lost func(endpoint string)
}

type endpoint struct {
	cfg     EndpointConfig
	streams []*stream
	ctx     context.Context // the streams' context; nil until started
	cancel  context.CancelFunc
	done    chan struct{} // closed when every stream goroutine returned; nil if not started
}

// NewSubscriber builds a subscriber for cfg.Endpoints. logger and reg may be nil (no
// logging, metrics discarded), clock nil means SystemClock. It starts nothing: call Run.
func NewSubscriber(cfg Config, sink Sink, logger *zap.Logger, reg prometheus.Registerer, clock Clock) (*Subscriber, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if sink == nil {
		return nil, errors.New("kvevents: nil sink")
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	if clock == nil {
		clock = SystemClock
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: cfg.withDefaults(), sink: sink,
		log: logger.Named("kvevents"), m: m, clock: clock, endpoints: map[string]*endpoint{},
		central: map[netip.AddrPort]*endpoint{}, listeners: map[int]net.Listener{}}
	for _, e := range cfg.Endpoints {
		if err := s.add(e); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run subscribes to every endpoint and blocks until ctx ends; it then closes every socket
// and waits for the stream goroutines. It returns nil after ctx ends. In central mode it
// first listens on Bind (rank 0) and returns that error if it cannot.
func (s *Subscriber) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.runCtx != nil {
		s.mu.Unlock()
		return errors.New("kvevents: Run called twice")
	}
	s.runCtx = ctx
	if s.cfg.Bind != "" {
		if err := s.listen(0); err != nil {
			s.stopping = true
			s.mu.Unlock()
			return err
		}
	}
	for _, e := range s.endpoints {
		s.start(e)
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// OnConnectionLost registers fn to hear, from the stream's goroutine, that a connection
// to the endpoint's publisher that was up has ended (closed, reset, a protocol error, the
// watchdog; in central mode, the peer speaking for it hung up), not counting Run's end
// or Remove. A pod killed is seen this way within milliseconds, which makes it a passive
// health signal. fn must return quickly. Call it before Run.
func (s *Subscriber) OnConnectionLost(fn func(endpoint string)) { s.lost = fn }

// Add subscribes to one more endpoint (at once if Run is running).
func (s *Subscriber) Add(e EndpointConfig) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if e.Central && s.cfg.Bind == "" {
		return fmt.Errorf("kvevents: endpoint %q is central but no bind address is set", e.Name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.add(e); err != nil {
		return err
	}
	if s.runCtx != nil && !s.stopping && s.runCtx.Err() == nil {
		s.start(s.endpoints[e.Name])
	}
	return nil
}

func (s *Subscriber) add(e EndpointConfig) error {
	if _, ok := s.endpoints[e.Name]; ok {
		return fmt.Errorf("kvevents: endpoint %q already subscribed", e.Name)
	}
	var ap netip.AddrPort
	if e.Central {
		ap, _ = parseAddrPort(e.Name)
		if o := s.central[ap]; o != nil {
			return fmt.Errorf("kvevents: endpoint %q: address already subscribed as %q", e.Name, o.cfg.Name)
		}
	}
	topic := s.cfg.Topic
	if e.Topic != "" {
		topic = e.Topic
	}
	ep := &endpoint{cfg: e}
	for r := range e.ranks() {
		var addr string
		var err error
		if e.Central {
			addr = centralAddress(s.cfg.Bind, e.FirstRank+r)
		} else if addr, err = rankAddress(e.Address, r); err != nil {
			return fmt.Errorf("kvevents: endpoint %q: %w", e.Name, err)
		}
		var replay string
		if e.ReplayAddress != "" {
			if replay, err = rankAddress(e.ReplayAddress, r); err != nil {
				return fmt.Errorf("kvevents: endpoint %q: %w", e.Name, err)
			}
		}
		st := &stream{s: s, name: e.Name, rank: r, addr: addr, replay: replay}
		if !e.Central {
			st.topic = []byte(topic) // central topics are checked by dispatch
		}
		st.st = StreamStatus{Endpoint: e.Name, Rank: r, Address: addr, ReplayAddress: replay, Central: e.Central,
			Clears: map[string]uint64{}, DecodeErrors: map[Reason]uint64{}}
		ep.streams = append(ep.streams, st)
	}
	s.endpoints[e.Name] = ep
	if e.Central {
		s.central[ap] = ep
	}
	return nil
}

// start launches ep's streams (in central mode: listens on its ranks' ports); s.mu is
// held.
func (s *Subscriber) start(ep *endpoint) {
	ctx, cancel := context.WithCancel(s.runCtx)
	ep.ctx, ep.cancel = ctx, cancel
	ep.done = make(chan struct{})
	if ep.cfg.Central {
		close(ep.done)
		s.listenRanks(ep)
		return
	}
	var wg sync.WaitGroup
	for _, st := range ep.streams {
		wg.Add(1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer wg.Done()
			st.run(ctx)
		}()
	}
	go func() { wg.Wait(); close(ep.done) }()
}

// Remove unsubscribes from an endpoint: it closes its sockets, waits for its streams to
// stop, then clears the endpoint's ranks in the Sink.
func (s *Subscriber) Remove(name string) error {
	s.mu.Lock()
	ep, ok := s.endpoints[name]
	if ok {
		delete(s.endpoints, name)
		if ep.cfg.Central {
			ap, _ := parseAddrPort(name)
			delete(s.central, ap)
		}
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("kvevents: endpoint %q not subscribed", name)
	}
	if ep.cancel != nil {
		ep.cancel()
		<-ep.done
	}
	for _, st := range ep.streams {
		// A central stream's message may be in flight on a connection's goroutine:
		// wait for it, and make sure no later one applies.
		st.hmu.Lock()
		st.removed = true
		st.clear(ClearRemoved)
		st.setConnected(false)
		st.hmu.Unlock()
	}
	return nil
}

// Status returns a snapshot of every stream, sorted by endpoint and rank.
func (s *Subscriber) Status() []StreamStatus {
	s.mu.Lock()
	var out []StreamStatus
	for _, ep := range s.endpoints {
		for _, st := range ep.streams {
			out = append(out, st.status())
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Endpoint != out[j].Endpoint {
			return out[i].Endpoint < out[j].Endpoint
		}
		return out[i].Rank < out[j].Rank
	})
	return out
}
