package placement

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/scoring"
)

// Policy is the placement policy: it keeps a table of where each prefix lives and
// sends requests there, so that prefixes stay partitioned over the fleet instead of
// being recomputed, and evicting one another, wherever load happens to be lowest.
//
// A request's prefix is named by the key of its PrefixDepth-th block (no workload
// knowledge needed); its size is estimated as the blocks two consecutive requests with
// that name share. Load is the router's in-flight count (ScrapedLoad: or vLLM's running
// plus waiting, when larger); "wait" ranks endpoints by (load + 1) x their measured
// decode time, so faster endpoints take more. For each request, in order:
//
//  1. Holders are the endpoints the table places the prefix on, plus any the index says
//     hold HolderShare of it (adopted, so router replicas converge on one another's
//     placements). A replica the index does not confirm within ConfirmPicks is dropped.
//  2. A prefix with no holder gets a home: the endpoint with the least home-placed
//     blocks per block of KV capacity (a capacity-weighted partition), preferring those
//     below Saturated with KV room. A prefix seen once whose prompt fits one engine step
//     counts there as the mean size learned from other prefixes (its prompt only bounds
//     its size).
//  3. When the index shows that the home lost the prefix (no request for it in flight
//     there) and no holder has it, the request missesInPrefill wherever it goes: with RehomeLost
//     the home moves to the endpoint with KV room that would start the miss soonest
//     among those whose home share stays within RehomeSlack of the mean.
//  4. The holder of least wait takes it if its load is below ReplicaLoad (with
//     StickyHolders, the idle holder of highest rendezvous score, so that router
//     replicas agree; with PreferHeld, holders the index shows holding it first). A
//     router replica of rank r takes the holder one router's (r+1)-th pick in a row
//     would (holderTurn). With FasterCopies, router replicas give a request whose idle
//     holder holds a shared prefix to an idle endpoint faster beyond noise
//     (MissSpeedup) that holds no copy beyond its homes and has room for one, which
//     takes a copy (fasterCopy): one fast copy per prefix.
//  5. Otherwise a less-loaded endpoint whose live placements leave room for the prefix
//     within Fill of its capacity takes a replica (it evicts nothing live); a growing
//     history with no other request in flight only when its copy is worth its miss,
//     as past Fill (moveWorth). Past Fill,
//     an idle endpoint with room beside its live placements and requests takes one when
//     the prefix is a shared one that stays put and its prefill (the tokens the copy
//     adds) is less than the request's own tokens past the prefix times the requests
//     running at the holder, whose steps the hit's prefill would join: the smaller the
//     share of the prompt a hit saves, the sooner a copy pays. The holder may be a home
//     that lost a prefix held nowhere (one rule 3 keeps), judged the same way. Router
//     replicas break exact ties between copies by rank while the fleet is cold, as
//     between new homes (coldTie).
//  6. Otherwise the holder of least wait with KV room takes it; failing that, the
//     request queues at the least-loaded holder until it reaches SpillLoad, where the
//     prefix spills to the endpoint whose live placements it would overflow least.
//
// The chosen endpoint may then be overridden for this request alone (nothing placed),
// toward the candidate with KV room that would start it soonest: when the chosen one
// has no KV room for it (DivertOnFull; with no room anywhere, to where room comes
// soonest), when its prefill backlog exceeds one engine step (DivertDeadline) and the
// other would start it twice as soon (failing that, behind a prefill in progress, to
// the soonest endpoint with no prefill in progress whose next step fits the request's
// prefill and whose live placements leave room for its copy; a miss only of a prefix
// held nowhere), or when it is busy, holds too little of the prefix to hit, and an idle
// faster endpoint exists (DivertMisses; failing that, behind a long prefill there, to
// the candidate that would start it twice as soon). A replica or spill placement made by that pick
// is then dropped (UnplaceDiverted): no request fills it.
//
// With LongContexts, a conversation's turn sent while its last request is still in
// prefill goes where that request is, however loaded (joinHistory), ahead
// of those overrides; and a long miss with none of them, other than a new prefix's
// first request (its home is the partition's), moves where it evicts fewer recent long
// prompts or its prefill finishes sooner at measured prefill speed (longMiss).
//
// KV room is each endpoint's footprint, tracked from Routed to Finished: every active
// prefix once plus each request's own blocks (less those its conversation's requests in
// flight there hold: scratch.shared) and, from its first token, its output blocks
// (outputBlocks), against Headroom of its capacity.
// Placements not used for LiveWindow picks expire; a departed endpoint (Forget) loses
// its placements and only its prefixes move. Requests without a full block of token ids
// go to the least-loaded candidate.
//
// Policy implements scoring.Observer (footprint, prefill backlog and decode timing; a request
// routed elsewhere than picked, or moved to a fallback that served it, places its prefix
// where it went). It is safe for concurrent use.
type Policy struct {
	cfg     Config
	ix      scoring.PrefixIndex
	m       *metrics
	now     func() time.Time
	scratch sync.Pool

	mu       sync.Mutex
	tick     uint64
	eps      map[string]*endpointState
	prefixes map[uint64]*prefixEntry
	// sited counts the prefixes placed on at least one endpoint (resite).
	sited   int
	pending map[string]pendingPick
	reqs    map[string]tracked
	peers   PeerView // other router replicas' load (SetPeers); nil: none
	// salt is this replica's tie-break (SetPeers), changed the prefixes whose placement
	// changed since Placements last reported them (only while peers are set).
	salt    uint64
	changed map[uint64]struct{}
	// learnedBlocks sums the sizes learned from prefixes' first two requests, learnedN
	// counts them: their mean is the guessed size of a prefix seen once (newHome).
	learnedBlocks, learnedN int
}

