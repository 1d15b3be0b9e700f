package peersync

import (
	"context"
	"fmt"
	"log"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"
)

// Node carries a Replica's state to its peers over memberlist: membership and failure
// detection (SWIM probes), push/pull state exchange when a replica joins (LocalState,
// MergeRemoteState), and the replica's snapshots, sent every Interval when changed, as
// direct UDP user messages to each member (SendBestEffort; SendReliable when a
// snapshot outgrows a packet). Build with NewNode; Run starts it.
type Node struct {
	cfg  Config
	rep  *Replica
	log  *zap.Logger
	m    *Metrics
	opts NodeOptions

	ml atomic.Pointer[memberlist.Memberlist]

	// members are copies of the other members as the event delegate last saw them:
	// memberlist updates its own Node structs in place (a reclaimed name's new
	// address), so they are not read outside its callbacks.
	mu      sync.Mutex
	members map[string]memberlist.Node
}

// NodeOptions are a Node's test seams.
type NodeOptions struct {
	// Transport replaces memberlist's UDP/TCP transport (nil: the network).
	Transport memberlist.Transport
	// Tune, when set, adjusts memberlist's configuration (e.g. faster probes in tests).
	Tune func(*memberlist.Config)
}

// packetLimit is the largest snapshot sent as one UDP packet (memberlist's LAN default
// buffer less its framing): ~40 endpoints; larger snapshots go over TCP.
const packetLimit = 1350

// NewNode returns the node for rep under cfg (validated); log and m may be nil.
func NewNode(cfg Config, rep *Replica, log *zap.Logger, m *Metrics, o NodeOptions) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Node{cfg: cfg, rep: rep, log: log, m: m, opts: o}, nil
}

// Addr is the node's gossip address once Run has started it ("" before).
func (n *Node) Addr() string {
	ml := n.ml.Load()
	if ml == nil {
		return ""
	}
	return ml.LocalNode().Address()
}

// Members returns the names of the live members other than this node.
func (n *Node) Members() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.members))
	for name := range n.members {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// peers returns copies of the other members.
func (n *Node) peers(dst []memberlist.Node) []memberlist.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, m := range n.members {
		dst = append(dst, m)
	}
	return dst
}

func (n *Node) setMember(m *memberlist.Node, alive bool) {
	if m.Name == n.rep.Self() {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.members == nil {
		n.members = make(map[string]memberlist.Node)
	}
	if alive {
		n.members[m.Name] = *m
	} else {
		delete(n.members, m.Name)
	}
}

// Run joins the peers and shares state until ctx ends, then leaves.
func (n *Node) Run(ctx context.Context) error {
	mc := memberlist.DefaultLANConfig()
	mc.Name = n.rep.Self()
	host, port, _ := net.SplitHostPort(n.cfg.Bind)
	mc.BindAddr = host
	if mc.BindAddr == "" {
		mc.BindAddr = "0.0.0.0"
	}
	mc.BindPort, _ = strconv.Atoi(port)
	mc.AdvertisePort = mc.BindPort
	if n.cfg.Advertise != "" {
		h, p, _ := net.SplitHostPort(n.cfg.Advertise)
		mc.AdvertiseAddr = h
		mc.AdvertisePort, _ = strconv.Atoi(p)
	}
	// A replica restarted under its old name (a StatefulSet pod) on a new address takes
	// the name back once its previous incarnation has been dead for the expiry.
	mc.DeadNodeReclaimTime = n.cfg.Expiry
	mc.Delegate = delegate{n}
	mc.Events = events{n}
	mc.Logger = log.New(zapWriter{n.log}, "", 0)
	mc.Transport = n.opts.Transport
	if n.opts.Tune != nil {
		n.opts.Tune(mc)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("peersync: %w", err)
	}
	n.ml.Store(ml)
	defer func() {
		_ = ml.Leave(time.Second)
		_ = ml.Shutdown()
	}()
	n.join(ml)
	send := time.NewTicker(n.cfg.Interval)
	defer send.Stop()
	rejoin := time.NewTicker(n.cfg.JoinInterval)
	defer rejoin.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rejoin.C:
			n.join(ml)
		case <-send.C:
			n.send(ml)
		}
	}
}

