package peersync

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/placement"
)

// faults drops traffic between gossip addresses: everything to and from an isolated
// one (a killed replica), or both ways between a cut pair (a partition).
type faults struct {
	mu       sync.Mutex
	isolated map[string]bool
	cut      map[[2]string]bool
}

func newFaults() *faults {
	return &faults{isolated: map[string]bool{}, cut: map[[2]string]bool{}}
}

func (f *faults) drop(from, to string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.isolated[from] || f.isolated[to] || f.cut[[2]string{from, to}] || f.cut[[2]string{to, from}]
}

func (f *faults) isolate(addr string, on bool) {
	f.mu.Lock()
	f.isolated[addr] = on
	f.mu.Unlock()
}

func (f *faults) partition(a, b string, on bool) {
	f.mu.Lock()
	f.cut[[2]string{a, b}] = on
	f.mu.Unlock()
}

var errDropped = errors.New("dropped by the fault injector")

// faultTransport is memberlist's network transport on 127.0.0.1 with faults applied to
// what it sends (a dropped packet is silently lost; a dropped dial fails).
type faultTransport struct {
	*memberlist.NetTransport
	self string
	f    *faults
}

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.f.drop(t.self, addr) {
		return time.Now(), nil
	}
	return t.NetTransport.WriteTo(b, addr)
}

func (t *faultTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *faultTransport) DialTimeout(addr string, d time.Duration) (net.Conn, error) {
	if t.f.drop(t.self, addr) {
		return nil, errDropped
	}
	return t.NetTransport.DialTimeout(addr, d)
}

func (t *faultTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, d)
}

// testNode is one replica on loopback with its own source of load.
type testNode struct {
	name   string
	addr   string
	src    *fakeSource
	rep    *Replica
	node   *Node
	cancel context.CancelFunc
	done   chan error
}

// startNode runs replica name (incarnation inc) joining peers, its traffic through f.
func startNode(t *testing.T, name string, inc uint64, peers []string, f *faults) *testNode {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, BindPort: 0})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(nt.GetAutoBindPort()))
	cfg := DefaultConfig()
	cfg.Name, cfg.Bind, cfg.Peers = name, addr, peers
	cfg.Expiry = 400 * time.Millisecond
	cfg.JoinInterval = time.Second
	src := &fakeSource{}
	rep := NewReplica(name, inc, src, cfg.Expiry, cfg.Interval, nil, nil)
	n, err := NewNode(cfg, rep, nil, nil, NodeOptions{
		Transport: &faultTransport{NetTransport: nt, self: addr, f: f},
		Tune: func(c *memberlist.Config) { // fast failure detection for the test
			c.ProbeInterval, c.ProbeTimeout, c.GossipInterval = 300*time.Millisecond, 200*time.Millisecond, 50*time.Millisecond
			c.SuspicionMult, c.PushPullInterval, c.TCPTimeout = 2, time.Second, time.Second
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn := &testNode{name: name, addr: addr, src: src, rep: rep, node: n, cancel: cancel, done: make(chan error, 1)}
	go func() { tn.done <- n.Run(ctx) }()
	t.Cleanup(tn.stop)
	return tn
}

func (n *testNode) stop() {
	if n.cancel != nil {
		n.cancel()
		<-n.done
		n.cancel = nil
	}
}

func (n *testNode) setLoad(requests int) {
	n.rep.pub.Lock() // the source is read under the replica's publishing lock (Publish, State)
	n.src.loads = []placement.EndpointLoad{{Endpoint: "vllm-0:8000", Load: placement.Load{Requests: requests}}}
	n.rep.pub.Unlock()
}

func (n *testNode) seen() int { return n.rep.PeerLoad("vllm-0:8000", nil).Requests }

func TestNodesShareStateOverLoopback(t *testing.T) {
	f := newFaults()
	a := startNode(t, "a", 1, nil, f)
	b := startNode(t, "b", 1, []string{a.addr}, f)
	c := startNode(t, "c", 1, []string{a.addr}, f)
	a.setLoad(1)
	b.setLoad(2)
	c.setLoad(4)
	testwait.For(t, "every replica to see the others' load", func() bool {
		return a.seen() == 6 && b.seen() == 5 && c.seen() == 3
	})

	t.Run("a killed replica's load expires", func(t *testing.T) {
		f.isolate(c.addr, true) // as if the process died: nothing in or out
		testwait.For(t, "c's load to leave a's and b's views", func() bool {
			return a.seen() == 2 && b.seen() == 1
		})
		c.stop()
	})

	t.Run("a restarted replica catches up and is caught up with", func(t *testing.T) {
		f.isolate(c.addr, false)
		// A Deployment's replacement pod: a new name, a new address.
		c2 := startNode(t, "c-2", 1, []string{a.addr}, f)
		c2.setLoad(8)
		testwait.For(t, "the restarted c to see a and b, and be seen", func() bool {
			return c2.seen() == 3 && a.seen() == 10 && b.seen() == 9
		})
		c2.stop()
		testwait.For(t, "c's graceful leave to clear its load", func() bool { return a.seen() == 2 && b.seen() == 1 })
	})

	t.Run("a partition leaves each on its own view and heals", func(t *testing.T) {
		f.partition(a.addr, b.addr, true)
		testwait.For(t, "each side to drop the other's load", func() bool { return a.seen() == 0 && b.seen() == 0 })
		a.setLoad(3) // both keep routing on their own state
		f.partition(a.addr, b.addr, false)
		testwait.For(t, "the views to converge after healing", func() bool { return a.seen() == 2 && b.seen() == 3 })
	})
}