type metrics struct {
	decisions *prometheus.CounterVec
}

// scoring.Decision kinds (Decision.Kind), counted by kvrouter_scoring_placement_decisions_total.
const (
	kindHolder      = "holder"
	kindHome        = "home"
	kindReplica     = "replica"
	kindSpill       = "spill"
	kindDivert      = "divert"
	kindQueue       = "queue"
	kindUntokenized = "untokenized"
	kindHold        = "hold"
)

// New returns the placement policy over ix. now is the clock that times responses
// to rank endpoints by speed (nil: time.Now); reg may be nil.
func New(cfg Config, ix scoring.PrefixIndex, now func() time.Time, reg prometheus.Registerer) (*Policy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("placement: config: %w", err)
	}
	if ix == nil {
		return nil, errors.New("placement: the policy needs an index")
	}
	m := &metrics{decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_scoring_placement_decisions_total",
		Help: "Placement policy decisions by kind: holder, home, replica, spill, divert, queue, untokenized, hold (the router is asked to wait and pick again).",
	}, []string{"kind"})}
	for _, k := range []string{kindHolder, kindHome, kindReplica, kindSpill, kindDivert, kindQueue, kindUntokenized, kindHold} {
		m.decisions.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.decisions)
	}
	if now == nil {
		now = time.Now
	}
	return &Policy{
		cfg: cfg, ix: ix, m: m, now: now,
		eps:      make(map[string]*endpointState),
		prefixes: make(map[uint64]*prefixEntry),
		pending:  make(map[string]pendingPick),
		reqs:     make(map[string]tracked),
	}, nil
}

// Name returns "placement".
func (*Policy) Name() string { return "placement" }

