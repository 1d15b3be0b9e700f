package kvevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// CentralTopicPrefix starts every central-mode topic; it is the bound socket's
// subscription.
const CentralTopicPrefix = "kv@"

// CentralTopic is the topic a vLLM pod publishes on in central mode:
// "kv@<ip:port>@<model>", with ip:port the pod's HTTP address (the endpoint's name) and
// model the served model name requests use (its blocks are keyed under it).
func CentralTopic(address, model string) string {
	return CentralTopicPrefix + address + "@" + model
}

// ParseCentralTopic splits a central-mode topic into the endpoint address (an IP literal
// and a port, as written) and the model.
func ParseCentralTopic(topic string) (address, model string, err error) {
	a, m, err := splitCentralTopic([]byte(topic))
	if err != nil {
		return "", "", err
	}
	return string(a), string(m), nil
}

func splitCentralTopic(topic []byte) (address, model []byte, err error) {
	rest, ok := bytes.CutPrefix(topic, []byte(CentralTopicPrefix))
	if !ok {
		return nil, nil, fmt.Errorf("kvevents: topic %q does not start with %q", topic, CentralTopicPrefix)
	}
	address, model, ok = bytes.Cut(rest, []byte("@"))
	if !ok || len(model) == 0 {
		return nil, nil, fmt.Errorf("kvevents: topic %q is not kv@<ip:port>@<model>", topic)
	}
	if _, err := parseAddrPort(string(address)); err != nil {
		return nil, nil, fmt.Errorf("kvevents: topic %q: %w", topic, err)
	}
	return address, model, nil
}

