package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

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
	// overlap: the connection's rebuild applied batches up to last, and live batches
	// up to last may still arrive (published during the rebuild): skipped, not a
	// restart. replayDown: this connection's rebuild found the replay socket
	// unreachable, so the first live batch does not wait on it again.
	overlap, replayDown bool

	mu   sync.Mutex // guards st and logs
	st   StreamStatus
	logs logLimit
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
	// Subscribe to every topic and filter here (handle): a PUB filters at the
	// publisher, so a prefix sent with the subscription would hide a topic mismatch as a
	// connected stream that never receives a batch. A vLLM PUB socket carries one pod's
	// events, so nothing is sent that would not be anyway.
	lc, z, err := st.s.dial(sctx, st.addr, func(z *zmtpReader) error { return z.handshake(nil) })
	if err != nil {
		if ctx.Err() == nil {
			st.fail(err, false)
		}
		return false
	}
	st.reconnected()
	st.overlap, st.replayDown = false, false
	if st.replay != "" {
		// Rebuild from the replay socket before reading live batches, and count as
		// connected (routing on this endpoint's KV state) only once that is done.
		st.replayDown = !st.rebuild(sctx)
		st.overlap = st.hasLast
		if ctx.Err() != nil {
			return true
		}
		lc.touch()
	}
	st.setConnected(true)
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
			if ctx.Err() == nil {
				st.connectionLost()
			}
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
			st.connectionLost()
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

// fail records why a dial or a connection failed, and logs it (rate-limited).
func (st *stream) fail(err error, wasUp bool) {
	if wasUp {
		st.report(failConnection, "KV events connection lost", err)
	} else {
		st.report(failDial, "KV events dial failed", err)
	}
}

// connectionLost tells OnConnectionLost's function that the connection, which was up,
// ended without a protocol error on our side: closed, reset or silent.
func (st *stream) connectionLost() {
	if st.s.lost != nil {
		st.s.lost(st.name)
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
		// The subscription is to every topic (see session) so that a publisher on
		// another topic shows here instead of looking connected and idle.
		st.drop(badTopic)
		st.foreignTopic(frames[0])
		return
	}
	if len(frames[1]) != 8 {
		st.drop(badSeq)
		return
	}
	seq := binary.BigEndian.Uint64(frames[1])
	if st.overlap {
		if seq <= st.last {
			return // published during the rebuild: applied from the replay already
		}
		st.overlap = false
	}
	switch {
	case !st.hasLast:
		// First batch seen from this publisher (or since a reconnect, which forgot the
		// last one) and the rebuild on connect found nothing buffered (or this is
		// central mode, which has no rebuild on connect): fetch what came before it
		// (slow joiner) when a replay socket exists. Nothing is known now, so nothing
		// needs clearing.
		if seq > 0 && st.replay != "" && !st.replayDown {
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
	default:
		st.countGap(st.last+1, seq)
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
		st.countGap(seq, seq+1)
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
	st.report(failDecode, "KV events batch undecodable", err, zap.String("reason", string(reason)))
}

func (st *stream) clear(reason string) {
	st.s.sink.Clear(st.name, st.rank)
	st.s.m.clears.WithLabelValues(reason).Inc()
	st.mu.Lock()
	st.st.Clears[reason]++
	st.mu.Unlock()
	switch reason {
	case ClearAllBlocks, ClearRemoved: // the publisher's own, or ours: not a failure
	case ClearReconnect:
		// Routine after any reconnect: logged, but the stream's last error stays the
		// one that broke the connection.
		st.logLimited(failClear, "KV events endpoint cleared", errors.New("cleared: "+reason), zap.String("reason", reason))
	default:
		st.report(failClear, "KV events endpoint cleared", errors.New("cleared: "+reason), zap.String("reason", reason))
	}
}

// reconnected runs once a new connection (per-pod mode) or a new peer (central mode)
// speaks for the stream. The publisher may have restarted meanwhile, and a new process
// whose first sequence number happens to follow the old one's last cannot be told from a
// continuation: what the old connection said is dropped, and the endpoint is rebuilt
// from the replay socket (from sequence 0) when one exists: per-pod mode as soon as the
// connection is up (rebuild), central mode on the new peer's first batch.
func (st *stream) reconnected() {
	if !st.hasLast {
		return
	}
	st.clear(ClearReconnect)
	st.hasLast = false
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