// Pick returns the candidate chosen by the rules on Policy; Fallbacks are the other
// holders by load, then the rest by load.
func (p *Policy) Pick(req *scoring.Request, cands []scoring.Endpoint) (scoring.Decision, error) {
	n := len(cands)
	if n == 0 {
		return scoring.Decision{}, scoring.ErrNoCandidates
	}
	sc, _ := p.scratch.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	defer p.scratch.Put(sc)
	sc.loads = slices.Grow(sc.loads[:0], n)[:n]
	for i := range cands {
		sc.loads[i] = p.load(&cands[i])
	}
	// Keys at the first candidate's block size: a fleet serving one model has one.
	bs := p.blockSize(&cands[0])
	sc.blockSize = bs
	sc.out = p.outputBlocks(req, cands, bs)
	if req.TokenIDs != nil {
		sc.keys = req.Keys(bs, sc.keys[:0])
	} else {
		sc.keys = sc.keys[:0]
	}
	if len(sc.keys) == 0 {
		best := argminLoad(sc.loads, nil)
		p.m.decisions.WithLabelValues(kindUntokenized).Inc()
		d := p.decision(cands, sc, best, nil)
		d.Kind = kindUntokenized
		return d, nil
	}
	sc.names = slices.Grow(sc.names[:0], n)[:n]
	for i := range cands {
		sc.names[i] = cands[i].Address
	}
	key := sc.keys[min(p.cfg.PrefixDepth, len(sc.keys))-1]
	// Only the prefix's blocks (plus one, to see it grow) matter: look those up.
	look := len(sc.keys)
	p.mu.Lock()
	// A conversation this router has not seen is looked up whole: with peers its
	// earlier turns may have gone through a peer (followed); alone, its first turn is a
	// long miss of known size (longMiss) rather than a hit of its system prompt's; one it
	// has seen is looked up to its size (lookBlocks).
	child, base := p.childName(key, sc.keys)
	if e := p.prefixes[child]; base > 0 && e != nil {
		look = p.lookBlocks(e, look)
	} else if e := p.prefixes[key]; e != nil && base == 0 {
		look = p.lookBlocks(e, look)
	}
	p.mu.Unlock()
	sc.lead = p.ix.LeadingBlocks(sc.keys[:look], sc.names, sc.lead)
	sc.looked = look

	p.mu.Lock()
	p.tick++
	if p.tick%uint64(p.cfg.LiveWindow) == 0 || len(p.prefixes) > p.cfg.MaxPrefixes {
		p.sweep()
	}
	var joins *endpointState
	sc.conv, sc.convBlocks = 0, 0
	if base > 0 {
		var follow bool
		follow, joins = p.followed(key, child, base, sc)
		if follow {
			key = child
		}
	}
	e := p.prefix(key, sc.keys, bs)
	best, kind := p.choose(e, key, cands, sc)
	alt, joined := -1, false
	if j := p.joinHistory(joins, sc); j >= 0 {
		joined = true
		if r := p.recomputeSooner(cands, sc, j, len(req.TokenIDs), bs); r >= 0 {
			alt = r
		} else {
			if j != best {
				p.unplaceUnused(e, cands, sc, best, kind)
			}
			best, kind = j, kindHolder
		}
	} else {
		alt = p.divert(e, key, cands, sc, best, len(req.TokenIDs), bs)
		if alt < 0 && kind != kindHome {
			// A new prefix's home is the partition's choice: moved with its first
			// request, the agent workload's contexts lost reuse (ratio 0.954 -> 0.938).
			alt = p.longMiss(cands, sc, best, len(req.TokenIDs), bs)
		}
	}
	var delay time.Duration
	if alt < 0 {
		delay = p.waitBehindMiss(req, e, key, sc, best, bs)
		// A held hit, or a new prefix's first request homed beside a miss in prefill
		// or, once every endpoint's speed is measured even, beside any prefill
		// (missSooner).
		home := kind == kindHome && (sc.eps[best].missesInPrefill > 0 || sc.measured && sc.eps[best].prefill > 0)
		if !joined && sc.even && (delay > 0 || home) {
			if r := p.missSooner(cands, sc, best, len(req.TokenIDs), bs); r >= 0 {
				alt, delay = r, 0
			}
		}
	}
	if d := alt; d >= 0 {
		p.unplaceUnused(e, cands, sc, best, kind)
		best, kind = d, kindDivert
	} else {
		p.touch(e, cands[best].Address, kind == kindHome)
	}
	addr := cands[best].Address
	if len(p.pending) >= maxPending {
		for id := range p.pending { // any one: Go's map order is random
			delete(p.pending, id)
			break
		}
	}
	if req.ID != "" {
		shared := sc.shared(sc.eps[best])
		pp := pendingPick{key: key, addr: addr, blocks: len(sc.keys), pblocks: e.blocks, shared: shared,
			prefill: max(0, len(req.TokenIDs)-max(sc.lead[best], shared)*bs), bs: bs, exact: sc.lead[best] < look,
			out: sc.out}
		if base > 0 {
			pp.conv = child
		}
		p.pending[req.ID] = pp
	}
	p.mu.Unlock()
	if delay > 0 {
		kind = kindHold
	}
	p.m.decisions.WithLabelValues(kind).Inc()
	d := p.decision(cands, sc, best, sc.pos)
	d.Hold, d.Kind = delay, kind
	return d, nil
}

