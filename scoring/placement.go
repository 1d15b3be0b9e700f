package scoring

import (
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/index"
)

// Placement is the placement policy: it keeps a table of where each prefix lives and
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
//     hold HoldFraction of it (adopted, so router replicas converge on one another's
//     placements). A replica the index does not confirm within ConfirmPicks is dropped.
//  2. A prefix with no holder gets a home: the endpoint with the least home-placed
//     blocks per block of KV capacity (a capacity-weighted partition), preferring those
//     below Saturated with KV room.
//  3. When the index shows that the home lost the prefix (no request for it in flight
//     there) and no holder has it, the request misses wherever it goes: with RehomeLost
//     the home moves to the endpoint with KV room that would start the miss soonest
//     among those whose home share stays within RehomeSlack of the mean.
//  4. The holder of least wait takes it if its load is below ReplicaLoad (with
//     StickyHolders, the idle holder of highest rendezvous score, so that router
//     replicas agree; with PreferHeld, holders the index shows holding it first).
//  5. Otherwise a less-loaded endpoint whose live placements leave room for the prefix
//     within Fill of its capacity takes a replica (it evicts nothing live).
//  6. Otherwise the holder of least wait with KV room takes it; failing that, the
//     request queues at the least-loaded holder until it reaches SpillLoad, where the
//     prefix spills to the endpoint whose live placements it would overflow least.
//
// The chosen endpoint may then be overridden for this request alone (nothing placed),
// toward the candidate with KV room that would start it soonest: when the chosen one
// has no KV room for it (DivertOnFull), when its prefill backlog exceeds DeadlineTokens
// and the other would start it twice as soon, or when it is busy, holds too little of
// the prefix to hit, and an idle faster endpoint exists (DivertMisses). A replica or
// spill placement made by that pick is then dropped (UnplaceDiverted): no request fills it.
//
// KV room is each endpoint's footprint, tracked from Routed to Finished: every active
// prefix once plus each request's own blocks, against Headroom of its capacity.
// Placements not used for LiveWindow picks expire; a departed endpoint (Forget) loses
// its placements and only its prefixes move. Requests without a full block of token ids
// go to the least-loaded candidate.
//
// Placement implements Observer (footprint, prefill backlog and decode timing; a request
// routed elsewhere than picked places its prefix where it went). It is safe for
// concurrent use.
type Placement struct {
	cfg     PlacementConfig
	ix      PrefixIndex
	m       *placementMetrics
	now     func() time.Time
	scratch sync.Pool

	mu       sync.Mutex
	tick     uint64
	eps      map[string]*plEndpoint
	prefixes map[uint64]*plPrefix
	pending  map[string]plPending
	reqs     map[string]plReq
}

// maxKeptKeys bounds the keys kept per prefix to estimate its size (64k tokens at 16 per
// block): the table holds about 2 x LiveWindow prefixes, so at most ~64 MB of keys.
const maxKeptKeys = 4096

// maxPending bounds the picks remembered until Routed or Finished.
const maxPending = 1 << 16

type plEndpoint struct {
	hash     uint64 // of the address, for rendezvous hashing
	used     int    // blocks of live placements
	homeUsed int    // blocks of live home placements
	// footprint is the KV blocks the endpoint's in-flight requests (routed by this
	// router) occupy: each active prefix's blocks once, plus each request's own.
	footprint int
	active    map[uint64]*plActive
	// prefill is the uncached prompt tokens of in-flight requests without a first token.
	prefill int
	// decode is a moving average of the time from first token to finish, seconds; 0
	// until measured. It ranks endpoints by speed.
	decode float64
	// misses counts in-flight requests with at least HoldPrefillTokens uncached tokens and
	// no first token yet: while > 0, hits wait (HoldMaxMS).
	misses int
	// inflight counts the requests this router routed there and has not seen finish;
	// hist is a ring of its last histLen values with footprint and time, histN how many
	// were ever recorded: SharedLoad reads this router's share of a scrape from them.
	inflight int
	hist     [histLen]plSnap
	histN    int
}

// histLen bounds each endpoint's history of its own in-flight count: 64 changes (32
// requests) cover a scrape interval unless an endpoint takes over ~600 requests/s at 50 ms.
const histLen = 64

// plSnap is an endpoint's own in-flight count and footprint from time at on.
type plSnap struct {
	at        time.Time
	inflight  int
	footprint int
}

// record appends the endpoint's current own count and footprint at t to its history.
func (ep *plEndpoint) record(t time.Time) {
	ep.hist[ep.histN%histLen] = plSnap{at: t, inflight: ep.inflight, footprint: ep.footprint}
	ep.histN++
}

