package kvevents_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakePub is a PUB socket written from the ZMTP 3.1 spec in the test itself (independent
// of the package's reader): it listens on TCP, greets each connection as a PUB, answers
// PING with PONG unless told not to, records subscriptions, and writes whatever frames
// the test gives it, well-formed or not.
type fakePub struct {
	t          *testing.T
	ln         net.Listener
	socketType string
	// onMessage, if set before the first connection, receives every message the peer
	// sends (a ROUTER's requests), on the connection's goroutine.
	onMessage func(c *fakeConn, frames [][]byte)

	// silent: accept TCP but never greet (a stuck or foreign server).
	silent atomic.Bool
	// noPong: do not answer PING.
	noPong atomic.Bool
	// zmtp30: greet as ZMTP 3.0 (go-zeromq/zmq4) instead of 3.1 (libzmq 4.2+).
	zmtp30 atomic.Bool

	mu     sync.Mutex
	conns  []*fakeConn
	accept chan *fakeConn
	closed bool
}

type fakeConn struct {
	nc         net.Conn
	wmu        sync.Mutex
	subscribed chan struct{} // closed when the first subscription arrived
	pings      atomic.Int64
	once       sync.Once
}

func newFakePub(t *testing.T, addr string) *fakePub { return newFakePeer(t, addr, "PUB") }

// newFakePeer is a fake ZMTP peer greeting as socketType (PUB or ROUTER).
func newFakePeer(t *testing.T, addr, socketType string) *fakePub {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePub{t: t, ln: ln, socketType: socketType, accept: make(chan *fakeConn, 16)}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *fakePub) addr() string { return "tcp://" + p.ln.Addr().String() }

func (p *fakePub) serve() {
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			return
		}
		c := &fakeConn{nc: nc, subscribed: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			nc.Close()
			return
		}
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		if p.silent.Load() {
			go io.Copy(io.Discard, nc) // read and never answer
			continue
		}
		go p.handle(c)
	}
}

// handle greets, then reads the peer's frames: subscriptions and PINGs.
func (p *fakePub) handle(c *fakeConn) {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 1
	if p.zmtp30.Load() {
		g[11] = 0
	}
	copy(g[12:], "NULL")
	ready := zmtpCommand("READY", zmtpProperty("Socket-Type", p.socketType))
	if err := c.write(append(g, ready...)); err != nil {
		return
	}
	r := bufio.NewReader(c.nc)
	if _, err := io.ReadFull(r, g); err != nil {
		return
	}
	select {
	case p.accept <- c:
	default:
	}
	if p.socketType != "PUB" {
		c.once.Do(func() { close(c.subscribed) })
	}
	var msg [][]byte
	for {
		flags, body, err := readZMTPFrame(r)
		if err != nil {
			return
		}
		if flags&0x04 == 0 && p.onMessage != nil {
			msg = append(msg, body)
			if flags&0x01 == 0 {
				p.onMessage(c, msg)
				msg = nil
			}
			continue
		}
		if flags&0x04 != 0 {
			if len(body) > 5 && string(body[1:1+body[0]]) == "PING" {
				c.pings.Add(1)
				if !p.noPong.Load() {
					_ = c.write(zmtpCommand("PONG", body[1+body[0]+2:]))
				}
			}
			continue
		}
		if len(body) > 0 && body[0] == 1 {
			c.once.Do(func() { close(c.subscribed) })
		}
	}
}

func (c *fakeConn) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.nc.Write(b)
	return err
}

// next waits for the next greeted connection (a PUB's: subscribed).
func (p *fakePub) next(t *testing.T) *fakeConn {
	t.Helper()
	select {
	case c := <-p.accept:
		select {
		case <-c.subscribed:
		case <-time.After(20 * time.Second):
			t.Fatal("no subscription on the fake PUB's connection")
		}
		return c
	case <-time.After(20 * time.Second):
		t.Fatal("nobody connected to the fake PUB")
	}
	return nil
}

// close stops listening and drops every connection (a publisher killed: FIN to peers).
func (p *fakePub) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.ln.Close()
	for _, c := range p.conns {
		c.nc.Close()
	}
}

// send writes one message, each frame with MORE but the last.
func (c *fakeConn) send(frames ...[]byte) error {
	return c.write(zmtpMessage(nil, frames...))
}

func zmtpMessage(dst []byte, frames ...[]byte) []byte {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = 0x01
		}
		dst = appendZMTPFrame(dst, flags, f)
	}
	return dst
}

func appendZMTPFrame(dst []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		dst = append(dst, flags|0x02)
		dst = binary.BigEndian.AppendUint64(dst, uint64(len(body)))
	} else {
		dst = append(dst, flags, byte(len(body)))
	}
	return append(dst, body...)
}

func zmtpCommand(name string, body []byte) []byte {
	b := append([]byte{byte(len(name))}, name...)
	return appendZMTPFrame(nil, 0x04, append(b, body...))
}

func zmtpProperty(name, value string) []byte {
	b := append([]byte{byte(len(name))}, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

func readZMTPFrame(r *bufio.Reader) (flags byte, body []byte, err error) {
	var h [9]byte
	if _, err := io.ReadFull(r, h[:2]); err != nil {
		return 0, nil, err
	}
	size := uint64(h[1])
	if h[0]&0x02 != 0 {
		if _, err := io.ReadFull(r, h[2:]); err != nil {
			return 0, nil, err
		}
		size = binary.BigEndian.Uint64(h[1:])
	}
	if size > 1<<20 {
		return 0, nil, errors.New("fake pub: frame too large")
	}
	body = make([]byte, size)
	_, err = io.ReadFull(r, body)
	return h[0], body, err
}