// lookBlocks is how many of a request's n leading blocks to look up in the index for
// its prefix e: the prefix's size plus one (to see it grow), and all n with peers when
// e is a history that grows (a conversation's, an agent's). Its turns reach any router
// replica, so this router's size of it is the turn it last routed, two or more turns
// old, and cut there every endpoint holding more looked alike: a turn went to the
// endpoint holding 103 of its blocks while another held 118, and one holding 85 of a
// history that had grown to 91 blocks counted as not holding it at all (its lookup cut
// at 56, under the half the holder check wants), so the turn went to a site that had
// lost it. kv looks up every block and sees them apart; looked up whole (and replica
// ties broken by it, choose), 2 replicas on chat move 36 turns off the endpoint
// holding the most of their prompt instead of 61 (kv 29 to 39), for a cached-token
// ratio of 0.648 instead of 0.547 (kv 0.636; docs/results-workloads.md, "Probed
// axes"). The lookup is then as long as the request, as kv's always is. One router
// routes every turn and knows the size. With peers so is a prefix whose size this
// router has not learned (seen once here, or its size a peer's placement gave):
// whether it grows is unknown, and a conversation without a shared system prompt is
// one, its turns alternating between replicas. Cut at the size a peer's placement of
// its first turn gave, the endpoint holding the peer's newer turn looked to hold under
// half of the history the turn revealed, and the turn went to a placement that had
// lost it (chat without system prompts, 2 replicas: 22 third turns sent off the
// endpoint holding the most of their prompt, one router 8). A shared prefix that
// stays put is looked up whole then too: as kv's lookup always is. p.mu must be held.
func (p *Policy) lookBlocks(e *prefixEntry, n int) int {
	if p.peers != nil && (e.grows() || !e.learned) {
		return n
	}
	return min(n, max(e.blocks+1, p.cfg.PrefixDepth))
}

// childName returns the name of the conversation a request continues past a branched
// prefix (one whose requests diverge: a shared system prompt or context), the key of
// its PrefixDepth-th block past the branch, and the branch depth; base 0 when the
// prefix named by key has not branched or the request does not reach that far. p.mu
// must be held.
func (p *Policy) childName(key uint64, keys []uint64) (child uint64, base int) {
	e := p.prefixes[key]
	if e == nil || e.branch == 0 || len(keys) < e.branch+p.cfg.PrefixDepth {
		return 0, 0
	}
	return keys[e.branch+p.cfg.PrefixDepth-1], e.branch
}

// followed reports whether the request is placed by its conversation (child) rather
// than by the branched prefix it extends: when the table has seen the conversation
// before and it is placed somewhere, or the index shows an endpoint holding HolderShare
// of it. A conversation seen for the first time gets an entry (no placement) and is
// placed by its parent, so that its next turn finds it where this one went; with peers,
// by itself where the index shows a turn of it a peer routed. When it is
// not followed but the conversation's last request, sharing HolderShare of it, is still
// in prefill (so the index does not show it yet), joins is that request's endpoint
// (joinHistory). p.mu must be held.
func (p *Policy) followed(parent, child uint64, base int, sc *scratch) (follow bool, joins *endpointState) {
	c := p.prefixes[child]
	if c == nil {
		c := p.newPrefix(child, len(sc.keys), base, parent)
		// With router replicas, new to this table is not new to the fleet: an endpoint
		// holding the block that names the conversation computed an earlier turn of
		// it, which a peer routed (a conversation's turns reach any replica). Its size
		// is then what the index shows of it and it is placed where that is, as its
		// peer would place it; by its parent, the turn went to whichever holder of the
		// system prompt ranked first and recomputed its history (the 600-request trace
		// with 2 replicas: cached-token ratio 0.527 -> 0.549, kv 0.554; p99 TTFT 4,727
		// -> 4,368 ms, kv 4,414; docs/results-workloads.md, "Probed axes"). One router
		// sees every turn: it meets a conversation unseen only when the turn before
		// came before its system prompt had branched, where this rule moved chat cells
		// both ways (seed 2 ratio 0.700 -> 0.675, kv 0.678), so it keeps the parent.
		if held := slices.Max(sc.lead); p.peers != nil && held >= base+p.cfg.PrefixDepth {
			c.blocks = held
			p.prefixes[child] = c
			sc.conv, sc.convBlocks = child, held
			return true, nil
		}
		c.keys.keep(sc.keys)
		p.prefixes[child] = c
		return false, nil
	}
	if c.parent == 0 && c.base == base {
		// Merged from a peer's placements (MergePlacements), which name no parent:
		// the request names it. Without it the turn's context, active at the
		// endpoint, counted twice in its KV room (need) and in its footprint
		// (Routed).
		c.parent = parent
	}
	last, inFlight := p.reqs[c.last]
	// Its size once this request is counted in: the blocks it shares with the last.
	common := c.keys.common(sc.keys)
	sc.conv, sc.convBlocks = child, common
	prefilling := inFlight && last.first.IsZero() && p.cfg.LongContexts
	if len(c.sites) > 0 && !prefilling {
		return true, nil
	}
	held := base + max(1, int(math.Ceil(p.cfg.HolderShare*float64(common-base))))
	if prefilling && common >= held {
		joins, sc.history = last.ep, last
	}
	if len(c.sites) > 0 {
		return true, joins
	}
	for _, l := range sc.lead {
		if l >= held {
			return true, joins
		}
	}
	c.seen = p.tick
	c.keys.keep(sc.keys)
	c.blocks = common
	return false, joins
}

