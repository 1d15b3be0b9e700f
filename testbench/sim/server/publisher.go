package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/kvrouter/kvrouter/kvevents"
)

// endSeq marks the end of a replay, as vLLM's ZmqEventPublisher.END_SEQ.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// publisher is one data-parallel rank's KV event publisher: a PUB socket sending
// [topic, 8-byte big-endian seq from 0, msgpack batch] and an optional ROUTER socket
// replaying the last BufferSteps batches.
type publisher struct {
	cfg    KVEventsConfig
	rank   int
	log    *zap.Logger
	queue  chan kvevents.Batch
	mu     sync.Mutex
	ring   []replayEntry // last BufferSteps batches, oldest first
	seq    uint64
	pubEP  string
	repEP  string
	ready  chan struct{}
	addrMu sync.Mutex
	addr   net.Addr
	repAdr net.Addr
	// Fault injection (the fault suite): drop is how many of the next batches are
	// numbered and buffered for replay but not sent; reset asks run to close the PUB
	// socket and open it again.
	drop  atomic.Int64
	reset chan chan error
}

type replayEntry struct {
	seq     uint64
	payload []byte
}

func newPublisher(cfg KVEventsConfig, rank int, log *zap.Logger) *publisher {
	q := cfg.MaxQueueSize
	if q <= 0 {
		q = 100000
	}
	return &publisher{cfg: cfg, rank: rank, log: log, queue: make(chan kvevents.Batch, q),
		pubEP: offsetEndpoint(cfg.Endpoint, rank), repEP: offsetEndpoint(cfg.ReplayEndpoint, rank),
		ready: make(chan struct{}), reset: make(chan chan error)}
}

// OffsetEndpoint returns ep ("tcp://host:port") with n added to its port, as vLLM
// offsets each data-parallel rank's KV-event ports; port 0 (ephemeral) and endpoints
// without a port are returned unchanged. vllm-sim --replicas uses it to give every
// replica its own ports.
func OffsetEndpoint(ep string, n int) string {
	i := strings.LastIndexByte(ep, ':')
	if ep == "" || i < 0 {
		return ep
	}
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil || port == 0 {
		return ep
	}
	return fmt.Sprintf("%s:%d", ep[:i], port+n)
}

// offsetEndpoint adds rank to the endpoint's port, as vLLM does for data-parallel ranks.
func offsetEndpoint(ep string, rank int) string { return OffsetEndpoint(ep, rank) }

func listenAddr(ep string) string { return strings.Replace(ep, "://*:", "://0.0.0.0:", 1) }

// publish queues a batch; it drops the batch when the queue is full, as vLLM does.
func (p *publisher) publish(b kvevents.Batch) bool {
	select {
	case p.queue <- b:
		return true
	default:
		return false
	}
}

// batches returns how many batches were numbered so far (the next sequence number).
func (p *publisher) batches() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// dropNext makes the next n batches numbered and buffered for replay but not sent, as
// libzmq's PUB socket drops messages for a subscriber whose pipe is at the high-water
// mark: the subscriber sees a sequence gap.
func (p *publisher) dropNext(n int) { p.drop.Store(int64(n)) }

// resetConnections closes the PUB socket, which drops every subscriber's TCP
// connection, and opens it again on the same address, keeping the sequence and the
// replay buffer: what a subscriber sees when its connection to a live pod is reset.
func (p *publisher) resetConnections(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case p.reset <- done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// openPub binds (endpoint with '*', or Bind) or connects the PUB socket; ep is the
// endpoint, or after a reset the address first bound.
func (p *publisher) openPub(ctx context.Context, ep string) (zmq4.Socket, error) {
	pub := zmq4.NewPub(ctx)
	if p.cfg.HWM > 0 {
		if err := pub.SetOption(zmq4.OptionHWM, p.cfg.HWM); err != nil {
			pub.Close()
			return nil, fmt.Errorf("server: kv events hwm: %w", err)
		}
	}
	var err error
	if strings.Contains(p.pubEP, "*") || p.cfg.Bind {
		err = pub.Listen(listenAddr(ep))
	} else {
		err = pub.Dial(ep)
	}
	if err != nil {
		pub.Close()
		return nil, fmt.Errorf("server: kv events %s: %w", ep, err)
	}
	return pub, nil
}

// run binds (endpoint with '*') or connects the sockets and sends until ctx ends.
func (p *publisher) run(ctx context.Context) error {
	pub, err := p.openPub(ctx, p.pubEP)
	if err != nil {
		return err
	}
	defer func() { pub.Close() }()
	p.addrMu.Lock()
	p.addr = pub.Addr()
	p.addrMu.Unlock()
	again := p.pubEP
	if ta, ok := pub.Addr().(*net.TCPAddr); ok && (strings.Contains(p.pubEP, "*") || p.cfg.Bind) {
		again = "tcp://" + ta.String() // the port bound, if the endpoint said 0
	}
	if p.repEP != "" {
		rep := zmq4.NewRouter(ctx)
		defer rep.Close()
		if err := rep.Listen(listenAddr(p.repEP)); err != nil {
			return fmt.Errorf("server: kv events replay %s: %w", p.repEP, err)
		}
		p.addrMu.Lock()
		p.repAdr = rep.Addr()
		p.addrMu.Unlock()
		go p.serveReplay(ctx, rep)
	}
	close(p.ready)
	topic := []byte(p.cfg.Topic)
	enc := p.cfg.encoding()
	for {
		select {
		case <-ctx.Done():
			return nil
		case done := <-p.reset:
			pub.Close()
			np, err := p.openPub(ctx, again)
			if err != nil {
				done <- err
				return err
			}
			pub = np
			done <- nil
		case b := <-p.queue:
			payload := kvevents.Encode(&b, enc)
			p.mu.Lock()
			seq := p.seq
			p.seq++
			if p.cfg.BufferSteps > 0 {
				if len(p.ring) >= p.cfg.BufferSteps {
					p.ring = p.ring[1:]
				}
				p.ring = append(p.ring, replayEntry{seq, payload})
			}
			p.mu.Unlock()
			if p.drop.Load() > 0 {
				p.drop.Add(-1)
				continue
			}
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], seq)
			if err := pub.Send(zmq4.NewMsgFrom(topic, s[:], payload)); err != nil {
				p.log.Warn("kv events send failed", zap.Uint64("seq", seq), zap.Error(err))
			}
		}
	}
}

// serveReplay answers DEALER requests ["", start seq] with every buffered batch from
// start on, then END.
func (p *publisher) serveReplay(ctx context.Context, rep zmq4.Socket) {
	topic := []byte(p.cfg.Topic)
	for {
		msg, err := rep.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		if len(msg.Frames) < 3 || len(msg.Frames[2]) != 8 {
			continue // not ["id", "", seq]: ignore, as vLLM logs and drops it
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		p.mu.Lock()
		var entries []replayEntry
		for _, e := range p.ring {
			if e.seq >= start {
				entries = append(entries, e)
			}
		}
		p.mu.Unlock()
		for _, e := range entries {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], e.seq)
			if err := rep.Send(p.replayMsg(id, topic, s[:], e.payload)); err != nil {
				break
			}
		}
		_ = rep.Send(p.replayMsg(id, topic, endSeq, nil))
	}
}

func (p *publisher) replayMsg(id, topic, seq, payload []byte) zmq4.Msg {
	if p.cfg.ReplayFraming == "legacy" {
		return zmq4.NewMsgFrom(id, nil, seq, payload)
	}
	return zmq4.NewMsgFrom(id, nil, topic, seq, payload)
}
