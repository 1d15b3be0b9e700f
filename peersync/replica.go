package peersync

import (
	"bytes"
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/placement"
)

// Source is this replica's own state (placement.Policy): its in-flight load per
// endpoint, and its placement table, which peers' decisions merge into.
type Source interface {
	Local(dst []placement.EndpointLoad) []placement.EndpointLoad
	Placements(dst []placement.Placement, all bool) []placement.Placement
	MergePlacements(ps []placement.Placement, winsTie bool, concurrent time.Duration)
}

// Replica is one router replica's side of the shared state: it publishes its own
// load as snapshots (Publish, State) and keeps the latest snapshot of every other
// replica (Receive), which the placement policy reads through PeerLoad. Every transport
// (the memberlist Node, kvbench's simulated one) feeds the same Receive. It is safe for
// concurrent use; PeerLoad never waits on anything but its own lock.
type Replica struct {
	self   string
	inc    uint64
	src    Source
	expiry time.Duration
	// interval is how often replicas publish (Config.Interval): peers' placement
	// decisions closer than it to this replica's are concurrent (MergePlacements).
	interval time.Duration
	now      func() time.Time
	m        *Metrics

	heartbeat time.Duration

	// pub orders the publishing side (Publish, State), which reads the Source; mu guards
	// the peers' side, which the Source's owner reads while it holds its own lock
	// (placement reads PeerLoad inside a pick). Never both at once: a Source read under
	// mu would wait for the policy's lock while the policy waits for mu.
	pub      sync.Mutex
	seq      uint64
	last     []byte // the encoding of the last published loads
	scratch  []byte
	lastSent time.Time
	lastFull time.Time // when the last snapshot with every placement was built
	buf      []placement.EndpointLoad
	placed   []placement.Placement

	mu    sync.Mutex
	peers map[string]*peer
	seen  []uint64 // PeerLoad's scratch
}

// peer is the latest snapshot heard from one origin.
type peer struct {
	inc, seq uint64
	version  int       // the wire version of its last snapshot
	heard    time.Time // local clock
	sent     time.Time // origin's clock
	loads    map[string]placement.EndpointLoad
	// received counts snapshots applied, stale those older than the one held.
	received, stale uint64
}

// NewReplica returns the shared state of replica self (a name unique among replicas)
// in its incarnation inc (e.g. its start time in nanoseconds: a restarted replica must
// use a larger one). Another replica's load counts until expiry passes without a
// snapshot from it; Publish repeats an unchanged state every expiry/4, so that a
// silent replica is a dead one. interval is how often the replicas publish their
// changes (Config.Interval). now is the clock (nil: time.Now); m may be nil.
func NewReplica(self string, inc uint64, src Source, expiry, interval time.Duration, now func() time.Time, m *Metrics) *Replica {
	if now == nil {
		now = time.Now
	}
	return &Replica{self: self, inc: inc, src: src, expiry: expiry, interval: interval, heartbeat: expiry / 4, now: now, m: m,
		peers: make(map[string]*peer)}
}

// Self is the replica's name.
func (r *Replica) Self() string { return r.self }

// Publish returns the encoding of this replica's current state when its loads changed
// since the last one published or it made placement decisions since, or when a
// heartbeat is due (every expiry/4, with every placement); nil otherwise.
func (r *Replica) Publish() []byte {
	now := r.now()
	r.pub.Lock()
	defer r.pub.Unlock()
	full := now.Sub(r.lastFull) >= r.heartbeat
	r.buf = r.local(r.buf[:0])
	r.placed = r.placements(r.placed[:0], full)
	s := Snapshot{Origin: r.self, Loads: r.buf}
	r.scratch = s.AppendEncode(r.scratch[:0])
	if bytes.Equal(r.scratch, r.last) && len(r.placed) == 0 && now.Sub(r.lastSent) < r.heartbeat {
		return nil
	}
	r.last, r.scratch = r.scratch, r.last
	r.lastSent = now
	if full {
		r.lastFull = now
	}
	return r.encodeLocked(now)
}