// unplaceUnused drops the replica or spill placement the pick of kind made on best when
// the request goes elsewhere (UnplaceDiverted): no request fills it. Homes stay, so the
// partition stays put. p.mu must be held.
func (p *Policy) unplaceUnused(e *prefixEntry, cands []scoring.Endpoint, sc *scratch, best int, kind string) {
	if p.cfg.UnplaceDiverted && (kind == kindReplica || kind == kindSpill) {
		p.drop(e, cands[best].Address)
		sc.pos[best] = -1
	}
}

// joinHistory returns the candidate whose state is ep, where the request's history
// (its conversation's last request) is in prefill; -1 when there is none. There the
// request waits behind the rest of the history's prefill, as it would recompute all of
// it anywhere else, and then hits it (trace-600 seed 2: the second and third turns of
// a 35k-token document sent while its first was in prefill). It joins however loaded
// the endpoint is: a fleet behind its arrivals has every endpoint past Saturated, and
// gated there, the 200-request trace at 8x sent two 36k-token last turns, 0.6 s before
// their histories' first tokens, to endpoints recomputing 35k tokens each (TTFT 6.6 s,
// against 1.6 and 2.0 s for kv's hits; cached-token ratio 0.410 -> 0.526, kv 0.496;
// docs/results-workloads.md), unless another endpoint is measured to compute the whole
// request sooner (recomputeSooner). p.mu must be held.
func (p *Policy) joinHistory(ep *endpointState, sc *scratch) int {
	if ep == nil {
		return -1
	}
	for i := range sc.eps {
		if sc.eps[i] == ep {
			return i
		}
	}
	return -1
}

// recomputeSooner returns the candidate that would compute the request before the
// conversation's last request (sc.history), in prefill at candidate j, ends its
// prefill there, or -1: among candidates that may take it (below Saturated, with KV
// room) with no prefill backlog, the one whose prefill of the request (its uncached
// tokens there, at its measured prefill speed for their size) ends soonest, when
// before the history's rest (its backlog and prefill at j's measured speed for their
// size, less the time since it was routed). An endpoint with no speed measured for
// that size is not counted, and j's speed unmeasured is the slowest measured: the
// join is left only for a recompute measured faster. Trace-600 seed 1 at 4x: a
// document's second turn sent 1.3 s into its first turn's 6 s prefill on a 0.7-speed
// endpoint waited 5.1 s for its first token there, 4.5 s recomputed on a full-speed
// one with no backlog (p99 TTFT 5,130 -> 4,234 ms, kv 4,259; docs/results-workloads.md).
// p.mu must be held.
func (p *Policy) recomputeSooner(cands []scoring.Endpoint, sc *scratch, j, tokens, bs int) int {
	h := &sc.history
	spt := sc.prefillSecsPerToken(j, h.prefill)
	if spt == 0 {
		return -1
	}
	rest := float64(h.ahead+h.prefill)*spt - p.now().Sub(h.routed).Seconds()
	alt, ea := -1, rest
	for i := range cands {
		if i == j || !sc.ok[i] || sc.eps[i].prefill+sc.otherPrefill[i] > 0 {
			continue
		}
		n := max(0, tokens-sc.lead[i]*bs)
		m := sc.eps[i].prefillSpeed[prefillClass(n)]
		if m.tokens == 0 {
			continue
		}
		if x := float64(n) * m.secs / m.tokens; x < ea {
			alt, ea = i, x
		}
	}
	return alt
}