// ownAt returns the endpoint's own in-flight count and footprint at t, and false when
// the history no longer reaches back that far.
func (ep *plEndpoint) ownAt(t time.Time) (plSnap, bool) {
	for k := 0; k < min(ep.histN, histLen); k++ {
		s := ep.hist[(ep.histN-1-k)%histLen]
		if !s.at.After(t) {
			return s, true
		}
	}
	// Nothing recorded at or before t: nothing had been routed then, unless the ring
	// has overwritten it.
	return plSnap{}, ep.histN <= histLen
}

type plActive struct {
	requests int
	blocks   int // the prefix's blocks as counted into footprint
}

type plPrefix struct {
	blocks int      // estimated shared blocks
	keys   []uint64 // the last request's keys, to estimate blocks
	seen   uint64
	on     []plPlace
}

type plPlace struct {
	ep     *plEndpoint
	addr   string
	home   bool
	used   uint64
	placed uint64 // the pick that made it
}

type plPending struct {
	key     uint64
	addr    string
	blocks  int // the request's full blocks
	pblocks int // its prefix's estimated blocks at the pick
	prefill int // its uncached prompt tokens on addr, per the index at the pick
}

// plReq is an in-flight request's share of an endpoint's footprint.
type plReq struct {
	ep      *plEndpoint
	key     uint64
	unique  int
	prefill int       // uncached tokens, released at the first token
	first   time.Time // zero until FirstToken
	miss    bool      // counted in ep.misses
}

type plScratch struct {
	keys  []uint64
	names []string
	lead  []int
	loads []int
	pos   []int
	ok    []bool
	room  []bool
	// decode is each candidate's measured decode time, meanDecode their mean (1 when
	// none is measured).
	decode     []float64
	meanDecode float64
	// eps is each candidate's state, looked up once per pick under p.mu.
	eps []*plEndpoint
	// others is each candidate's requests from other routers (SharedLoad), otherKV
	// the KV blocks they hold.
	others  []int
	otherKV []float64
}

type placementMetrics struct {
	decisions *prometheus.CounterVec
}

// Decision kinds counted by kvrouter_scoring_placement_decisions_total.
const (
	plHolder      = "holder"
	plHome        = "home"
	plReplica     = "replica"
	plSpill       = "spill"
	plDivert      = "divert"
	plQueue       = "queue"
	plUntokenized = "untokenized"
	plHold        = "hold"
)

// NewPlacement returns a Placement policy over ix. now is the clock that times responses
// to rank endpoints by speed (nil: time.Now); reg may be nil.
func NewPlacement(cfg PlacementConfig, ix PrefixIndex, now func() time.Time, reg prometheus.Registerer) (*Placement, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ix == nil {
		return nil, errors.New("scoring: placement policy needs an index")
	}
	m := &placementMetrics{decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_scoring_placement_decisions_total",
		Help: "Placement policy decisions by kind: holder, home, replica, spill, divert, queue, untokenized, hold (the router is asked to wait and pick again).",
	}, []string{"kind"})}
	for _, k := range []string{plHolder, plHome, plReplica, plSpill, plDivert, plQueue, plUntokenized, plHold} {
		m.decisions.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.decisions)
	}
	if now == nil {
		now = time.Now
	}
	return &Placement{
		cfg: cfg, ix: ix, m: m, now: now,
		eps:      make(map[string]*plEndpoint),
		prefixes: make(map[uint64]*plPrefix),
		pending:  make(map[string]plPending),
		reqs:     make(map[string]plReq),
	}, nil
}

// Name returns "placement".
func (*Placement) Name() string { return "placement" }

func (p *Placement) load(e *Endpoint) int {
	l := e.InFlight
	if p.cfg.ScrapedLoad && e.Metrics.Valid {
		l = max(l, e.Metrics.Running+e.Metrics.Waiting)
	}
	return l
}

func (p *Placement) capacity(e *Endpoint) int {
	if e.Metrics.Valid && e.Metrics.NumGPUBlocks > 0 {
		return e.Metrics.NumGPUBlocks
	}
	return p.cfg.DefaultBlocks
}

func (p *Placement) blockSize(e *Endpoint) int {
	if e.Metrics.Valid && e.Metrics.BlockSize > 0 {
		return e.Metrics.BlockSize
	}
	return p.cfg.BlockSize
}

