package placement

import (
	"math"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Load is what other router replicas have in flight on one endpoint: their requests,
// the KV blocks those requests hold (each prefix once, none that this router has active
// there itself), the uncached prompt tokens of those without a first token, and how
// many of them are misses of at least HoldPrefillTokens.
type Load struct {
	Requests int
	KVBlocks int
	Prefill  int
	Misses   int
}

// EndpointLoad is one router's own in-flight load on one endpoint, as it shares it:
// Load with KVBlocks counting each request's own blocks only, and the prefixes its
// requests there share, each with its blocks (counted once however many routers use it).
// Sent and Histories are its share of the endpoint's cache turnover: the KV blocks its
// requests have allocated there since it started, and its recent long prompts there.
type EndpointLoad struct {
	Endpoint string
	Load
	Active    []ActivePrefix
	Sent      int
	Histories []History
}

// History is a recent long prompt (more than one engine step of uncached tokens) a
// router sent to an endpoint: its blocks cached there when routed (Cached), those
// computed there (Blocks), and the endpoint's turnover then (Before: the KV blocks every
// router's requests had allocated there, the sender's own plus its peers' Sent as it
// last heard them). vLLM evicts least recently used blocks first, so the prompt stays
// cached while the turnover since, plus Cached, fits the endpoint's capacity.
type History struct {
	Before, Cached, Blocks int
}

// ActivePrefix is a prefix some in-flight request on an endpoint uses, by the key that
// names it (Config.PrefixDepth), with its estimated blocks.
type ActivePrefix struct {
	Key    uint64
	Blocks int
}

// ActiveSet tells which prefixes this router has active on an endpoint.
type ActiveSet interface {
	Active(key uint64) bool
}

// PeerView is the other router replicas' in-flight load per endpoint, as this replica
// last heard it (package peersync). Pick calls it under the policy's lock, once per
// candidate, with the candidate's own active prefixes (not to count their blocks twice):
// it must answer from memory and never wait on the network.
type PeerView interface {
	PeerLoad(endpoint string, local ActiveSet) Load
	// PeerActive reports whether a peer has a request using the prefix named key in
	// flight on endpoint: the endpoint holds it, or is computing it, so the prefix is
	// adopted there as the index's holders are, before its KV events arrive.
	PeerActive(endpoint string, key uint64) bool
	// Self names this replica (unique among them): it salts the replica's tie-breaks.
	Self() string
	// Unheard returns how many live peers this replica last heard from before t: what
	// they picked since is unknown to it, as its own picks at t are to them.
	Unheard(t time.Time) int
	// PeerTurnover returns the KV blocks live peers' requests have allocated on endpoint
	// (the sum of their Sent) and appends their histories there to dst.
	PeerTurnover(endpoint string, dst []History) (int, []History)
	// Rank is this replica's position among the live replicas by name (0 for the
	// first) and how many they are, itself included: replicas that decide at the same
	// instant on the same view spread by it as one router's consecutive decisions do
	// (coldTie, holderTurn).
	Rank() (rank, replicas int)
}

// SetPeers makes every later Pick add peers' load to its own view of each endpoint: to
// its load (requests), its KV room, its prefill backlog (diverts, rehoming) and the
// misses a hit is held behind. It replaces SharedLoad's estimate from scraped metrics.
// With peers, decisions are recorded for Placements and near-ties between holders are
// broken by v.Self() (replicaTie). nil turns it off.
func (p *Policy) SetPeers(v PeerView) {
	p.mu.Lock()
	p.peers = v
	p.salt = 0
	if v != nil {
		p.salt = xxhash.Sum64String(v.Self())
	}
	p.mu.Unlock()
}

// Local appends this router's own in-flight load and cache turnover on every endpoint
// where it has some (what its peers need) to dst, and returns it. The Active and
// Histories slices are fresh.
func (p *Policy) Local(dst []EndpointLoad) []EndpointLoad {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, ep := range p.eps {
		if ep.inflight == 0 && ep.footprint == 0 && ep.prefill == 0 && ep.sent == 0 {
			continue
		}
		l := EndpointLoad{Endpoint: addr, Load: Load{
			Requests: ep.inflight, KVBlocks: ep.footprint, Prefill: ep.prefill, Misses: ep.missesInPrefill,
		}, Sent: ep.sent}
		if len(ep.histories) > 0 {
			l.Histories = make([]History, len(ep.histories))
			for k, h := range ep.histories {
				l.Histories[k] = History{Before: h.before, Cached: h.cached, Blocks: h.blocks}
			}
		}
		if len(ep.active) > 0 {
			l.Active = make([]ActivePrefix, 0, len(ep.active))
			for k, a := range ep.active {
				l.Active = append(l.Active, ActivePrefix{Key: k, Blocks: a.blocks})
				l.KVBlocks -= a.blocks
			}
		}
		dst = append(dst, l)
	}
	return dst
}

// Active reports whether the endpoint has an in-flight request of this router using
// the prefix named key (ActiveSet). p.mu must be held.
func (ep *endpointState) Active(key uint64) bool { return ep.active[key] != nil }

// Placement is one prefix's placement as this router last decided it, or heard a peer
// decide it: its sites, estimated size, and when a decision last changed its sites.
// Replicas share them (Placements, MergePlacements), the latest decision winning, so
// that a prefix with no request in flight is placed the same by every replica.
type Placement struct {
	Key uint64
	// Blocks is the prefix's estimated blocks; Base those of the branched prefix it
	// extends (0 for a prefix named by its PrefixDepth-th block).
	Blocks, Base int
	Decided      time.Time
	// Sites are its endpoints; none: its placements were dropped.
	Sites []Site
}

// Site is one endpoint a prefix is placed on; Home marks its home.
type Site struct {
	Endpoint string
	Home     bool
}

// maxShared bounds the placements one Placements call reports (the most a snapshot
// carries): ~70 bytes each, so a full table of 1024 prefixes stays near 70 KB.
const maxShared = 1024

// Placements appends to dst the placements whose sites a decision changed since the
// last call (all: every placed prefix instead, leaving that set alone), at most
// maxShared, and returns it. Expiry is no decision: a placement unused here may be in
// use at a peer, which keeps sharing it.
func (p *Policy) Placements(dst []Placement, all bool) []Placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	add := func(e *prefixEntry) {
		pl := Placement{Key: e.key, Blocks: e.blocks, Base: e.base, Decided: e.decided}
		if len(e.sites) > 0 {
			pl.Sites = make([]Site, len(e.sites))
			for i, s := range e.sites {
				pl.Sites[i] = Site{Endpoint: s.addr, Home: s.home}
			}
		}
		dst = append(dst, pl)
	}
	n := 0
	if all {
		for _, e := range p.prefixes {
			if len(e.sites) > 0 && !e.decided.IsZero() && n < maxShared {
				add(e)
				n++
			}
		}
		return dst
	}
	for k := range p.changed {
		if e := p.prefixes[k]; e != nil && n < maxShared {
			add(e)
			n++
		}
	}
	clear(p.changed)
	return dst
}