func argminLoad(loads []int, skip []bool) int {
	best := -1
	for i, l := range loads {
		if (skip == nil || !skip[i]) && (best < 0 || l < loads[best]) {
			best = i
		}
	}
	return best
}

// decision builds the answer: best first, then up to scoring.MaxFallbacks others, holders (pos
// >= 0) before the rest, each by load.
func (p *Policy) decision(cands []scoring.Endpoint, sc *scratch, best int, pos []int) scoring.Decision {
	d := scoring.Decision{Endpoint: cands[best].Address}
	if len(cands) == 1 {
		return d
	}
	rank := func(i int) int {
		r := sc.loads[i]
		if pos == nil || pos[i] < 0 {
			r += 1 << 30
		}
		return r
	}
	var top [scoring.MaxFallbacks]int
	k := 0
	for i := range cands {
		if i == best {
			continue
		}
		// Insert i into top[:k], kept sorted by rank (stable: earlier candidates first).
		j := min(k, scoring.MaxFallbacks-1)
		if k == scoring.MaxFallbacks && rank(i) >= rank(top[j]) {
			continue
		}
		for j > 0 && rank(i) < rank(top[j-1]) {
			top[j] = top[j-1]
			j--
		}
		top[j] = i
		k = min(k+1, scoring.MaxFallbacks)
	}
	d.Fallbacks = make([]string, k)
	for j := range k {
		d.Fallbacks[j] = cands[top[j]].Address
	}
	return d
}

// Routed counts the request into endpoint's KV footprint and, when the router sent it
// somewhere other than Pick chose (a fallback), places its prefix there.
func (p *Policy) Routed(req *scoring.Request, endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pd, ok := p.pending[req.ID]
	if !ok {
		return
	}
	delete(p.pending, req.ID)
	if _, dup := p.reqs[req.ID]; dup {
		return
	}
	if pd.addr != endpoint {
		if e := p.prefixes[pd.key]; e != nil {
			p.touch(e, endpoint, false)
		}
	}
	if len(p.reqs) >= maxPending {
		for id := range p.reqs {
			p.release(id)
			break
		}
	}
	ep := p.endpoint(endpoint)
	p.noteUnheardPick(ep, pd.key)
	base, parent := 0, uint64(0)
	// A long parent only (an agent's context): a chat's 512-token system prompt,
	// counted once too, moved the 200-request trace's p99 TTFT from 3,793 to 5,666 ms
	// and trace-600 seed 1 from 4.74 to 4.65 requests/s (kv 4.73), by chance.
	if e := p.prefixes[pd.key]; e != nil && e.base > 0 && e.parent != 0 && !p.fitsStep(e.base*pd.bs, pd.bs) {
		base, parent = min(e.base, pd.pblocks), e.parent
		ep.activate(parent, base)
	}
	a := ep.activate(pd.key, pd.pblocks-base)
	shared := base + a.blocks
	if pd.addr == endpoint {
		shared = max(shared, pd.shared)
	}
	r := tracked{ep: ep, key: pd.key, parent: parent, conv: pd.conv, unique: max(0, pd.blocks-shared), out: pd.out, tokens: len(req.TokenIDs)}
	if pd.addr == endpoint {
		r.prefill = pd.prefill
	} else {
		r.prefill = r.tokens
	}
	r.routed, r.ahead, r.exact = p.now(), ep.prefill, pd.exact || pd.addr != endpoint
	p.join(&r)
	p.reqs[req.ID] = r
	p.allocate(ep, req.ID, r.tokens, r.prefill, pd.bs, pd.out, r.exact)
	if c := p.prefixes[pd.conv]; pd.conv != 0 && c != nil {
		c.last = req.ID
	}
}