// join (re)joins the configured peers unless every address they resolve to is already
// a member: memberlist forgets a peer it declared dead, so joining again heals a
// partition.
func (n *Node) join(ml *memberlist.Memberlist) {
	if len(n.cfg.Peers) == 0 {
		return
	}
	known := map[string]bool{ml.LocalNode().Address(): true}
	for _, m := range n.peers(nil) {
		known[m.Address()] = true
	}
	want := 0
	for _, p := range n.cfg.Peers {
		host, port, _ := net.SplitHostPort(p)
		addrs, err := net.DefaultResolver.LookupHost(context.Background(), host)
		if err != nil {
			want++ // unresolved: try the join, which reports it
			continue
		}
		for _, a := range addrs {
			if !known[net.JoinHostPort(a, port)] {
				want++
			}
		}
	}
	if want == 0 {
		return
	}
	_, err := ml.Join(n.cfg.Peers)
	n.m.join(err)
	if err != nil {
		n.log.Debug("peersync: join", zap.Error(err))
	}
}

// send gives every other member this replica's state when Publish says it is due.
func (n *Node) send(ml *memberlist.Memberlist) {
	members := n.peers(nil)
	live := 0
	for _, p := range n.rep.Peers() {
		if p.Live {
			live++
		}
	}
	n.m.setPeers(len(members), live)
	b := n.rep.Publish()
	if b == nil {
		return
	}
	for i := range members {
		m := &members[i]
		var err error
		if len(b) <= packetLimit {
			err = ml.SendBestEffort(m, b)
		} else {
			err = ml.SendReliable(m, b)
		}
		if err != nil {
			n.log.Debug("peersync: send", zap.String("peer", m.Name), zap.Error(err))
		}
	}
}

// delegate is memberlist's Delegate: user messages and push/pull state are snapshots.
type delegate struct{ n *Node }

func (delegate) NodeMeta(int) []byte { return nil }

func (d delegate) NotifyMsg(b []byte) {
	if err := d.n.rep.Receive(b); err != nil {
		d.n.log.Debug("peersync: message", zap.Error(err))
	}
}

func (delegate) GetBroadcasts(int, int) [][]byte { return nil }

func (d delegate) LocalState(bool) []byte { return d.n.rep.State() }

func (d delegate) MergeRemoteState(b []byte, _ bool) {
	if len(b) == 0 {
		return
	}
	if err := d.n.rep.Receive(b); err != nil {
		d.n.log.Debug("peersync: push/pull state", zap.Error(err))
	}
}

// events is memberlist's EventDelegate: a peer that leaves or is declared dead counts
// for nothing at once (the expiry is the backstop when memberlist cannot tell).
type events struct{ n *Node }

func (e events) NotifyJoin(m *memberlist.Node) {
	e.n.setMember(m, true)
	e.n.log.Info("peersync: peer joined", zap.String("peer", m.Name), zap.String("addr", m.Address()))
}

func (e events) NotifyLeave(m *memberlist.Node) {
	e.n.setMember(m, false)
	e.n.log.Info("peersync: peer left", zap.String("peer", m.Name))
	e.n.rep.Forget(m.Name)
}

func (e events) NotifyUpdate(m *memberlist.Node) { e.n.setMember(m, true) }

// zapWriter turns memberlist's log lines ("[LEVEL] memberlist: ...") into zap entries.
type zapWriter struct{ log *zap.Logger }

func (w zapWriter) Write(p []byte) (int, error) {
	s := strings.TrimSpace(string(p))
	switch {
	case strings.HasPrefix(s, "[ERR]"):
		w.log.Error(s)
	case strings.HasPrefix(s, "[WARN]"):
		w.log.Warn(s)
	default:
		w.log.Debug(s)
	}
	return len(p), nil
}
