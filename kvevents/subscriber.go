package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
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
	// LastError says why the last dial, handshake or connection failed (per-pod mode);
	// empty if none has.
	LastError string `json:"last_error,omitempty"`
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

// stream is one (endpoint, rank): one SUB socket, its sequence state and status.
type stream struct {
	s      *Subscriber
	name   string
	rank   int
	addr   string
	replay string
	topic  []byte // subscription prefix (per-pod mode)

	// hmu serialises message handling in central mode, where any connection's
	// goroutine may carry the stream's messages; removed is set by Remove under it.
	hmu     sync.Mutex
	removed bool
	peer    *pubConn // central mode: the connection speaking for the stream
	model   string   // central mode: the model its topic names

	// Owned by the stream goroutine (central mode: by whoever holds hmu).
	batch   Batch
	hasLast bool
	last    uint64
	// resumed is set after a disconnect: the publisher may have restarted meanwhile.
	resumed bool

	mu sync.Mutex // guards st
	st StreamStatus
}

func (st *stream) status() StreamStatus {
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.st
	c.Clears = make(map[string]uint64, len(st.st.Clears))
	for k, v := range st.st.Clears {
		c.Clears[k] = v
	}
	c.DecodeErrors = make(map[Reason]uint64, len(st.st.DecodeErrors))
	for k, v := range st.st.DecodeErrors {
		c.DecodeErrors[k] = v
	}
	return c
}

func (st *stream) setConnected(c bool) {
	st.mu.Lock()
	was := st.st.Connected
	st.st.Connected = c
	st.mu.Unlock()
	switch {
	case c && !was:
		st.s.m.connected.Inc()
	case !c && was:
		st.s.m.connected.Dec()
	}
}

func (st *stream) run(ctx context.Context) {
	cfg := &st.s.cfg
	backoff := cfg.BackoffMin
	for {
		progressed := st.session(ctx)
		st.setConnected(false)
		if ctx.Err() != nil {
			return
		}
		if progressed {
			backoff = cfg.BackoffMin
		} else {
			backoff = min(2*backoff, cfg.BackoffMax)
		}
		st.mu.Lock()
		st.st.Redials++
		st.mu.Unlock()
		st.s.m.redials.Inc()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
	}
}

// session dials the publisher once and reads its messages until the connection fails,
// the watchdog gives up on it or ctx ends. It reports whether it got anywhere (a
// completed handshake on a connection that did not end in a protocol error): the caller
// then redials after the shortest backoff.
func (st *stream) session(ctx context.Context) (progressed bool) {
	sctx, cancel := context.WithCancel(ctx)
	var watching sync.WaitGroup
	defer watching.Wait()
	defer cancel() // closes the connection
	lc, z, err := st.s.dial(sctx, st.addr, func(z *zmtpReader) error { return z.handshake(st.topic) })
	if err != nil {
		if ctx.Err() == nil {
			st.fail(err, false)
		}
		return false
	}
	st.setConnected(true)
	st.resumed = st.hasLast
	var busy, fired atomic.Bool
	if z.heartbeats() {
		watching.Add(1)
		go func() {
			defer watching.Done()
			st.watch(sctx, lc, z, &busy, &fired)
		}()
		// A first PING tells whether the peer answers them (libzmq does), which is
		// what lets the watchdog take silence for a dead connection.
		if _, err := lc.Write(pingCommand()); err != nil {
			st.fail(err, true)
			return true
		}
	}
	for {
		frames, err := z.readMessage()
		if errors.Is(err, errTooLarge) {
			st.drop(badTooLarge)
		}
		switch {
		case err == nil:
		case errors.Is(err, errZMTP):
			if !errors.Is(err, errTooLarge) {
				st.drop(badProtocol)
			}
			st.fail(err, true)
			return false
		case errors.Is(err, errTooLarge):
			// Read past: the batch is lost and the next one shows the gap.
			continue
		default:
			if ctx.Err() != nil {
				return true
			}
			if fired.Load() {
				err = fmt.Errorf("watchdog: nothing received for %v", st.s.cfg.Watchdog)
			}
			st.fail(err, true)
			return true
		}
		busy.Store(true)
		st.handle(ctx, frames)
		lc.touch()
		busy.Store(false)
	}
}