// Pick returns the candidate chosen by the rules on Placement; Fallbacks are the other
// holders by load, then the rest by load.
func (p *Placement) Pick(req *Request, cands []Endpoint) (Decision, error) {
	n := len(cands)
	if n == 0 {
		return Decision{}, ErrNoCandidates
	}
	sc, _ := p.scratch.Get().(*plScratch)
	if sc == nil {
		sc = &plScratch{}
	}
	defer p.scratch.Put(sc)
	sc.loads = slices.Grow(sc.loads[:0], n)[:n]
	for i := range cands {
		sc.loads[i] = p.load(&cands[i])
	}
	// Keys at the first candidate's block size: a fleet serving one model has one.
	bs := p.blockSize(&cands[0])
	if req.TokenIDs != nil {
		sc.keys = index.Keys(rootOf(req), req.TokenIDs, bs, sc.keys[:0])
	} else {
		sc.keys = sc.keys[:0]
	}
	if len(sc.keys) == 0 {
		best := argminLoad(sc.loads, nil)
		p.m.decisions.WithLabelValues(plUntokenized).Inc()
		return p.decision(cands, sc, best, nil), nil
	}
	sc.names = slices.Grow(sc.names[:0], n)[:n]
	for i := range cands {
		sc.names[i] = cands[i].Address
	}
	key := sc.keys[min(p.cfg.PrefixDepth, len(sc.keys))-1]
	// Only the prefix's blocks (plus one, to see it grow) matter: look those up.
	look := len(sc.keys)
	p.mu.Lock()
	if e := p.prefixes[key]; e != nil {
		look = min(look, max(e.blocks+1, p.cfg.PrefixDepth))
	}
	p.mu.Unlock()
	sc.lead = p.ix.LeadingBlocks(sc.keys[:look], sc.names, sc.lead)

	p.mu.Lock()
	p.tick++
	if p.tick%uint64(p.cfg.LiveWindow) == 0 || len(p.prefixes) > p.cfg.MaxPrefixes {
		p.sweep()
	}
	e := p.prefix(key, sc.keys)
	best, kind := p.choose(e, key, cands, sc)
	if d := p.divert(e, cands, sc, best, len(req.TokenIDs), bs); d >= 0 {
		if p.cfg.UnplaceDiverted && (kind == plReplica || kind == plSpill) {
			p.drop(e, cands[best].Address)
			sc.pos[best] = -1
		}
		best, kind = d, plDivert
	} else {
		p.touch(e, cands[best].Address, kind == plHome)
	}
	addr := cands[best].Address
	if len(p.pending) >= maxPending {
		for id := range p.pending { // any one: Go's map order is random
			delete(p.pending, id)
			break
		}
	}
	if req.ID != "" {
		p.pending[req.ID] = plPending{key: key, addr: addr, blocks: len(sc.keys), pblocks: e.blocks,
			prefill: max(0, len(req.TokenIDs)-sc.lead[best]*bs)}
	}
	var hold time.Duration
	if kind != plDivert {
		hold = p.hold(req, e, key, sc, best, bs)
	}
	p.mu.Unlock()
	if hold > 0 {
		kind = plHold
	}
	p.m.decisions.WithLabelValues(kind).Inc()
	d := p.decision(cands, sc, best, sc.pos)
	d.Hold = hold
	return d, nil
}

// hold returns how long the request should wait before it is picked again (0: route it
// now): see HoldMaxMS. p.mu must be held.
func (p *Placement) hold(req *Request, e *plPrefix, key uint64, sc *plScratch, best, bs int) time.Duration {
	if p.cfg.HoldMaxMS <= 0 || sc.eps[best].misses == 0 {
		return 0
	}
	step := time.Duration(p.cfg.HoldStepMS * float64(time.Millisecond))
	if req.Held+step > time.Duration(p.cfg.HoldMaxMS*float64(time.Millisecond)) {
		return 0
	}
	// The endpoint holds the prefix, or is computing it now (the index shows it later).
	have := sc.lead[best]
	if a := sc.eps[best].active[key]; a != nil {
		have = max(have, a.blocks)
	}
	if float64(have) < p.cfg.HoldFraction*float64(e.blocks) || len(req.TokenIDs)-have*bs >= p.cfg.HoldPrefillTokens {
		return 0
	}
	return step
}

// prefix returns key's entry, creating it, and refreshes its size estimate from keys;
// p.mu must be held.
func (p *Placement) prefix(key uint64, keys []uint64) *plPrefix {
	e := p.prefixes[key]
	if e == nil {
		e = &plPrefix{blocks: len(keys), keys: append([]uint64(nil), keys[:min(len(keys), maxKeptKeys)]...)}
		p.prefixes[key] = e
	} else {
		common := 0
		for common < len(keys) && common < len(e.keys) && keys[common] == e.keys[common] {
			common++
		}
		if common != e.blocks {
			for _, pl := range e.on {
				pl.ep.used += common - e.blocks
				if pl.home {
					pl.ep.homeUsed += common - e.blocks
				}
			}
			e.blocks = common
		}
		e.keys = append(e.keys[:0], keys[:min(len(keys), maxKeptKeys)]...)
	}
	e.seen = p.tick
	p.expire(e)
	return e
}

