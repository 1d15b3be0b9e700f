package demo

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
)

// partition is the set of replicas cut off from the others (nil: none), which every
// peerProxy of a stack reads.
type partition struct {
	cut atomic.Pointer[map[int]bool]
}

// crosses reports whether traffic from replica a to replica b crosses the partition.
func (p *partition) crosses(a, b int) bool {
	c := p.cut.Load()
	return c != nil && (*c)[a] != (*c)[b]
}

// active reports whether a partition is in force.
func (p *partition) active() bool { return p.cut.Load() != nil }

// peerProxy stands in front of one replica's memberlist port on loopback: peers reach the
// replica at its advertised address (the proxy), which forwards UDP packets (probes,
// gossip, the peersync snapshots) and TCP streams (joins, push/pull state, large
// snapshots) to the replica's bind address. During a partition it drops the UDP packets
// that cross it (the sender is known by its source port, memberlist's bind port) and
// refuses every TCP stream (a stream's sender is not known by its ephemeral port), and
// cuts the streams open when the partition starts.
type peerProxy struct {
	self   int
	target string
	part   *partition
	udp    *net.UDPConn
	tcp    net.Listener
	out    *net.UDPConn

	senders map[int]int // memberlist bind port -> replica

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup

	dropped atomic.Int64 // UDP packets dropped across the partition
}

// newPeerProxy binds listen (UDP and TCP) for replica self, whose memberlist is on target.
func newPeerProxy(self int, listen, target string, part *partition) (*peerProxy, error) {
	ua, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("demo: peer proxy: %w", err)
	}
	tcp, err := net.Listen("tcp", listen)
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("demo: peer proxy: %w", err)
	}
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		udp.Close()
		tcp.Close()
		return nil, err
	}
	out, err := net.DialUDP("udp", nil, ta)
	if err != nil {
		udp.Close()
		tcp.Close()
		return nil, err
	}
	return &peerProxy{self: self, target: target, part: part, udp: udp, tcp: tcp, out: out, conns: map[net.Conn]bool{}}, nil
}

// start runs the forwarding goroutines until Close; routers name each replica's bind port.
func (p *peerProxy) start(routers []routerProc) {
	p.senders = map[int]int{}
	for i, r := range routers {
		if _, port, err := net.SplitHostPort(r.gossip); err == nil {
			n, _ := strconv.Atoi(port)
			p.senders[n] = i
		}
	}
	p.wg.Go(p.serveUDP)
	p.wg.Go(p.serveTCP)
}

func (p *peerProxy) serveUDP() {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := p.udp.ReadFromUDP(buf)
		if err != nil {
			return
		}
		if src, ok := p.senders[from.Port]; ok && p.part.crosses(src, p.self) {
			p.dropped.Add(1)
			continue
		}
		_, _ = p.out.Write(buf[:n])
	}
}

func (p *peerProxy) serveTCP() {
	for {
		c, err := p.tcp.Accept()
		if err != nil {
			return
		}
		if p.part.active() {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.pipe(c) })
	}
}

// pipe copies one stream both ways until either side closes or a partition cuts it.
func (p *peerProxy) pipe(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, u) {
		c.Close()
		u.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
	c.Close()
	u.Close()
	<-done
	p.untrack(c, u)
}

func (p *peerProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = true
	}
	return true
}

func (p *peerProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// cutStreams closes every stream open through the proxy (a partition starts).
func (p *peerProxy) cutStreams() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops the proxy and waits for its goroutines.
func (p *peerProxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.udp.Close()
	p.tcp.Close()
	p.wg.Wait()
	p.out.Close()
	return nil
}