// allocate counts a routed request's blocks, its uncached prompt's and its out output
// blocks, into ep's turnover (sent) and remembers its prompt as a history when its
// uncached part is known (exact) and longer than one engine step (MaxNumBatchedTokens
// plus a block): evicted, it would cost more than a step to recompute. p.mu must be
// held.
func (p *Policy) allocate(ep *endpointState, id string, tokens, prefill, bs, out int, exact bool) {
	computed := (prefill + bs - 1) / bs
	if exact && !p.fitsStep(prefill, bs) {
		before, _ := p.turnover(ep, nil)
		ep.remember(history{id: id, before: before, cached: (tokens - prefill) / bs, blocks: computed})
	}
	ep.sent += computed + out
}

// Moved moves a routed request to endpoint, where the proxy served it (a listed
// fallback it retried on after the first choice failed): its footprint, its prefill
// backlog (the whole prompt, as for a request routed elsewhere than picked) and its miss
// leave the first choice for endpoint, and its prefix is placed there, as Routed does
// for a request sent elsewhere than picked. Local and Placements, what peers see,
// follow.
func (p *Policy) Moved(reqID, endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.reqs[reqID]
	if !ok {
		return
	}
	to := p.endpoint(endpoint)
	if r.ep == to {
		return
	}
	if e := p.prefixes[r.key]; e != nil {
		p.touch(e, endpoint, false)
	}
	blocks, pblocks := 0, 0 // the prefix's (and parent's) blocks as counted at the first choice
	if a := r.ep.active[r.key]; a != nil {
		blocks = a.blocks
	}
	if a := r.ep.active[r.parent]; r.parent != 0 && a != nil {
		pblocks = a.blocks
	}
	p.leave(&r)
	// Its prompt is computed where it was served: its history moves there.
	for k, h := range r.ep.histories {
		if h.id == reqID {
			r.ep.histories = slices.Delete(r.ep.histories, k, k+1)
			before, _ := p.turnover(to, nil)
			to.remember(history{id: reqID, before: before, blocks: h.cached + h.blocks})
			to.sent += h.cached + h.blocks + r.out
			break
		}
	}
	r.ep = to
	if r.parent != 0 {
		to.activate(r.parent, pblocks)
	}
	to.activate(r.key, blocks)
	if r.first.IsZero() {
		r.prefill = r.tokens
		r.routed, r.ahead, r.exact = p.now(), to.prefill, true
	}
	p.join(&r)
	p.reqs[reqID] = r
}

// activate counts one more in-flight request of the prefix key on ep, the prefix's
// blocks counted into its footprint once; p.mu must be held.
func (ep *endpointState) activate(key uint64, blocks int) *activePrefix {
	if ep.active == nil {
		ep.active = make(map[uint64]*activePrefix)
	}
	a := ep.active[key]
	if a == nil {
		a = &activePrefix{blocks: blocks}
		ep.active[key] = a
		ep.footprint += a.blocks
	}
	a.requests++
	return a
}

// deactivate counts one request of the prefix key fewer on ep, undoing activate; p.mu
// must be held.
func (ep *endpointState) deactivate(key uint64) {
	if a := ep.active[key]; a != nil {
		if a.requests--; a.requests <= 0 {
			ep.footprint -= a.blocks
			delete(ep.active, key)
		}
	}
}

// join counts r, its prefix already activated, on r.ep: its own blocks, its place in
// flight and, before its first token, its prefill and miss; p.mu must be held.
func (p *Policy) join(r *tracked) {
	ep := r.ep
	ep.footprint += r.unique
	ep.inflight++
	if r.conv != 0 {
		if ep.convs == nil {
			ep.convs = make(map[uint64]int)
		}
		ep.convs[r.conv]++
	}
	if p.cfg.SharedLoad {
		ep.record(p.now())
	}
	r.miss = false
	if !r.first.IsZero() {
		return
	}
	ep.prefill += r.prefill
	if a := ep.active[r.key]; a != nil {
		a.prefill += r.prefill
	}
	if r.prefill > 0 {
		ep.lastPrefill = p.now()
	}
	if r.prefill >= p.cfg.HoldPrefillTokens {
		r.miss = true
		ep.missesInPrefill++
		ep.lastMiss = p.now()
	}
}