// MergePlacements applies placements a peer shared: each one decided after this
// router's own decision for the prefix (or at the same time, when winsTie) replaces its
// sites; a prefix not in the table gets an entry with the peer's size estimate.
// Decisions less than concurrent apart (the sync interval plus the message's lag:
// neither replica had heard of the other's) are not ordered by time but by their
// homes (concurrentWins), the same way on both replicas. Sites added here start
// unused (they expire after LiveWindow picks, as this router's own do); nothing merged
// is shared again as a change.
func (p *Policy) MergePlacements(ps []Placement, winsTie bool, concurrent time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range ps {
		pl := &ps[i]
		e := p.prefixes[pl.Key]
		if e == nil {
			if len(pl.Sites) == 0 || len(p.prefixes) >= p.cfg.MaxPrefixes {
				continue
			}
			e = p.newPrefix(pl.Key, pl.Blocks, pl.Base, 0)
			p.prefixes[pl.Key] = e
		} else if len(pl.Sites) > 0 && len(e.sites) > 0 && pl.Decided.Sub(e.decided).Abs() < concurrent {
			if !concurrentWins(pl, e) {
				continue
			}
		} else if pl.Decided.Before(e.decided) || (pl.Decided.Equal(e.decided) && !winsTie) {
			continue
		}
		p.resite(e, slices.DeleteFunc(e.sites, func(s site) bool {
			if slices.ContainsFunc(pl.Sites, func(r Site) bool { return r.Endpoint == s.addr }) {
				return false
			}
			p.unplace(e, &s)
			return true
		}))
		for _, r := range pl.Sites {
			j := p.place(e, r.Endpoint, r.Home)
			if s := &e.sites[j]; s.home && !r.Home {
				s.home = false
				s.ep.homeBlocks -= e.weight()
				s.ep.homeGuessed -= e.guessed()
			}
		}
		e.decided = pl.Decided
		delete(p.changed, pl.Key)
	}
}