// watch keeps a ZMTP 3.1 connection honest while the session waits for messages: after
// Watchdog/2 of silence it sends a PING; once the peer has shown it answers PINGs,
// Watchdog of silence (no message, no PONG) means the connection is dead, and it closes
// it. A peer that never answers (or speaks 3.0, and is never pinged) is left to TCP
// keepalive. It runs until ctx ends.
func (st *stream) watch(ctx context.Context, lc *liveConn, z *zmtpReader, busy, fired *atomic.Bool) {
	wd := st.s.cfg.Watchdog
	ticker := time.NewTicker(min(wd/4, time.Second))
	defer ticker.Stop()
	var pinged time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if busy.Load() {
			continue // handling a message (perhaps replaying): not reading
		}
		now := st.s.clock.Now()
		silent := lc.silence(now)
		switch {
		case silent >= wd && z.ponged.Load():
			fired.Store(true)
			lc.Close()
			return
		case silent >= wd/2 && now.Sub(pinged) >= wd/4:
			pinged = now
			if _, err := lc.Write(pingCommand()); err != nil {
				return
			}
		}
	}
}

// fail records why a dial or a connection failed. A connection that was up is logged;
// repeated dial failures are not (they are in the status and the redial count).
func (st *stream) fail(err error, wasUp bool) {
	st.mu.Lock()
	st.st.LastError = err.Error()
	st.mu.Unlock()
	if wasUp {
		st.s.log.Warn("KV events connection lost", zap.String("endpoint", st.name),
			zap.Int("rank", st.rank), zap.String("address", st.addr), zap.Error(err))
	} else {
		st.s.log.Debug("KV events dial failed", zap.String("endpoint", st.name),
			zap.Int("rank", st.rank), zap.String("address", st.addr), zap.Error(err))
	}
}

// liveConn is a connection that remembers when it last received a byte (or the session
// last finished handling a message), on the subscriber's clock.
type liveConn struct {
	net.Conn
	clock Clock
	last  atomic.Int64 // UnixNano
}

func (c *liveConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *liveConn) touch() { c.last.Store(c.clock.Now().UnixNano()) }

func (c *liveConn) silence(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, c.last.Load()))
}