// expire drops e's placements unused for LiveWindow picks; p.mu must be held.
func (p *Placement) expire(e *plPrefix) {
	e.on = slices.DeleteFunc(e.on, func(pl plPlace) bool {
		if p.tick-pl.used <= uint64(p.cfg.LiveWindow) {
			return false
		}
		p.unplace(e, &pl)
		return true
	})
}

// drop removes e's placement on addr, if any; p.mu must be held.
func (p *Placement) drop(e *plPrefix, addr string) {
	e.on = slices.DeleteFunc(e.on, func(pl plPlace) bool {
		if pl.addr != addr {
			return false
		}
		p.unplace(e, &pl)
		return true
	})
}

func (p *Placement) unplace(e *plPrefix, pl *plPlace) {
	pl.ep.used -= e.blocks
	if pl.home {
		pl.ep.homeUsed -= e.blocks
	}
}

// sweep expires placements everywhere and drops prefixes with none left; if the table
// is still too large, it drops prefixes at random. p.mu must be held.
func (p *Placement) sweep() {
	for k, e := range p.prefixes {
		p.expire(e)
		if len(e.on) == 0 && p.tick-e.seen > uint64(p.cfg.LiveWindow) {
			delete(p.prefixes, k)
		}
	}
	for k, e := range p.prefixes {
		if len(p.prefixes) <= p.cfg.MaxPrefixes {
			break
		}
		for i := range e.on {
			p.unplace(e, &e.on[i])
		}
		delete(p.prefixes, k)
	}
}

func (p *Placement) endpoint(addr string) *plEndpoint {
	ep := p.eps[addr]
	if ep == nil {
		ep = &plEndpoint{hash: xxhash.Sum64String(addr)}
		p.eps[addr] = ep
	}
	return ep
}

// place adds (or finds) e's placement on addr and returns its position; p.mu must be held.
func (p *Placement) place(e *plPrefix, addr string, home bool) int {
	for i := range e.on {
		if e.on[i].addr == addr {
			if home && !e.on[i].home {
				e.on[i].home = true
				e.on[i].ep.homeUsed += e.blocks
			}
			return i
		}
	}
	ep := p.endpoint(addr)
	ep.used += e.blocks
	if home {
		ep.homeUsed += e.blocks
	}
	e.on = append(e.on, plPlace{ep: ep, addr: addr, home: home, used: p.tick, placed: p.tick})
	return len(e.on) - 1
}

func (p *Placement) touch(e *plPrefix, addr string, home bool) {
	e.on[p.place(e, addr, home)].used = p.tick
}