// concurrentWins reports whether a peer's placement pl replaces this router's e when
// both were decided within one sync interval, each without the other's: the one whose
// home (its first site if none is marked) has the higher rendezvous score for the
// prefix wins, on both replicas, so their tables converge on one copy and the other,
// no longer used, is evicted. With the same home each keeps its own sites until a later
// decision. Ordered by time instead, two replicas that rehome a lost prefix at once
// keep the later decision whichever it is, after both have sent requests to their own
// (kvbench --sim --replicas 2, N = 24, C = 8: cached-token ratio -1.4 points against
// one router, -0.5 with this; docs/results-policy.md). p.mu must be held.
func concurrentWins(pl *Placement, e *prefixEntry) bool {
	theirs := pl.Sites[0].Endpoint
	for _, s := range pl.Sites {
		if s.Home {
			theirs = s.Endpoint
			break
		}
	}
	ours := e.sites[0].ep.hash
	for _, s := range e.sites {
		if s.home {
			ours = s.ep.hash
			break
		}
	}
	return mix64(pl.Key^xxhash.Sum64String(theirs)) > mix64(pl.Key^ours)
}

// decide records that a decision of this router changed e's sites now, for its peers
// (Placements). Without peers it does nothing. p.mu must be held.
func (p *Policy) decide(e *prefixEntry) {
	if p.peers == nil {
		return
	}
	e.decided = p.now()
	if p.changed == nil {
		p.changed = make(map[uint64]struct{})
	}
	if len(p.changed) < maxShared {
		p.changed[e.key] = struct{}{}
	}
}

// maxUnheardPicks bounds the picks per endpoint remembered for unheardPicks: more
// than peers' picks within one sync interval on one endpoint add nothing.
const maxUnheardPicks = 16

// unheardPick is one of this router's picks: when, and the prefix it placed.
type unheardPick struct {
	at  time.Time
	key uint64
}

// noteUnheardPick remembers that this router routed a request of the prefix key to ep
// now, for unheardPicks; with peers only. p.mu must be held.
func (p *Policy) noteUnheardPick(ep *endpointState, key uint64) {
	if p.peers == nil {
		return
	}
	if len(ep.picks) == maxUnheardPicks {
		ep.picks = append(ep.picks[:0], ep.picks[1:]...)
	}
	ep.picks = append(ep.picks, unheardPick{at: p.now(), key: key})
}

// unheardPicks is the requests of the prefix key that router replicas are expected to
// have sent to ep unseen: for each of this router's own picks of that prefix there, one
// per live peer it has not heard from since. Replicas on the same view pick a prefix
// alike, and none sees the others' picks within a sync interval; in a closed loop,
// requests that finish in one engine step come back at the same instant to different
// replicas, so a pick of this router is, until its peers' next state arrives, the
// likely pick of each of them for the same prefix (kvbench --sim --replicas 2, N = 2,
// C = 16: the burst as measurement starts put 4 requests on one slow endpoint, TTFT p99
// 121 ms against kv's 101; docs/results-policy.md). Picks of other prefixes are not
// counted: a peer places those by their own holders (counted for every prefix, N = 24
// lost up to 0.4 points of cached-token ratio at 2 replicas). Picks every live peer
// has been heard from since are dropped. p.mu must be held.
func (p *Policy) unheardPicks(ep *endpointState, key uint64) int {
	n := 0
	for k := len(ep.picks) - 1; k >= 0; k-- {
		u := p.peers.Unheard(ep.picks[k].at)
		if u == 0 {
			// Older picks are heard too: peers heard after a pick were heard after
			// every earlier one.
			ep.picks = append(ep.picks[:0], ep.picks[k+1:]...)
			break
		}
		if ep.picks[k].key == key {
			n += u
		}
	}
	return n
}

// replicaSpread is how close two holders' waits must be, as a share of the smaller, for
// router replicas to count them as tied: a replica cannot see the picks its peers make
// within a sync interval of its own, so replicas that break ties the same way send
// simultaneous requests to the same endpoint (kvbench --sim --replicas 2, N = 2, C = 16:
// 5 of 6 simultaneous picks; p99 TTFT 121 ms against one router's 95).
const replicaSpread = 0.5

// replicaTie reports whether candidates i and j, of waits wi and wj, are tied for a
// router with peers, and if so whether i wins: each replica breaks ties by its own
// salt (and the pick), so that simultaneous picks of several replicas spread as one
// router's consecutive picks do. One router (no peers) has no ties here. p.mu must be
// held.
func (p *Policy) replicaTie(sc *scratch, i, j int, wi, wj float64) (tied, iWins bool) {
	if p.peers == nil || math.Abs(wi-wj) > replicaSpread*min(wi, wj) {
		return false, false
	}
	return true, mix64(p.salt^sc.eps[i].hash^p.tick) > mix64(p.salt^sc.eps[j].hash^p.tick)
}