// dialAddress splits a tcp:// or ipc:// address into net.Dial's network and address.
func dialAddress(addr string) (network, address string, err error) {
	if rest, ok := strings.CutPrefix(addr, "tcp://"); ok {
		return "tcp", rest, nil
	}
	if rest, ok := strings.CutPrefix(addr, "ipc://"); ok {
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("kvevents: cannot dial %q: want tcp:// or ipc://", addr)
}

// dial connects to the ZMTP peer at addr and runs handshake on the connection within
// HandshakeTimeout. The connection is closed when ctx ends: callers pass a context they
// cancel when done with it.
func (s *Subscriber) dial(ctx context.Context, addr string, handshake func(*zmtpReader) error) (*liveConn, *zmtpReader, error) {
	network, address, err := dialAddress(addr)
	if err != nil {
		return nil, nil, err
	}
	wd := s.cfg.Watchdog
	d := net.Dialer{Timeout: s.cfg.HandshakeTimeout, KeepAliveConfig: net.KeepAliveConfig{
		// A peer gone without a FIN (node lost, partition) and that does not answer
		// PING is declared dead by the kernel after about twice the watchdog.
		Enable: true, Idle: wd, Interval: max(wd/4, time.Second), Count: 4}}
	nc, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, nil, fmt.Errorf("kvevents: dial %s: %w", addr, err)
	}
	context.AfterFunc(ctx, func() { nc.Close() })
	lc := &liveConn{Conn: nc, clock: s.clock}
	lc.touch()
	z := newZMTPReader(lc, s.cfg.MaxMessageBytes)
	// Socket deadlines are wall-clock instants: not the injected clock.
	_ = nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if err := handshake(z); err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("kvevents: handshake with %s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return lc, z, nil
}

func (st *stream) drop(reason string) {
	st.s.m.badMessages.WithLabelValues(reason).Inc()
	st.mu.Lock()
	st.st.Drops++
	st.mu.Unlock()
}

// handle processes one live message: [topic, 8-byte big-endian seq, payload].
func (st *stream) handle(ctx context.Context, frames [][]byte) {
	if len(frames) != 3 {
		st.drop(badFrames)
		return
	}
	if !bytes.HasPrefix(frames[0], st.topic) {
		st.drop(badTopic)
		return
	}
	if len(frames[1]) != 8 {
		st.drop(badSeq)
		return
	}
	seq := binary.BigEndian.Uint64(frames[1])
	resumed := st.resumed
	st.resumed = false
	switch {
	case !st.hasLast:
		// First batch seen from this publisher: fetch what came before it (slow joiner)
		// when a replay socket exists. Nothing is known yet, so nothing needs clearing.
		if seq > 0 && st.replay != "" {
			st.recover(ctx, 0, seq)
		}
	case seq == st.last+1:
	case seq <= st.last:
		// The publisher restarted (vLLM's sequence starts again at 0).
		st.clear(ClearRestart)
		st.hasLast = false
		if seq > 0 && st.replay != "" {
			st.recover(ctx, 0, seq)
		}
	case resumed:
		// Batches were lost across a reconnect, or the publisher restarted and already
		// passed our sequence: the two cannot be told apart, and replaying from st.last+1
		// would splice two processes' streams. Start over from 0.
		st.countGap()
		if st.replay == "" {
			st.clear(ClearGap)
			break
		}
		st.clear(ClearReconnect)
		st.hasLast = false
		st.recover(ctx, 0, seq)
	default:
		st.countGap()
		st.recover(ctx, st.last+1, seq)
	}
	st.applyPayload(ctx, seq, frames[2])
}

// applyPayload decodes and applies the live batch seq; an undecodable one is a gap.
func (st *stream) applyPayload(ctx context.Context, seq uint64, payload []byte) {
	if err := Decode(payload, &st.batch); err != nil {
		st.decodeError(err)
		// Treat it as a lost batch: its replayed copy may decode (it will not if the
		// publisher sent garbage), otherwise the endpoint is cleared.
		st.countGap()
		st.recover(ctx, seq, seq+1)
		st.advance(seq)
		return
	}
	st.apply(&st.batch)
	st.advance(seq)
}

func (st *stream) advance(seq uint64) {
	st.hasLast, st.last = true, seq
	st.mu.Lock()
	st.st.HasSeq, st.st.LastSeq = true, seq
	st.mu.Unlock()
}

func (st *stream) decodeError(err error) {
	reason := ReasonInvalidMsgpack
	var de *DecodeError
	if errors.As(err, &de) {
		reason = de.Reason
	}
	st.s.m.decodeErrors.WithLabelValues(string(reason)).Inc()
	st.mu.Lock()
	st.st.DecodeErrors[reason]++
	st.mu.Unlock()
}

func (st *stream) clear(reason string) {
	st.s.sink.Clear(st.name, st.rank)
	st.s.m.clears.WithLabelValues(reason).Inc()
	st.mu.Lock()
	st.st.Clears[reason]++
	st.mu.Unlock()
}

// apply hands b to the Sink, turning AllBlocksCleared into Clear at its place.
func (st *stream) apply(b *Batch) {
	m := st.s.m
	now := st.s.clock.Now()
	lag := now.Sub(time.Unix(0, int64(b.TS*1e9)))
	b.Model = st.model
	m.batches.Inc()
	m.lag.Observe(lag.Seconds())
	var stored, removed, cleared int
	start := 0
	for i, ev := range b.Events {
		switch ev := ev.(type) {
		case *BlockStored:
			stored += len(ev.BlockHashes)
		case *BlockRemoved:
			removed += len(ev.BlockHashes)
		case *AllBlocksCleared:
			cleared++
			if i > start {
				sub := *b
				sub.Events = b.Events[start:i]
				st.s.sink.Apply(st.name, st.rank, &sub)
			}
			st.clear(ClearAllBlocks)
			start = i + 1
		}
	}
	switch {
	case start == 0 && len(b.Events) > 0:
		st.s.sink.Apply(st.name, st.rank, b)
	case start > 0 && start < len(b.Events):
		sub := *b
		sub.Events = b.Events[start:]
		st.s.sink.Apply(st.name, st.rank, &sub)
	}
	nStored, nRemoved := 0, 0
	for _, ev := range b.Events {
		switch ev.(type) {
		case *BlockStored:
			nStored++
		case *BlockRemoved:
			nRemoved++
		}
	}
	m.events.WithLabelValues("BlockStored").Add(float64(nStored))
	m.events.WithLabelValues("BlockRemoved").Add(float64(nRemoved))
	m.events.WithLabelValues("AllBlocksCleared").Add(float64(cleared))
	m.blocks.WithLabelValues("stored").Add(float64(stored))
	m.blocks.WithLabelValues("removed").Add(float64(removed))
	st.mu.Lock()
	st.st.Batches++
	st.st.Events += uint64(len(b.Events))
	st.st.LastBatchAt = now
	st.st.LastLag = lag
	st.mu.Unlock()
}

var endSeq = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

type replayResult int

const (
	replayOK replayResult = iota
	replayEvicted
	replayFailed
)

func (st *stream) countGap() {
	st.s.m.gaps.Inc()
	st.mu.Lock()
	st.st.Gaps++
	st.mu.Unlock()
}

// recover fetches and applies batches [from, upto) through the replay socket. When that
// is impossible or incomplete, the endpoint's entries are cleared (a partially applied
// replay leaves a hole too).
func (st *stream) recover(ctx context.Context, from, upto uint64) {
	if st.replay == "" {
		st.clear(ClearGap)
		return
	}
	res := st.replayRange(ctx, from, upto)
	if ctx.Err() != nil {
		return // stopping (Run ended or the endpoint was removed): not a replay failure
	}
	st.mu.Lock()
	st.st.Replays++
	if res != replayOK {
		st.st.ReplayFailures++
	}
	st.mu.Unlock()
	switch res {
	case replayOK:
		st.s.m.replays.WithLabelValues("ok").Inc()
	case replayEvicted:
		st.s.m.replays.WithLabelValues("evicted").Inc()
		st.clear(ClearEvicted)
	default:
		st.s.m.replays.WithLabelValues("failed").Inc()
		st.clear(ClearReplayFailed)
	}
}

// replayRange runs the replay protocol against vLLM's ROUTER: send ["", seq]; replies
// are ["", topic, seq, payload] (vLLM >= 0.26) or ["", seq, payload], ending with seq
// 0xFF x 8. The ROUTER's send high-water mark truncates long replays with holes, so only
// the contiguous prefix is applied and the next round asks again from the first hole. A
// round ends on END or after ReplayIdle without a reply. A first reply past the requested
// seq means the batches were evicted from the replay buffer.
func (st *stream) replayRange(ctx context.Context, from, upto uint64) replayResult {
	cfg := &st.s.cfg
	rctx, cancel := context.WithTimeout(ctx, cfg.ReplayTimeout)
	defer cancel() // closes the connection
	deadline, _ := rctx.Deadline()
	lc, z, err := st.s.dial(rctx, st.replay, func(z *zmtpReader) error { return z.greet("DEALER", "ROUTER") })
	if err != nil {
		return replayFailed
	}
	_ = lc.SetWriteDeadline(deadline)

	want := from
	var req []byte
	for round := 0; round < cfg.ReplayMaxRounds && want < upto; round++ {
		req = appendMessage(req[:0], nil, binary.BigEndian.AppendUint64(nil, want))
		if _, err := lc.Write(req); err != nil {
			return replayFailed
		}
		st.mu.Lock()
		st.st.ReplayRounds++
		st.mu.Unlock()
		first, holed, progressed := true, false, false
	round:
		for {
			// The idle timeout applies between messages only; a message that has
			// started arriving has until the recovery's deadline.
			idle := time.Now().Add(cfg.ReplayIdle)
			if idle.After(deadline) {
				idle = deadline
			}
			_ = lc.SetReadDeadline(idle)
			if err := z.waitMessage(); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(deadline) {
					break round
				}
				return replayFailed
			}
			_ = lc.SetReadDeadline(deadline)
			frames, err := z.readMessage()
			if err != nil {
				if errors.Is(err, errTooLarge) {
					st.drop(badTooLarge) // a batch that cannot be read: cannot recover
				}
				return replayFailed
			}
			f := frames
			if len(f) > 0 && len(f[0]) == 0 {
				f = f[1:] // the DEALER's empty delimiter
			}
			var seqB, payload []byte
			switch len(f) {
			case 2:
				seqB, payload = f[0], f[1]
			case 3:
				seqB, payload = f[1], f[2]
			default:
				st.drop(badFrames)
				continue
			}
			if len(seqB) != 8 {
				st.drop(badSeq)
				continue
			}
			if [8]byte(seqB) == endSeq {
				break round
			}
			if holed || want >= upto {
				continue // drain the round
			}
			seq := binary.BigEndian.Uint64(seqB)
			if first && seq > want {
				return replayEvicted
			}
			first = false
			switch {
			case seq < want:
				continue
			case seq > want:
				holed = true
				continue
			}
			if err := Decode(payload, &st.batch); err != nil {
				st.decodeError(err)
				return replayFailed
			}
			st.apply(&st.batch)
			st.advance(seq)
			want++
			progressed = true
			if want >= upto {
				return replayOK
			}
		}
		if !progressed {
			return replayFailed
		}
	}
	if want >= upto {
		return replayOK
	}
	return replayFailed
}
