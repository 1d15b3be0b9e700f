package placement

import (
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// maxKeptKeys bounds the keys kept per prefix to estimate its size (keptKeys): the
// table holds about 2 x LiveWindow prefixes, so at most ~64 MB of keys.
const maxKeptKeys = 4096

// keptKeys is a request's chained block keys as a prefix entry keeps them to learn its
// size from the next request: every key up to maxKeptKeys blocks, and of a longer
// prompt every stride-th and the last. A chained key matches only where every block
// before it matches, so the blocks two requests share are known to within a stride (2
// blocks for a 128k-token prompt at 16 tokens a block). Cut at maxKeptKeys instead, a
// 100k-token context was learned as its first 64k tokens: its hits were looked up that
// far only, and counted the rest, 37k tokens, as a miss in the holder's prefill
// backlog and footprint (agent workload on 4 servers: ratio 0.894, kv 0.958).
type keptKeys struct {
	n, stride int
	last      uint64   // the key of block n-1
	keys      []uint64 // keys[j] is the key of block (j+1)*stride-1
}

// keep sets k to keys, reusing its storage.
func (k *keptKeys) keep(keys []uint64) {
	k.n, k.stride, k.keys = len(keys), max(1, (len(keys)+maxKeptKeys-1)/maxKeptKeys), k.keys[:0]
	if k.n == 0 {
		return
	}
	k.last = keys[k.n-1]
	for i := k.stride - 1; i < k.n; i += k.stride {
		k.keys = append(k.keys, keys[i])
	}
}

// kept reports whether k holds a request's keys.
func (k *keptKeys) kept() bool { return k.keys != nil }

// common returns the leading blocks keys shares with the kept request: exact where
// one extends the other or the stride is 1, else rounded down to the stride.
func (k *keptKeys) common(keys []uint64) int {
	if k.n > 0 && len(keys) >= k.n && keys[k.n-1] == k.last {
		return k.n
	}
	c := 0
	for j, key := range k.keys {
		i := (j+1)*k.stride - 1
		if i >= len(keys) || keys[i] != key {
			break
		}
		c = i + 1
	}
	return c
}

// maxPending bounds the picks remembered until Routed or Finished.
const maxPending = 1 << 16

// endpointState is what the policy keeps per endpoint: the blocks the table places
// there, the KV footprint and prefill backlog of its in-flight requests, its speed.
type endpointState struct {
	addr         string
	hash         uint64 // of the address, for rendezvous hashing
	placedBlocks int    // blocks of the live placements (sites) on it
	homeBlocks   int    // of those, the blocks of the sites that are homes
	placed       int    // how many live placements it has
	// homeGuessed is homeBlocks with each prefix seen once counted at its guessed size
	// (prefixEntry.guess): what newHome ranks endpoints by.
	homeGuessed int
	// footprint is the KV blocks the endpoint's in-flight requests (routed by this
	// router) occupy: each active prefix's blocks once, plus each request's own.
	footprint int
	active    map[uint64]*activePrefix
	// convs counts the in-flight requests per conversation (tracked.conv).
	convs map[uint64]int
	// prefill is the uncached prompt tokens of in-flight requests without a first token.
	prefill int
	// decode is a moving average of the time from first token to finish, seconds; 0
	// until measured. It ranks endpoints by speed.
	decode float64
	// prefillSpeed is, per size class of long prefills (prefillClass), moving averages
	// of the seconds to first token and of the uncached tokens of long requests routed
	// with no prefill backlog there (measurePrefill): their ratio is the endpoint's
	// measured prefill time per token at that size; unmeasured while tokens is 0.
	prefillSpeed [prefillClasses]struct{ secs, tokens float64 }
	// missesInPrefill counts in-flight requests with at least HoldPrefillTokens uncached
	// tokens and no first token yet: while > 0, hits wait at the router (HoldMax).
	missesInPrefill int
	// lastMiss is when the newest miss was routed there (waitBehindMiss).
	lastMiss time.Time
	// lastPrefill is when the newest request with uncached tokens was routed there
	// (missSooner).
	lastPrefill time.Time
	// sent counts the KV blocks this router's requests allocated there: each one's
	// uncached prompt blocks plus its output blocks (scratch.out). vLLM evicts its free blocks least
	// recently used first, so a prompt's blocks stay cached until about the endpoint's
	// capacity of blocks has been allocated after it: sent, plus with peers theirs
	// (turnover), is how far its cache has turned over. histories are this router's
	// recent long prompts (longMiss), oldest first, each by that turnover.
	sent      int
	histories []history
	// picks are this router's last picks of the endpoint (when, which prefix), with
	// peers: until every live peer is heard from after one, it counts as each unheard
	// peer's pick of that prefix too (unheardPicks).
	picks []unheardPick
	// inflight counts the requests this router routed there and has not seen finish;
	// hist is a ring of its last histLen values with footprint and time, histN how many
	// were ever recorded: SharedLoad reads this router's share of a scrape from them.
	inflight int
	hist     [histLen]ownSnapshot
	histN    int
}

// histLen bounds each endpoint's history of its own in-flight count: 64 changes (32
// requests) cover a scrape interval unless an endpoint takes over ~600 requests/s at 50 ms.
const histLen = 64

// ownSnapshot is an endpoint's own in-flight count and footprint from time at on.
type ownSnapshot struct {
	at        time.Time
	inflight  int
	footprint int
}

// record appends the endpoint's current own count and footprint at t to its history.
func (ep *endpointState) record(t time.Time) {
	ep.hist[ep.histN%histLen] = ownSnapshot{at: t, inflight: ep.inflight, footprint: ep.footprint}
	ep.histN++
}

// ownAt returns the endpoint's own in-flight count and footprint at t, and false when
// the history no longer reaches back that far.
func (ep *endpointState) ownAt(t time.Time) (ownSnapshot, bool) {
	for k := 0; k < min(ep.histN, histLen); k++ {
		s := ep.hist[(ep.histN-1-k)%histLen]
		if !s.at.After(t) {
			return s, true
		}
	}
	// Nothing recorded at or before t: nothing had been routed then, unless the ring
	// has overwritten it.
	return ownSnapshot{}, ep.histN <= histLen
}

// prefillClasses bounds the size classes of measured prefill speed: a class per
// power of two of uncached tokens, up to 2^31.
const prefillClasses = 32

// prefillClass is the size class of a prefill of n uncached tokens: attention makes a
// token's prefill cost grow with the context before it, so speeds compare only
// between prefills of about one size (within a factor of two).
func prefillClass(n int) int { return min(bits.Len(uint(n)), prefillClasses-1) }

// maxHistories bounds the long prompts remembered per endpoint (each more than one
// engine step of blocks: 64 cover 131k tokens of 2,048-token steps).
const maxHistories = 64

// remember adds h as the endpoint's newest history, forgetting the oldest past
// maxHistories.
func (ep *endpointState) remember(h history) {
	if len(ep.histories) >= maxHistories {
		ep.histories = slices.Delete(ep.histories, 0, 1)
	}
	ep.histories = append(ep.histories, h)
}

// history is a long prompt routed to an endpoint, kept while its blocks are likely
// still cached there (longMiss).
type history struct {
	id     string // the request's, to move it with Moved
	before int    // the endpoint's turnover before the prompt was routed
	cached int    // its blocks cached there when routed (its head)
	blocks int    // its blocks computed there (its tail)
}

type activePrefix struct {
	requests int
	blocks   int // the prefix's blocks as counted into footprint
	prefill  int // of the endpoint's prefill backlog, its requests' (in prefill)
	// soonestRoom's scratch, valid in the pick whose tick is stamp: the prefix's
	// decoding requests there and when the last of them finishes.
	stamp    uint64
	decoding int
	freeAt   float64
}

// prefixEntry is one row of the placement table: a prefix, its estimated size and the
// endpoints it is placed on.
type prefixEntry struct {
	key    uint64 // the prefix's name
	blocks int    // estimated shared blocks
	// branch is the fewest blocks shared by two requests under this name that diverged
	// (neither extends the other), 0 until two have: the depth at which the prefix
	// branches into conversations (a system prompt, a shared context), so a request
	// extending past it is named by its own block PrefixDepth past it. It only moves
	// shallower: set by the last diverging pair, two requests sharing more than the
	// system prompt (turns of one conversation, or two over one document) moved it
	// deeper and renamed every conversation past it, whose turns were then placed by the
	// system prompt off their histories (docs/results-workloads.md, "Probed axes",
	// conversations at 6x).
	branch int
	// guess is the size guessed for a prefix seen once whose prompt fits one engine
	// step (0: none, or its size is learned): the mean size learned so far (newHome).
	// learned: its first two requests have been compared (its size counted into that
	// mean).
	guess   int
	learned bool
	// base is the blocks of the branched prefix this one extends (0 for a prefix named
	// by its PrefixDepth-th block): its placements count only blocks - base, the rest
	// being the parent's.
	base int
	// parent is the branched prefix's key (a conversation: base > 0).
	parent uint64
	keys   keptKeys // the last request's keys, to estimate blocks
	seen   uint64   // the pick (tick) that last saw the prefix
	// born is the pick (tick) that created the entry and picks the picks named by it
	// since: its share of the requests routed (evenShare).
	born  uint64
	picks int
	sites []site // where the prefix is placed
	// last is the ID of the conversation's last request routed (a conversation: base
	// > 0), to join it while it is in prefill (joinHistory).
	last string
	// decided is when a decision (a placement made or dropped, here or by a router
	// replica) last changed sites: replicas share placements, the latest decision wins.
	decided time.Time
}

// site is one placement of a prefix on an endpoint: its home, or a replica or spill.
type site struct {
	ep       *endpointState
	addr     string
	home     bool
	lastUsed uint64 // the pick (tick) that last chose it
	placedAt uint64 // the pick that made it
}

type pendingPick struct {
	key     uint64
	addr    string
	blocks  int    // the request's full blocks
	pblocks int    // its prefix's estimated blocks at the pick
	shared  int    // its blocks its conversation's requests hold on addr (scratch.shared)
	prefill int    // its uncached prompt tokens on addr, per the index at the pick
	bs      int    // the block size its keys were cut at
	conv    uint64 // the conversation it continues past a branched prefix; 0: none
	out     int    // the output blocks it counts for (scratch.out)
	// exact: the index was asked past the blocks addr holds, so prefill is its
	// uncached part (Pick asks only about the prefix's blocks and one more).
	exact bool
}

// tracked is an in-flight request's share of an endpoint's footprint.
type tracked struct {
	ep  *endpointState
	key uint64
	// parent is the branched prefix a conversation's turn (key) extends, activated
	// beside it with the blocks they share, so that turns of several conversations on
	// one context count it once in the footprint; 0 for others.
	parent uint64
	conv   uint64 // the conversation it continues (pendingPick.conv); 0: none
	unique int
	// out is the output blocks it counts for (pendingPick.out): in its endpoint's
	// turnover from Routed, in unique and the footprint from FirstToken (in prefill or
	// queued it holds none).
	out     int
	prefill int       // uncached tokens, released at the first token
	tokens  int       // prompt tokens: the prefill where the request moves (Moved)
	first   time.Time // zero until FirstToken
	miss    bool      // counted in ep.missesInPrefill
	// routed is when it was routed, ahead the prefill backlog it joined there: a long
	// prefill's time to first token measures the endpoint's prefill speed when ahead
	// is 0.
	routed time.Time
	ahead  int
	exact  bool // prefill is known, not estimated from a lookup cut short (pendingPick)
}

// newPrefix returns a new entry for key, of blocks blocks, past base and under parent
// (0 for none), seen and born at this pick; the caller stores it. p.mu must be held.
func (p *Policy) newPrefix(key uint64, blocks, base int, parent uint64) *prefixEntry {
	return &prefixEntry{key: key, blocks: blocks, base: base, parent: parent, seen: p.tick, born: p.tick}
}

// prefix returns key's entry, creating it, and refreshes its size estimate from keys
// (cut at bs tokens per block); p.mu must be held.
func (p *Policy) prefix(key uint64, keys []uint64, bs int) *prefixEntry {
	e := p.prefixes[key]
	if e == nil {
		e = p.newPrefix(key, len(keys), 0, 0)
		e.keys.keep(keys)
		if p.learnedN > 0 && p.fitsStep(len(keys)*bs, bs) {
			// Named by its PrefixDepth-th block, a prefix shares at least that many.
			e.guess = max(p.cfg.PrefixDepth, int(math.Round(float64(p.learnedBlocks)/float64(p.learnedN))))
		}
		p.prefixes[key] = e
	} else if !e.keys.kept() {
		// Placed by a router replica (MergePlacements), first seen here: keep its size.
		e.keys.keep(keys)
	} else {
		common := e.keys.common(keys)
		if common < len(keys) && common < e.keys.n && (e.branch == 0 || common < e.branch) {
			e.branch = common
		}
		if !e.learned && e.base == 0 {
			e.learned = true
			p.learnedBlocks += common
			p.learnedN++
		}
		if common != e.blocks || e.guess > 0 {
			w, g := e.weight(), e.guessed()
			e.blocks, e.guess = common, 0
			for _, pl := range e.sites {
				pl.ep.placedBlocks += e.weight() - w
				if pl.home {
					pl.ep.homeBlocks += e.weight() - w
					pl.ep.homeGuessed += e.weight() - g
				}
			}
		}
		e.keys.keep(keys)
	}
	e.seen = p.tick
	e.picks++
	p.expire(e)
	return e
}

// expire drops e's placements unused for LiveWindow picks; p.mu must be held.
func (p *Policy) expire(e *prefixEntry) {
	p.resite(e, slices.DeleteFunc(e.sites, func(pl site) bool {
		if p.tick-pl.lastUsed <= uint64(p.cfg.LiveWindow) {
			return false
		}
		p.unplace(e, &pl)
		return true
	}))
}

// drop removes e's placement on addr, if any; p.mu must be held.
func (p *Policy) drop(e *prefixEntry, addr string) {
	p.resite(e, slices.DeleteFunc(e.sites, func(pl site) bool {
		if pl.addr != addr {
			return false
		}
		p.unplace(e, &pl)
		p.decide(e)
		return true
	}))
}

// resite sets e's sites, counting the prefixes placed somewhere (Policy.sited); p.mu
// must be held.
func (p *Policy) resite(e *prefixEntry, sites []site) {
	if was, is := len(e.sites) > 0, len(sites) > 0; was != is {
		if is {
			p.sited++
		} else {
			p.sited--
		}
	}
	e.sites = sites
}

func (p *Policy) unplace(e *prefixEntry, pl *site) {
	pl.ep.placedBlocks -= e.weight()
	pl.ep.placed--
	if pl.home {
		pl.ep.homeBlocks -= e.weight()
		pl.ep.homeGuessed -= e.guessed()
	}
}

// weight is the blocks e's placements count on their endpoints: its own beyond the
// prefix it extends.
func (e *prefixEntry) weight() int { return max(0, e.blocks-e.base) }

// guessed is weight, at most the guessed size while the prefix has been seen once.
func (e *prefixEntry) guessed() int {
	if e.guess > 0 {
		return min(e.guess, e.weight())
	}
	return e.weight()
}

// grows reports whether e is a history that grows request by request: a conversation
// past a branched prefix, or a prefix whose requests, compared at least once, have
// shared more than where they last diverged (never diverged: each extended the last).
// A shared prefix that stays put branches right past it; one seen once is not known.
func (e *prefixEntry) grows() bool {
	return e.base > 0 || (e.learned && (e.branch == 0 || e.blocks > e.branch))
}

// held is the leading blocks an endpoint must hold to hold e: its parent's, plus share
// of its own (at least one).
func (e *prefixEntry) held(share float64) int {
	return e.base + max(1, int(math.Ceil(share*float64(e.weight()))))
}

// sweep expires placements everywhere and drops prefixes with none left; if the table
// is still too large, it drops prefixes at random. p.mu must be held.
func (p *Policy) sweep() {
	for k, e := range p.prefixes {
		p.expire(e)
		if len(e.sites) == 0 && p.tick-e.seen > uint64(p.cfg.LiveWindow) {
			delete(p.prefixes, k)
		}
	}
	for k, e := range p.prefixes {
		if len(p.prefixes) <= p.cfg.MaxPrefixes {
			break
		}
		for i := range e.sites {
			p.unplace(e, &e.sites[i])
		}
		p.resite(e, nil)
		delete(p.prefixes, k)
	}
}

func (p *Policy) endpoint(addr string) *endpointState {
	ep := p.eps[addr]
	if ep == nil {
		ep = &endpointState{addr: addr, hash: xxhash.Sum64String(addr)}
		p.eps[addr] = ep
	}
	return ep
}

// place adds (or finds) e's placement on addr and returns its position; p.mu must be held.
func (p *Policy) place(e *prefixEntry, addr string, home bool) int {
	for i := range e.sites {
		if e.sites[i].addr == addr {
			if home && !e.sites[i].home {
				e.sites[i].home = true
				e.sites[i].ep.homeBlocks += e.weight()
				e.sites[i].ep.homeGuessed += e.guessed()
				p.decide(e)
			}
			return i
		}
	}
	ep := p.endpoint(addr)
	ep.placedBlocks += e.weight()
	ep.placed++
	if home {
		ep.homeBlocks += e.weight()
		ep.homeGuessed += e.guessed()
	}
	p.resite(e, append(e.sites, site{ep: ep, addr: addr, home: home, lastUsed: p.tick, placedAt: p.tick}))
	p.decide(e)
	return len(e.sites) - 1
}

func (p *Policy) touch(e *prefixEntry, addr string, home bool) {
	e.sites[p.place(e, addr, home)].lastUsed = p.tick
}