// FirstToken starts timing the request's decode.
func (p *Policy) FirstToken(reqID string) {
	t := p.now()
	p.mu.Lock()
	if r, ok := p.reqs[reqID]; ok && r.first.IsZero() {
		r.first = t
		r.unique += r.out // decoding, it holds its output blocks
		r.ep.footprint += r.out
		p.measurePrefill(&r, t)
		r.ep.prefill -= r.prefill
		if a := r.ep.active[r.key]; a != nil {
			a.prefill -= r.prefill
		}
		if r.miss {
			r.miss = false
			r.ep.missesInPrefill--
		}
		p.reqs[reqID] = r
	}
	p.mu.Unlock()
}

// measurePrefill folds a long request's time to first token into its endpoint's
// prefill speed for its size class: the seconds per uncached token. Only a request of
// more than one engine step counts (a shorter one's wait is mostly the step under way,
// or KV blocks), whose uncached tokens are known (exact), routed with no prefill
// backlog there: the backlog's tokens are the router's estimate, and requests of one
// prefix routed together each count it though the engine computes it once (the agent
// workload's endpoints looked up to 2.5 times as fast as they were). Decode time does
// not tell speeds apart for long prefills (trace-600 seed 1: 1.319 s at a 0.7-speed
// endpoint against 1.304 s at a full-speed one). p.mu must be held.
func (p *Policy) measurePrefill(r *tracked, t time.Time) {
	secs := t.Sub(r.routed).Seconds()
	if r.routed.IsZero() || !r.exact || r.ahead > 0 || secs <= 0 || p.fitsStep(r.prefill, p.cfg.BlockSize) {
		return
	}
	m := &r.ep.prefillSpeed[prefillClass(r.prefill)]
	if m.tokens == 0 {
		m.secs, m.tokens = secs, float64(r.prefill)
		return
	}
	m.secs += decodeAlpha * (secs - m.secs)
	m.tokens += decodeAlpha * (float64(r.prefill) - m.tokens)
}

// Finished releases the request's footprint and folds its decode time into the
// endpoint's speed estimate.
func (p *Policy) Finished(reqID string) {
	t := p.now()
	p.mu.Lock()
	delete(p.pending, reqID)
	if r, ok := p.reqs[reqID]; ok && !r.first.IsZero() {
		if d := t.Sub(r.first).Seconds(); d > 0 {
			if r.ep.decode == 0 {
				r.ep.decode = d
			} else {
				r.ep.decode += decodeAlpha * (d - r.ep.decode)
			}
		}
	}
	p.release(reqID)
	p.mu.Unlock()
}

// decodeAlpha weighs the newest decode time in an endpoint's moving average.
const decodeAlpha = 0.1

// release drops a tracked request; p.mu must be held.
func (p *Policy) release(id string) {
	r, ok := p.reqs[id]
	if !ok {
		return
	}
	delete(p.reqs, id)
	p.leave(&r)
}

// leave takes r's share off r.ep, undoing activate and join; p.mu must be held.
func (p *Policy) leave(r *tracked) {
	r.ep.inflight--
	r.ep.footprint -= r.unique
	if r.conv != 0 {
		if r.ep.convs[r.conv]--; r.ep.convs[r.conv] <= 0 {
			delete(r.ep.convs, r.conv)
		}
	}
	if r.first.IsZero() {
		r.ep.prefill -= r.prefill
		if a := r.ep.active[r.key]; a != nil {
			a.prefill -= r.prefill
		}
	}
	if r.miss {
		r.ep.missesInPrefill--
	}
	r.ep.deactivate(r.key)
	if r.parent != 0 {
		r.ep.deactivate(r.parent)
	}
	if p.cfg.SharedLoad {
		r.ep.record(p.now())
	}
}

// Forget drops every placement on an endpoint that left the fleet; only its prefixes
// move.
func (p *Policy) Forget(endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.prefixes {
		p.resite(e, slices.DeleteFunc(e.sites, func(pl site) bool { return pl.addr == endpoint }))
	}
	delete(p.eps, endpoint)
}