// choose applies the rules documented on Placement and returns the chosen candidate and
// the kind of decision; sc.pos[i] is set to candidate i's placement position or -1.
func (p *Placement) choose(e *plPrefix, key uint64, cands []Endpoint, sc *plScratch) (int, string) {
	n := len(cands)
	sc.pos = slices.Grow(sc.pos[:0], n)[:n]
	sc.eps = slices.Grow(sc.eps[:0], n)[:n]
	for i := range cands {
		sc.eps[i] = p.endpoint(cands[i].Address)
	}
	p.shared(cands, sc)
	hold := int(math.Ceil(p.cfg.HoldFraction * float64(e.blocks)))
	hasHome := false
	for _, pl := range e.on {
		hasHome = hasHome || pl.home
	}
	// A replica the index still does not confirm ConfirmPicks picks after it was made has
	// been evicted: drop it. Homes stay, so the partition stays put.
	e.on = slices.DeleteFunc(e.on, func(pl plPlace) bool {
		if pl.home || p.tick-pl.placed <= uint64(p.cfg.ConfirmPicks) {
			return false
		}
		for i := range cands {
			if cands[i].Address == pl.addr && sc.lead[i] < max(hold, 1) {
				p.unplace(e, &pl)
				return true
			}
		}
		return false
	})
	placed := false
	for i := range cands {
		sc.pos[i] = -1
		for j := range e.on {
			if e.on[j].addr == cands[i].Address {
				sc.pos[i] = j
				placed = true
				break
			}
		}
	}
	// Adopt what the index shows: every holder (AdoptAll), or, for a prefix this router
	// has no placement for, the one holding most of it (another replica's home, or the
	// cache that survived a restart). Copies left by diverted requests are not adopted.
	adopt := -1
	for i := range cands {
		if sc.pos[i] >= 0 || sc.lead[i] < max(hold, 1) {
			continue
		}
		if p.cfg.AdoptAll {
			sc.pos[i] = p.place(e, cands[i].Address, false)
		} else if !placed && (adopt < 0 || sc.lead[i] > sc.lead[adopt]) {
			adopt = i
		}
	}
	if adopt >= 0 {
		sc.pos[adopt] = p.place(e, cands[adopt].Address, false)
	}
	// A prefix whose home expired or left keeps its most-cached holder as home.
	if !hasHome {
		home := -1
		for i := range cands {
			if sc.pos[i] >= 0 && (home < 0 || sc.lead[i] > sc.lead[home]) {
				home = i
			}
		}
		if home >= 0 {
			p.place(e, cands[home].Address, true)
		}
	}
	blocks := len(sc.keys)
	sc.decode = slices.Grow(sc.decode[:0], n)[:n]
	sc.meanDecode = 0
	var measured int
	for i := range cands {
		sc.decode[i] = sc.eps[i].decode
		if sc.decode[i] > 0 {
			sc.meanDecode += sc.decode[i]
			measured++
		}
	}
	if measured > 0 {
		sc.meanDecode /= float64(measured)
	} else {
		sc.meanDecode = 1
	}
	sc.ok = slices.Grow(sc.ok[:0], n)[:n]
	sc.room = slices.Grow(sc.room[:0], n)[:n]
	for i := range cands {
		sc.room[i] = p.room(sc.eps[i], key, &cands[i], blocks, sc.otherKV[i])
		sc.ok[i] = sc.loads[i] < p.cfg.Saturated && sc.room[i]
	}
	if p.cfg.RehomeLost {
		p.rehome(e, key, cands, sc, hold)
	}
	// The least-loaded holder (h), and the least-loaded holder that can take it now (g).
	h, g := -1, -1
	better := func(i, j int) bool {
		if j < 0 {
			return true
		}
		if p.cfg.PreferHeld {
			// A placement the index shows lost loses to one that holds the prefix.
			if hi, hj := sc.lead[i] >= max(hold, 1), sc.lead[j] >= max(hold, 1); hi != hj {
				return hi
			}
		}
		if p.cfg.StickyHolders && sc.loads[i] < p.cfg.ReplicaLoad && sc.loads[j] < p.cfg.ReplicaLoad {
			// Both idle: the same holder for every router replica, so duplicate copies
			// made by replicas' concurrent placements go unused and are evicted.
			return p.score(key, sc.eps[i], &cands[i]) > p.score(key, sc.eps[j], &cands[j])
		}
		wi, wj := p.wait(sc, i), p.wait(sc, j)
		return wi < wj ||
			(wi == wj && (sc.lead[i] > sc.lead[j] ||
				(sc.lead[i] == sc.lead[j] && e.on[sc.pos[i]].home && !e.on[sc.pos[j]].home)))
	}
	for i := range cands {
		if sc.pos[i] < 0 {
			continue
		}
		if better(i, h) {
			h = i
		}
		if sc.ok[i] && better(i, g) {
			g = i
		}
	}
	if h < 0 {
		return p.newHome(e, key, cands, sc), plHome
	}
	if g >= 0 && sc.loads[g] < p.cfg.ReplicaLoad {
		return g, plHolder
	}
	// The holders are busy: a replica where it evicts nothing live, on an endpoint less
	// loaded than every holder.
	r := -1
	for i := range cands {
		if sc.pos[i] >= 0 || !sc.ok[i] || sc.loads[i] >= sc.loads[h] {
			continue
		}
		c := p.capacity(&cands[i])
		if float64(sc.eps[i].used+e.blocks) > p.cfg.Fill*float64(c) {
			continue
		}
		if r < 0 || p.wait(sc, i) < p.wait(sc, r) ||
			(p.wait(sc, i) == p.wait(sc, r) && p.fillOf(sc.eps[i], &cands[i]) < p.fillOf(sc.eps[r], &cands[r])) {
			r = i
		}
	}
	if r >= 0 {
		sc.pos[r] = p.place(e, cands[r].Address, false)
		return r, plReplica
	}
	if g >= 0 {
		return g, plHolder
	}
	full := p.cfg.SpillOnFull && !sc.room[h]
	if sc.loads[h] < p.cfg.SpillLoad && !full {
		return h, plQueue
	}
	// A real queue: spill where the prefix overflows live placements least.
	s, sOver := -1, 0.0
	for i := range cands {
		if sc.pos[i] >= 0 || !sc.ok[i] {
			continue
		}
		c := float64(p.capacity(&cands[i]))
		over := max(0, float64(sc.eps[i].used+e.blocks)-p.cfg.Fill*c) / c
		if s < 0 || over < sOver || (over == sOver && sc.loads[i] < sc.loads[s]) {
			s, sOver = i, over
		}
	}
	if s < 0 {
		return h, plQueue
	}
	sc.pos[s] = p.place(e, cands[s].Address, false)
	return s, plSpill
}