// State returns the encoding of this replica's current state with every placement, for
// a peer that joins (memberlist's push/pull).
func (r *Replica) State() []byte {
	now := r.now()
	r.pub.Lock()
	defer r.pub.Unlock()
	r.buf = r.local(r.buf[:0])
	r.placed = r.placements(r.placed[:0], true)
	return r.encodeLocked(now)
}

// placements appends the source's placements (all, or the changed ones), sorted by key
// and without the sites of nothing, to dst.
func (r *Replica) placements(dst []placement.Placement, all bool) []placement.Placement {
	if r.src == nil {
		return dst
	}
	dst = r.src.Placements(dst, all)
	slices.SortFunc(dst, func(a, b placement.Placement) int { return cmp.Compare(a.Key, b.Key) })
	return dst
}

func (r *Replica) local(dst []placement.EndpointLoad) []placement.EndpointLoad {
	if r.src != nil {
		dst = r.src.Local(dst)
	}
	slices.SortFunc(dst, func(a, b placement.EndpointLoad) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	for _, l := range dst {
		slices.SortFunc(l.Active, func(a, b placement.ActivePrefix) int { return cmp.Compare(a.Key, b.Key) })
	}
	return dst
}

// encodeLocked encodes r.buf as the next snapshot; r.pub must be held.
func (r *Replica) encodeLocked(now time.Time) []byte {
	r.seq++
	s := Snapshot{Origin: r.self, Incarnation: r.inc, Seq: r.seq, Sent: now, Loads: r.buf, Placements: r.placed}
	b := s.AppendEncode(nil)
	r.m.published(len(b))
	return b
}

// Receive decodes a peer's snapshot and, when it is newer than the one held for its
// origin, replaces it and merges its placements into the source's table (a tie between
// decisions made at the same time goes to the origin of the smaller name). Its own
// snapshots (echoed back) are ignored.
func (r *Replica) Receive(b []byte) error {
	s, err := Decode(b)
	if err != nil {
		r.m.refuse(err)
		return err
	}
	r.m.decoded(s.Version)
	// Merged outside r.mu: the policy calls PeerLoad under its own lock.
	if r.apply(&s, len(b)) && len(s.Placements) > 0 && r.src != nil {
		// Decisions this close were made without hearing of each other: the sender's
		// was at most a publish interval old when sent, and took the lag to arrive.
		r.src.MergePlacements(s.Placements, s.Origin < r.self, r.interval+max(r.now().Sub(s.Sent), 0))
	}
	return nil
}

// apply holds s as its origin's state and reports whether it was newer than the one held.
func (r *Replica) apply(s *Snapshot, size int) bool {
	if s.Origin == r.self {
		return false
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.peers[s.Origin]
	if p == nil {
		p = &peer{}
		r.peers[s.Origin] = p
	} else if s.Incarnation < p.inc || (s.Incarnation == p.inc && s.Seq <= p.seq) {
		p.stale++
		r.m.received(size, false)
		return false
	}
	p.inc, p.seq, p.version, p.heard, p.sent = s.Incarnation, s.Seq, s.Version, now, s.Sent
	p.received++
	clear(p.loads)
	if p.loads == nil {
		p.loads = make(map[string]placement.EndpointLoad, len(s.Loads))
	}
	for _, l := range s.Loads {
		p.loads[l.Endpoint] = l
	}
	r.m.received(size, true)
	r.m.lag(now.Sub(s.Sent))
	return true
}

// Forget drops a peer at once (memberlist saw it leave or declared it dead).
func (r *Replica) Forget(origin string) {
	r.mu.Lock()
	delete(r.peers, origin)
	r.mu.Unlock()
}

// PeerLoad is the sum of every live peer's load on endpoint (placement.PeerView): their
// requests' own blocks plus the blocks of each prefix they have active there once,
// unless local has it active too. A peer not heard from for longer than the expiry
// counts for nothing.
func (r *Replica) PeerLoad(endpoint string, local placement.ActiveSet) placement.Load {
	now := r.now()
	var sum placement.Load
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = r.seen[:0]
	for _, p := range r.peers {
		if !r.live(p, now) {
			continue
		}
		l, ok := p.loads[endpoint]
		if !ok {
			continue
		}
		sum.Requests += l.Requests
		sum.KVBlocks += l.KVBlocks
		sum.Prefill += l.Prefill
		sum.Misses += l.Misses
		for _, a := range l.Active {
			if (local != nil && local.Active(a.Key)) || slices.Contains(r.seen, a.Key) {
				continue
			}
			r.seen = append(r.seen, a.Key)
			sum.KVBlocks += a.Blocks
		}
	}
	return sum
}

// PeerTurnover is every live peer's cache turnover on endpoint (placement.PeerView):
// the sum of their Sent there, and their histories appended to dst.
func (r *Replica) PeerTurnover(endpoint string, dst []placement.History) (int, []placement.History) {
	now := r.now()
	sent := 0
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.peers {
		if !r.live(p, now) {
			continue
		}
		if l, ok := p.loads[endpoint]; ok {
			sent += l.Sent
			dst = append(dst, l.Histories...)
		}
	}
	return sent, dst
}

// live reports whether p was heard from within the expiry before now: a peer silent
// longer counts for nothing (its load, its requests, its picks). r.mu must be held.
func (r *Replica) live(p *peer, now time.Time) bool { return now.Sub(p.heard) <= r.expiry }

// Unheard returns how many live peers this replica last heard from before t
// (placement.PeerView): their picks since are unknown to it, as its picks at t are to
// them. Both times are this replica's clock.
func (r *Replica) Unheard(t time.Time) int {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, p := range r.peers {
		if r.live(p, now) && p.heard.Before(t) {
			n++
		}
	}
	return n
}

// Rank is the number of live peers whose names sort before this replica's, and the
// number of live replicas, itself included (placement.PeerView).
func (r *Replica) Rank() (rank, replicas int) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	replicas = 1
	for name, p := range r.peers {
		if !r.live(p, now) {
			continue
		}
		replicas++
		if name < r.self {
			rank++
		}
	}
	return rank, replicas
}

// PeerActive reports whether a live peer has a request using the prefix named key in
// flight on endpoint (placement.PeerView).
func (r *Replica) PeerActive(endpoint string, key uint64) bool {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.peers {
		if !r.live(p, now) {
			continue
		}
		for _, a := range p.loads[endpoint].Active {
			if a.Key == key {
				return true
			}
		}
	}
	return false
}

// PeerState is what /debug shows of one peer.
type PeerState struct {
	Name        string                            `json:"name"`
	Incarnation uint64                            `json:"incarnation"`
	Seq         uint64                            `json:"seq"`
	Version     int                               `json:"version"` // wire version of its last snapshot
	Live        bool                              `json:"live"`
	AgeMS       float64                           `json:"age_ms"` // since its last snapshot arrived
	LagMS       float64                           `json:"lag_ms"` // its last snapshot's trip (both clocks)
	Received    uint64                            `json:"received"`
	Stale       uint64                            `json:"stale"`
	Loads       map[string]placement.EndpointLoad `json:"loads"`
}

// Peers returns every peer held, by name.
func (r *Replica) Peers() []PeerState {
	now := r.now()
	r.mu.Lock()
	out := make([]PeerState, 0, len(r.peers))
	for name, p := range r.peers {
		age := now.Sub(p.heard)
		out = append(out, PeerState{Name: name, Incarnation: p.inc, Seq: p.seq, Version: p.version, Live: r.live(p, now),
			AgeMS: ms(age), LagMS: ms(p.heard.Sub(p.sent)), Received: p.received, Stale: p.stale,
			Loads: maps(p.loads)})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b PeerState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func maps(m map[string]placement.EndpointLoad) map[string]placement.EndpointLoad {
	out := make(map[string]placement.EndpointLoad, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