// parseAddrPort parses "ip:port" with an IP literal (no zone) and a non-zero port; the
// result is unmapped, so that equal addresses compare equal.
func parseAddrPort(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Addr().Zone() != "" || ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("%q is not ip:port (an IP address, not a name)", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// bindAddress turns the Bind setting into the host:port rank listens on.
func bindAddress(bind string, rank int) (string, error) {
	rest, ok := strings.CutPrefix(bind, "tcp://")
	if !ok {
		return "", fmt.Errorf("kvevents: bind %q: want tcp://*:port or tcp://ip:port (vLLM binds, never connects, an ipc:// endpoint)", bind)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("kvevents: bind %q: want tcp://*:port or tcp://ip:port", bind)
	}
	if host == "*" {
		host = ""
	} else if ip, err := netip.ParseAddr(host); err != nil || ip.Zone() != "" {
		return "", fmt.Errorf("kvevents: bind %q: bind to \"*\" or an IP address", bind)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n <= 0 || n+rank > 65535 {
		return "", fmt.Errorf("kvevents: bind %q: port (+ rank %d) must be within 1..65535", bind, rank)
	}
	return net.JoinHostPort(host, strconv.Itoa(n+rank)), nil
}

// centralAddress is the bind address of a rank as the status shows it
// ("tcp://*:5558").
func centralAddress(bind string, rank int) string {
	i := strings.LastIndexByte(bind, ':')
	n, err := strconv.Atoi(bind[i+1:])
	if i < 0 || err != nil {
		return bind
	}
	return bind[:i+1] + strconv.Itoa(n+rank)
}

// pubConn is one accepted publisher connection.
type pubConn struct {
	remote string
	ip     netip.Addr
}

// listen starts the central socket of one rank; s.mu is held and Run is running.
func (s *Subscriber) listen(rank int) error {
	if _, ok := s.listeners[rank]; ok {
		return nil
	}
	addr, err := bindAddress(s.cfg.Bind, rank)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(s.runCtx, "tcp", addr)
	if err != nil {
		s.m.bindErrors.Inc()
		return fmt.Errorf("kvevents: central rank %d: %w", rank, err)
	}
	s.listeners[rank] = ln
	context.AfterFunc(s.runCtx, func() { ln.Close() })
	s.wg.Add(1)
	go s.accept(rank, ln)
	return nil
}

// listenRanks starts the central sockets an endpoint's streams need, logging a failure
// (the streams on that port then never connect, and the endpoint is scored without
// events); s.mu is held.
func (s *Subscriber) listenRanks(ep *endpoint) {
	for r := ep.cfg.FirstRank; r < ep.cfg.FirstRank+len(ep.streams); r++ {
		if err := s.listen(r); err != nil {
			s.log.Warn("central KV events socket", zap.String("endpoint", ep.cfg.Name), zap.Error(err))
		}
	}
}

func (s *Subscriber) accept(rank int, ln net.Listener) {
	defer s.wg.Done()
	ctx := s.runCtx
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if s.peers.Add(1) > int64(s.cfg.MaxPeers) {
			s.peers.Add(-1)
			nc.Close()
			s.m.centralConns.WithLabelValues(connRejected).Inc()
			continue
		}
		s.wg.Add(1)
		go s.serve(ctx, rank, nc)
	}
}

// Central connection outcomes, as counted in kvrouter_kv_events_central_connections_total.
const (
	connAccepted        = "accepted"
	connRejected        = "rejected"
	connHandshakeFailed = "handshake_failed"
	connProtocolError   = "protocol_error"
)

// serve reads one publisher connection until it closes or Run ends.
func (s *Subscriber) serve(ctx context.Context, rank int, nc net.Conn) {
	defer s.wg.Done()
	defer s.peers.Add(-1)
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()

	z := newZMTPReader(nc, s.cfg.MaxMessageBytes)
	// Socket deadlines are wall-clock instants: not the injected clock.
	_ = nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if err := z.handshake([]byte(CentralTopicPrefix)); err != nil {
		s.m.centralConns.WithLabelValues(connHandshakeFailed).Inc()
		return
	}
	_ = nc.SetDeadline(time.Time{})
	s.m.centralConns.WithLabelValues(connAccepted).Inc()
	s.m.centralPeers.Inc()
	defer s.m.centralPeers.Dec()

	p := &pubConn{remote: nc.RemoteAddr().String()}
	if ta, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		p.ip = ta.AddrPort().Addr().Unmap()
	}
	fed := map[*stream]bool{}
	defer func() {
		for st := range fed {
			st.peerGone(p)
		}
	}()
	for {
		frames, err := z.readMessage()
		if errors.Is(err, errTooLarge) {
			s.m.badMessages.WithLabelValues(badTooLarge).Inc()
		}
		switch {
		case errors.Is(err, errZMTP):
			s.m.centralConns.WithLabelValues(connProtocolError).Inc()
			return
		case errors.Is(err, errTooLarge):
			continue // read past: the connection goes on
		case err != nil:
			return
		}
		s.dispatch(ctx, p, rank, frames, fed)
	}
}

// dispatch routes one central-mode message to its endpoint's stream: only an endpoint
// added as Central (one discovery found) is fed; anything else is counted and dropped.
func (s *Subscriber) dispatch(ctx context.Context, p *pubConn, rank int, frames [][]byte, fed map[*stream]bool) {
	if len(frames) != 3 {
		s.m.badMessages.WithLabelValues(badFrames).Inc()
		return
	}
	addrB, modelB, err := splitCentralTopic(frames[0])
	if err != nil {
		s.m.badMessages.WithLabelValues(badTopic).Inc()
		return
	}
	ap, _ := parseAddrPort(string(addrB))
	if !s.cfg.AnySource && ap.Addr() != p.ip {
		s.m.badMessages.WithLabelValues(badSource).Inc()
		return
	}
	s.mu.Lock()
	ep := s.central[ap]
	s.mu.Unlock()
	if ep == nil || ep.ctx == nil {
		s.m.badMessages.WithLabelValues(badUnknownEndpoint).Inc()
		return
	}
	i := rank - ep.cfg.FirstRank
	if i < 0 || i >= len(ep.streams) {
		s.m.badMessages.WithLabelValues(badRank).Inc()
		return
	}
	st := ep.streams[i]
	st.hmu.Lock()
	defer st.hmu.Unlock()
	if st.removed {
		s.m.badMessages.WithLabelValues(badUnknownEndpoint).Inc()
		return
	}
	if st.peer != p {
		// Another connection speaks for this stream: the publisher reconnected or
		// restarted, which cannot always be told apart: rebuild (reconnected).
		st.reconnected()
		st.peer = p
		fed[st] = true
		st.setPeer(p.remote)
	}
	if string(modelB) != st.model {
		if st.model != "" && st.hasLast {
			// Same address, another model: a new vLLM process.
			st.clear(ClearRestart)
			st.hasLast = false
		}
		st.model = string(modelB)
		st.mu.Lock()
		st.st.Model = st.model
		st.mu.Unlock()
	}
	st.handle(ep.ctx, frames)
}

// peerGone marks the stream disconnected if p was its connection.
func (st *stream) peerGone(p *pubConn) {
	st.hmu.Lock()
	defer st.hmu.Unlock()
	if st.peer == p {
		st.peer = nil
		st.setConnected(false)
		if !st.removed {
			st.connectionLost()
		}
	}
}

// setPeer records the stream's current connection (central mode).
func (st *stream) setPeer(remote string) {
	st.mu.Lock()
	st.st.Peer = remote
	st.mu.Unlock()
	st.setConnected(true)
}