// shared sets sc.others and sc.otherKV, and adds the others to sc.loads, when
// SharedLoad is on: another router's requests on an endpoint are its scraped running
// plus waiting requests beyond this router's own in flight at the scrape (Metrics.At),
// and their KV blocks the scraped usage beyond this router's footprint then. Without
// a scrape time, or a history reaching back to it, there are none. p.mu must be held.
func (p *Placement) shared(cands []Endpoint, sc *plScratch) {
	n := len(cands)
	sc.others = slices.Grow(sc.others[:0], n)[:n]
	sc.otherKV = slices.Grow(sc.otherKV[:0], n)[:n]
	for i := range cands {
		sc.others[i], sc.otherKV[i] = 0, 0
		m := &cands[i].Metrics
		if !p.cfg.SharedLoad || p.cfg.ScrapedLoad || !m.Valid || m.At.IsZero() {
			continue
		}
		own, ok := sc.eps[i].ownAt(m.At)
		if !ok {
			continue
		}
		if o := m.Running + m.Waiting - own.inflight; o > 0 {
			sc.others[i] = o
			sc.otherKV[i] = max(0, m.KVCacheUsage*float64(p.capacity(&cands[i]))-float64(own.footprint))
			sc.loads[i] += o
		}
	}
}

// rehome moves a prefix's home when the index shows the home lost it (it holds less than
// hold blocks and no request for it is in flight there) and no other candidate holds it:
// the request misses wherever it goes, so its prefix is recomputed on the candidate with
// KV room of least home share (homeShare), and that one becomes the home. p.mu must be
// held.
func (p *Placement) rehome(e *plPrefix, key uint64, cands []Endpoint, sc *plScratch, hold int) {
	old := -1
	for i := range cands {
		if sc.pos[i] < 0 {
			continue
		}
		if sc.lead[i] >= max(hold, 1) || sc.eps[i].active[key] != nil {
			return // someone holds it, or is computing it
		}
		if e.on[sc.pos[i]].home {
			old = i
		}
	}
	if old < 0 {
		return
	}
	// Requests other routers sent there (scraped, as stale as the scrape) may be
	// computing the prefix now: leave the home alone.
	if m := cands[old].Metrics; sc.others[old] > 0 || (m.Valid && m.Running+m.Waiting > sc.loads[old]) {
		return
	}
	best, bestShare := old, p.homeShare(sc, cands, old, 0)
	if p.cfg.RehomeSlack > 0 {
		// Any endpoint whose home share stays within RehomeSlack of the mean, fastest
		// start first.
		var mean float64
		for i := range cands {
			mean += p.homeShare(sc, cands, i, 0)
		}
		mean /= float64(len(cands))
		limit := max(bestShare, p.cfg.RehomeSlack*mean)
		est := func(i int) float64 {
			d := sc.decode[i]
			if d == 0 {
				d = sc.meanDecode
			}
			return float64(sc.eps[i].prefill+len(sc.keys)*p.cfg.BlockSize+p.cfg.RehomeLoadTokens*sc.loads[i]) * d
		}
		bestEst := est(old)
		if !sc.ok[old] {
			bestEst = math.Inf(1)
		}
		for i := range cands {
			if i == old || !sc.ok[i] {
				continue
			}
			if p.homeShare(sc, cands, i, e.blocks) > limit {
				continue
			}
			if x := est(i); x < bestEst {
				best, bestEst = i, x
			}
		}
	} else {
		for i := range cands {
			if i == old || !sc.ok[i] {
				continue
			}
			share := p.homeShare(sc, cands, i, e.blocks)
			if share < bestShare || (share == bestShare && p.wait(sc, i) < p.wait(sc, best)) {
				best, bestShare = i, share
			}
		}
	}
	if best == old {
		return
	}
	j := sc.pos[old]
	p.unplace(e, &e.on[j])
	e.on = slices.Delete(e.on, j, j+1)
	for i := range cands {
		if sc.pos[i] > j {
			sc.pos[i]--
		}
	}
	sc.pos[old] = -1
	sc.pos[best] = p.place(e, cands[best].Address, true)
}

// homeShare is candidate i's home blocks, plus extra, per block of its KV capacity.
func (p *Placement) homeShare(sc *plScratch, cands []Endpoint, i, extra int) float64 {
	return float64(sc.eps[i].homeUsed+extra) / float64(p.capacity(&cands[i]))
}

func (p *Placement) fillOf(ep *plEndpoint, c *Endpoint) float64 {
	return float64(ep.used) / float64(p.capacity(c))
}

// newHome places a prefix no candidate holds on the candidate with the least home
// blocks per block of capacity, among those below SpillLoad if any.
func (p *Placement) newHome(e *plPrefix, key uint64, cands []Endpoint, sc *plScratch) int {
	if p.cfg.Balance > 0 {
		if i := p.rendezvous(e, key, cands, sc); i >= 0 {
			sc.pos[i] = p.place(e, cands[i].Address, true)
			return i
		}
	}
	best, bestShare, bestOK := -1, 0.0, false
	for i := range cands {
		ok := sc.ok[i]
		share := p.homeShare(sc, cands, i, e.blocks)
		better := best < 0 || (ok && !bestOK) ||
			(ok == bestOK && (share < bestShare || (share == bestShare && p.wait(sc, i) < p.wait(sc, best))))
		if better {
			best, bestShare, bestOK = i, share, ok
		}
	}
	sc.pos[best] = p.place(e, cands[best].Address, true)
	return best
}

// rendezvous returns the candidate of highest capacity-weighted rendezvous score for key
// among those with KV room whose home blocks stay within Balance of their capacity
// share (bounded-load rendezvous hashing: router replicas with the same view choose the
// same home without talking), or -1 when none qualifies. p.mu must be held.
func (p *Placement) rendezvous(e *plPrefix, key uint64, cands []Endpoint, sc *plScratch) int {
	var used, capacity float64
	for i := range cands {
		used += float64(sc.eps[i].homeUsed)
		capacity += float64(p.capacity(&cands[i]))
	}
	used += float64(e.blocks)
	best, bestScore := -1, 0.0
	for i := range cands {
		c := float64(p.capacity(&cands[i]))
		bound := max(float64(e.blocks), p.cfg.Balance*used*c/capacity)
		if !sc.ok[i] || float64(sc.eps[i].homeUsed+e.blocks) > bound {
			continue
		}
		if score := p.score(key, sc.eps[i], &cands[i]); best < 0 || score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// score is candidate c's capacity-weighted rendezvous score for key: capacity / -ln(u),
// u uniform in (0, 1) from the key and the endpoint. p.mu must be held.
func (p *Placement) score(key uint64, ep *plEndpoint, c *Endpoint) float64 {
	u := (float64(mix64(key^ep.hash)>>11) + 0.5) / (1 << 53)
	return float64(p.capacity(c)) / -math.Log(u)
}

// mix64 is a 64-bit finaliser (splitmix64's).
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
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

// maxFallbacks bounds Decision.Fallbacks: enough for the proxy's retries, and a pick
// over many endpoints does not sort them all.
const maxFallbacks = 4

// decision builds the answer: best first, then up to maxFallbacks others, holders (pos
// >= 0) before the rest, each by load.
func (p *Placement) decision(cands []Endpoint, sc *plScratch, best int, pos []int) Decision {
	d := Decision{Endpoint: cands[best].Address}
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
	var top [maxFallbacks]int
	k := 0
	for i := range cands {
		if i == best {
			continue
		}
		// Insert i into top[:k], kept sorted by rank (stable: earlier candidates first).
		j := min(k, maxFallbacks-1)
		if k == maxFallbacks && rank(i) >= rank(top[j]) {
			continue
		}
		for j > 0 && rank(i) < rank(top[j-1]) {
			top[j] = top[j-1]
			j--
		}
		top[j] = i
		k = min(k+1, maxFallbacks)
	}
	d.Fallbacks = make([]string, k)
	for j := range k {
		d.Fallbacks[j] = cands[top[j]].Address
	}
	return d
}

// Routed counts the request into endpoint's KV footprint and, when the router sent it
// somewhere other than Pick chose (a fallback), places its prefix there.
func (p *Placement) Routed(req *Request, endpoint string) {
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
	if ep.active == nil {
		ep.active = make(map[uint64]*plActive)
	}
	a := ep.active[pd.key]
	if a == nil {
		a = &plActive{blocks: pd.pblocks}
		ep.active[pd.key] = a
		ep.footprint += a.blocks
	}
	a.requests++
	r := plReq{ep: ep, key: pd.key, unique: max(0, pd.blocks-a.blocks) + p.cfg.OutputBlocks}
	if pd.addr == endpoint {
		r.prefill = pd.prefill
	} else {
		r.prefill = len(req.TokenIDs)
	}
	ep.footprint += r.unique
	ep.inflight++
	if p.cfg.SharedLoad {
		ep.record(p.now())
	}
	ep.prefill += r.prefill
	if r.prefill >= p.cfg.HoldPrefillTokens {
		r.miss = true
		ep.misses++
	}
	p.reqs[req.ID] = r
}

// FirstToken starts timing the request's decode.
func (p *Placement) FirstToken(reqID string) {
	t := p.now()
	p.mu.Lock()
	if r, ok := p.reqs[reqID]; ok && r.first.IsZero() {
		r.first = t
		r.ep.prefill -= r.prefill
		if r.miss {
			r.miss = false
			r.ep.misses--
		}
		p.reqs[reqID] = r
	}
	p.mu.Unlock()
}

// Finished releases the request's footprint and folds its decode time into the
// endpoint's speed estimate.
func (p *Placement) Finished(reqID string) {
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

// divert returns the candidate a request should go to instead of best when best's
// estimated time to first token, its prefill backlog plus the request's uncached tokens
// scaled by its measured speed, exceeds DeadlineTokens and another candidate with KV room
// would start it at least twice as soon; -1 otherwise. A diverted request places nothing.
// p.mu must be held.
func (p *Placement) divert(e *plPrefix, cands []Endpoint, sc *plScratch, best, tokens, bs int) int {
	if p.cfg.DeadlineTokens <= 0 {
		return -1
	}
	est := func(i int) float64 {
		d := sc.decode[i]
		if d == 0 {
			d = sc.meanDecode
		}
		backlog := sc.eps[i].prefill + max(0, tokens-sc.lead[i]*bs)
		return float64(backlog) * d / sc.meanDecode
	}
	eb := est(best)
	full := p.cfg.DivertOnFull && !sc.room[best]
	// A busy endpoint that lost most of the prefix would recompute it behind others.
	miss := p.cfg.DivertMisses && sc.loads[best] > 0 &&
		float64(sc.lead[best]) < p.cfg.HoldFraction*float64(e.blocks)
	if eb <= float64(p.cfg.DeadlineTokens) && !full && !miss {
		return -1
	}
	alt, ea := -1, 0.0
	for i := range cands {
		if i == best || !sc.ok[i] {
			continue
		}
		if miss && !full && (sc.loads[i] > 0 || !(sc.decode[i] > 0 && sc.decode[i] < p.cfg.MissSpeedup*sc.decode[best])) {
			continue
		}
		if x := est(i); alt < 0 || x < ea {
			alt, ea = i, x
		}
	}
	if alt < 0 || (!full && !miss && 2*ea > eb) {
		return -1
	}
	return alt
}

// wait ranks candidate i by the time its queue takes to drain past a new request: its
// load plus one, times its measured decode time (the mean of the measured ones when it
// has none yet). p.mu must be held.
func (p *Placement) wait(sc *plScratch, i int) float64 {
	d := sc.decode[i]
	if d == 0 {
		d = sc.meanDecode
	}
	return float64(sc.loads[i]+1) * d
}

// release drops a tracked request; p.mu must be held.
func (p *Placement) release(id string) {
	r, ok := p.reqs[id]
	if !ok {
		return
	}
	delete(p.reqs, id)
	r.ep.inflight--
	r.ep.footprint -= r.unique
	if r.first.IsZero() {
		r.ep.prefill -= r.prefill
	}
	if r.miss {
		r.ep.misses--
	}
	if a := r.ep.active[r.key]; a != nil {
		if a.requests--; a.requests <= 0 {
			r.ep.footprint -= a.blocks
			delete(r.ep.active, r.key)
		}
	}
	if p.cfg.SharedLoad {
		r.ep.record(p.now())
	}
}

// room reports whether candidate i can start the request without waiting for KV blocks:
// its footprint, plus others (blocks other routers' requests hold), plus the request's
// blocks not already active there, stays within Headroom of its capacity. p.mu must be
// held.
func (p *Placement) room(ep *plEndpoint, key uint64, c *Endpoint, blocks int, others float64) bool {
	capacity := float64(p.capacity(c))
	used := float64(ep.footprint) + others
	if p.cfg.ScrapedLoad && c.Metrics.Valid {
		used = max(used, c.Metrics.KVCacheUsage*capacity)
	}
	need := blocks + p.cfg.OutputBlocks
	if a := ep.active[key]; a != nil {
		need -= min(a.blocks, blocks)
	}
	return used+float64(need) <= p.cfg.Headroom*capacity
}

// Forget drops every placement on an endpoint that left the fleet; only its prefixes
// move.
func (p *Placement) Forget(endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.prefixes {
		e.on = slices.DeleteFunc(e.on, func(pl plPlace) bool { return pl.addr == endpoint })
	}
	delete(p.eps, endpoint)
}
