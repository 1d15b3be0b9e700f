package placement

import (
	"cmp"
	"math"
	"slices"

	"github.com/kvrouter/kvrouter/scoring"
)

type scratch struct {
	// blockSize is the block size the request's keys were cut at.
	blockSize int
	// out is the output blocks the request counts for (outputBlocks).
	out   int
	keys  []uint64
	names []string
	lead  []int
	// own is, per candidate, the prefill backlog of the request's own long prefix in
	// flight there (inFlight): a move does not skip it, it waits for it or redoes it.
	own   []int
	loads []int
	pos   []int
	ok    []bool
	room  []bool
	// decode is each candidate's measured decode time, meanDecode their mean (1 when
	// none is measured).
	decode     []float64
	meanDecode float64
	// eps is each candidate's state, looked up once per pick under p.mu.
	eps []*endpointState
	// others is each candidate's requests from other routers (SharedLoad), otherKV
	// the KV blocks they hold.
	others  []int
	otherKV []float64
	// otherPrefill and otherMisses are peers' prefill backlog (for rehoming and
	// copy_cost's miss cost; not for the divert deadline) and misses in prefill on
	// each candidate (SetPeers).
	otherPrefill []int
	otherMisses  []int
	// peerHistories is evicts' scratch: peers' histories on one endpoint.
	peerHistories []History
	// epIndex maps each candidate's state to its index and frees lists the blocks its
	// decoding requests free, and when (soonestRoom).
	epIndex map[*endpointState]int
	frees   [][]freeing
	// prefixes lists the prefixes active on candidates that soonestRoom counted
	// decoding requests of, with the candidate's index.
	prefixes []activeOn
	// rank is this router's among its replicas, replicas their number (PeerView.Rank;
	// 0 without peers); cold: no candidate's decode time is measured yet (a fleet
	// starting); turnLoads keeps loads while holderTurn counts one router's picks.
	rank, replicas int
	cold           bool
	// even: no measured decode time is under MissSpeedup times another's (speeds even;
	// true while none is measured); measured: every candidate's decode time is.
	even, measured bool
	turnLoads      []int
	// nowhere caches heldNowhere for this pick: 0 not known yet, 1 held nowhere, 2 held
	// or being computed somewhere.
	nowhere int8
	// looked is how many of keys the index was asked about: a candidate's lead equal
	// to it may hold more of the request (its uncached tokens there are not known).
	looked int
	// conv is the conversation the request continues (followed; 0: none), convBlocks
	// the blocks it shares with the conversation's requests.
	conv       uint64
	convBlocks int
	// history is the conversation's last request, in prefill, that the request would
	// join (followed; joinHistory).
	history tracked
}

// shared is the request's blocks that its conversation's requests in flight on ep
// hold there: in ep's footprint already (in prefill, not yet in the index; decoding,
// holding them). Counted again, a document's next turn found no KV room at the
// endpoint running its 35k-token history and was diverted to recompute it (the
// 200-request trace at 4x: TTFT 4.6 s, kv's hit 0.5 s). p.mu must be held.
func (sc *scratch) shared(ep *endpointState) int {
	if sc.conv != 0 && ep.convs[sc.conv] > 0 {
		return sc.convBlocks
	}
	return 0
}

type activeOn struct {
	a *activePrefix
	i int
}

// freeing is one decoding request's blocks, freed at seconds from now.
type freeing struct {
	at     float64
	blocks int
}

func (p *Policy) load(e *scoring.Endpoint) int {
	l := e.InFlight
	if p.cfg.ScrapedLoad && e.Metrics.Valid {
		l = max(l, e.Metrics.Running+e.Metrics.Waiting)
	}
	return l
}

func (p *Policy) capacity(e *scoring.Endpoint) int {
	if e.Metrics.Valid && e.Metrics.NumGPUBlocks > 0 {
		return e.Metrics.NumGPUBlocks
	}
	return p.cfg.DefaultBlocks
}

func (p *Policy) blockSize(e *scoring.Endpoint) int {
	if e.Metrics.Valid && e.Metrics.BlockSize > 0 {
		return e.Metrics.BlockSize
	}
	return p.cfg.BlockSize
}

// outputBlocks returns the KV blocks of bs tokens the request counts for while it
// decodes: OutputBlocks when set, else half its expected output. The expected output is
// the fleet's measured mean per finished request (the candidates'
// vllm:request_generation_tokens sum over count), at most the request's max_tokens; with
// none measured yet, its max_tokens (vLLM's default, 16, on completions without one; 0
// when unknown). vLLM allocates a request's output
// blocks one at a time as it decodes, so over its decode it holds half of them on
// average: counted whole, the footprint of a holder running three 500-token outputs
// showed no room while its engine had blocks free, and hits were sent to recompute their
// prefixes elsewhere (docs/results-workloads.md, "Probed axes"). Routed counts them into
// the endpoint's turnover, FirstToken into its footprint (in prefill or queued, a request
// holds no output blocks).
func (p *Policy) outputBlocks(req *scoring.Request, cands []scoring.Endpoint, bs int) int {
	if p.cfg.OutputBlocks > 0 {
		return p.cfg.OutputBlocks
	}
	var n, sum float64
	for i := range cands {
		if m := &cands[i].Metrics; m.Valid {
			n += m.FinishedRequests
			sum += m.OutputTokens
		}
	}
	tokens := float64(max(req.MaxTokens, 0))
	if mean := sum / n; n > 0 && mean >= 0 && (req.MaxTokens <= 0 || mean < tokens) {
		tokens = mean
	}
	// Bounded by the engines' longest context in practice; capped here so that a bogus
	// figure cannot overflow the footprint's ints.
	tokens = min(tokens, float64(maxOutputTokens))
	return int(math.Ceil(tokens / 2 / float64(bs)))
}

// maxOutputTokens bounds a request's expected output tokens (outputBlocks): 2^24, past
// any engine's max_model_len.
const maxOutputTokens = 1 << 24

// choose applies the rules documented on Policy and returns the chosen candidate and
// the kind of decision; sc.pos[i] is set to candidate i's placement position or -1.
func (p *Policy) choose(e *prefixEntry, key uint64, cands []scoring.Endpoint, sc *scratch) (int, string) {
	n := len(cands)
	sc.pos = slices.Grow(sc.pos[:0], n)[:n]
	sc.eps = slices.Grow(sc.eps[:0], n)[:n]
	for i := range cands {
		sc.eps[i] = p.endpoint(cands[i].Address)
	}
	p.inFlight(e, key, sc)
	p.shared(cands, sc, key)
	sc.rank, sc.replicas, sc.nowhere = 0, 0, 0
	if p.peers != nil {
		sc.rank, sc.replicas = p.peers.Rank()
	}
	heldBlocks := e.held(p.cfg.HolderShare)
	hasHome := false
	for _, pl := range e.sites {
		hasHome = hasHome || pl.home
	}
	// A replica the index still does not confirm ConfirmPicks picks after it was made has
	// been evicted: drop it. Homes stay, so the partition stays put.
	p.resite(e, slices.DeleteFunc(e.sites, func(pl site) bool {
		if pl.home || p.tick-pl.placedAt <= uint64(p.cfg.ConfirmPicks) {
			return false
		}
		for i := range cands {
			if cands[i].Address == pl.addr && sc.lead[i] < max(heldBlocks, 1) {
				p.unplace(e, &pl)
				return true
			}
		}
		return false
	}))
	placed := false
	for i := range cands {
		sc.pos[i] = -1
		for j := range e.sites {
			if e.sites[j].addr == cands[i].Address {
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
		if sc.pos[i] >= 0 {
			continue
		}
		if sc.lead[i] < max(heldBlocks, 1) && (p.peers == nil || !p.peers.PeerActive(cands[i].Address, key)) {
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
	sc.cold = measured == 0
	lo, hi := math.Inf(1), 0.0
	for _, d := range sc.decode {
		if d > 0 {
			lo, hi = min(lo, d), max(hi, d)
		}
	}
	sc.even = measured == 0 || lo >= p.cfg.MissSpeedup*hi
	sc.measured = measured == n
	sc.ok = slices.Grow(sc.ok[:0], n)[:n]
	sc.room = slices.Grow(sc.room[:0], n)[:n]
	for i := range cands {
		sc.room[i] = p.room(sc.eps[i], key, &cands[i], blocks, sc.out, sc.shared(sc.eps[i]), sc.otherKV[i])
		sc.ok[i] = sc.loads[i] < p.cfg.Saturated && sc.room[i]
	}
	if p.cfg.RehomeLost {
		p.rehome(e, key, cands, sc, heldBlocks)
	}
	// The least-loaded holder (h), and the least-loaded holder that can take it now (g).
	h, g := -1, -1
	better := func(i, j int) bool {
		if j < 0 {
			return true
		}
		if p.cfg.PreferHeld {
			// A placement the index shows lost loses to one that holds the prefix.
			if hi, hj := sc.lead[i] >= max(heldBlocks, 1), sc.lead[j] >= max(heldBlocks, 1); hi != hj {
				return hi
			}
		}
		if p.cfg.StickyHolders && sc.loads[i] < p.cfg.ReplicaLoad && sc.loads[j] < p.cfg.ReplicaLoad {
			// Both idle: ranked by rendezvous score, the same for every router replica,
			// so duplicate copies made by replicas' concurrent placements go unused and
			// are evicted (replicas picking at one instant then take their turns by
			// rank: holderTurn).
			return p.score(key, sc.eps[i], &cands[i]) > p.score(key, sc.eps[j], &cands[j])
		}
		wi, wj := p.wait(sc, i), p.wait(sc, j)
		if tied, iWins := p.replicaTie(sc, i, j, wi, wj); tied {
			if e.base > 0 && sc.lead[i] != sc.lead[j] {
				// A conversation's turn: one in flight at a time, no simultaneous
				// picks to spread; the holder with more of its history, which
				// every replica sees in the index, starts it sooner (replicaTie).
				return sc.lead[i] > sc.lead[j]
			}
			return iWins
		}
		return wi < wj ||
			(wi == wj && (sc.lead[i] > sc.lead[j] ||
				(sc.lead[i] == sc.lead[j] && e.sites[sc.pos[i]].home && !e.sites[sc.pos[j]].home)))
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
		return p.newHome(e, key, cands, sc), kindHome
	}
	if g >= 0 && sc.loads[g] < p.cfg.ReplicaLoad {
		if f := p.fasterCopy(e, key, cands, sc, g, heldBlocks); f >= 0 {
			sc.pos[f] = p.place(e, cands[f].Address, false)
			return f, kindReplica
		}
		return p.holderTurn(cands, sc, g, better), kindHolder
	}
	// The holders are busy: a replica where it evicts nothing live, on an endpoint less
	// loaded than every holder.
	even := p.cfg.CopyCost && p.evenShare(e, sc)
	share := p.cfg.CopyCost && !even && p.underShare(key, sc)
	r, refused := -1, false
	for i := range cands {
		if sc.pos[i] >= 0 || !sc.ok[i] || sc.loads[i] >= sc.loads[h] || !p.moveOK(sc, i, h) {
			continue
		}
		c := p.capacity(&cands[i])
		if float64(sc.eps[i].placedBlocks+e.weight()) > p.cfg.Fill*float64(c) && !p.copyWorth(e, key, cands, sc, i, h, heldBlocks) {
			continue
		}
		if !p.moveWorth(e, key, sc, i, h) {
			continue
		}
		if p.cfg.CopyCost && !e.grows() && !share && !p.missCostsLess(sc, i, h, even) {
			refused = true
			continue
		}
		if r < 0 || p.wait(sc, i) < p.wait(sc, r) ||
			(p.wait(sc, i) == p.wait(sc, r) && (p.fillOf(sc.eps[i], &cands[i]) < p.fillOf(sc.eps[r], &cands[r]) ||
				p.fillOf(sc.eps[i], &cands[i]) == p.fillOf(sc.eps[r], &cands[r]) && p.crowded(sc, h) && p.coldTie(sc, i, r))) {
			r = i
		}
	}
	if r >= 0 {
		sc.pos[r] = p.place(e, cands[r].Address, false)
		return r, kindReplica
	}
	if g >= 0 {
		if refused {
			return p.soonestHolder(cands, sc, g), kindHolder
		}
		return g, kindHolder
	}
	full := p.cfg.SpillOnFull && !sc.room[h]
	if sc.loads[h] < p.cfg.SpillLoad && !full {
		return h, kindQueue
	}
	// A real queue: spill where the prefix overflows live placements least.
	s, sOver := -1, 0.0
	for i := range cands {
		if sc.pos[i] >= 0 || !sc.ok[i] || !(p.moveOK(sc, i, h) || p.missBeforeWait(sc, i, h)) {
			continue
		}
		c := float64(p.capacity(&cands[i]))
		over := max(0, float64(sc.eps[i].placedBlocks+e.weight())-p.cfg.Fill*c) / c
		if s < 0 || over < sOver || (over == sOver && sc.loads[i] < sc.loads[s]) {
			s, sOver = i, over
		}
	}
	if s < 0 {
		return h, kindQueue
	}
	sc.pos[s] = p.place(e, cands[s].Address, false)
	return s, kindSpill
}

// inFlight counts a long prefix (more than one engine step) as held where a request of
// it is in flight: that request holds its blocks or is computing them, and a request
// sent there starts after its prefill and hits them (vLLM schedules running requests
// first, so a long prefill takes each step's budget until it ends). The index shows
// only the blocks computed so far: counted as a miss of the rest, each agent joining
// its context's first prefill added that rest to the endpoint's prefill backlog again,
// and the next one, measured against the inflated backlog, was sent to recompute the
// 100k-token context elsewhere (agent workload on 4 servers). A prefix of one step
// clears in the next step, and the hold rules time such hits (waitBehindMiss). p.mu
// must be held.
func (p *Policy) inFlight(e *prefixEntry, key uint64, sc *scratch) {
	sc.own = slices.Grow(sc.own[:0], len(sc.eps))[:len(sc.eps)]
	clear(sc.own)
	if !p.cfg.LongContexts {
		return
	}
	for i, ep := range sc.eps {
		a := ep.active[key]
		if a == nil {
			continue
		}
		b := min(a.blocks, e.blocks, sc.looked)
		if b > sc.lead[i] && !p.fitsStep(b*sc.blockSize, sc.blockSize) {
			sc.lead[i] = b
			sc.own[i] = a.prefill
		}
	}
}

// shared sets sc.others and sc.otherKV, and adds the others to sc.loads, when
// SharedLoad is on: another router's requests on an endpoint are its scraped running
// plus waiting requests beyond this router's own in flight at the scrape (Metrics.At),
// and their KV blocks the scraped usage beyond this router's footprint then. Without
// a scrape time, or a history reaching back to it, there are none. p.mu must be held.
func (p *Policy) shared(cands []scoring.Endpoint, sc *scratch, key uint64) {
	n := len(cands)
	sc.others = slices.Grow(sc.others[:0], n)[:n]
	sc.otherKV = slices.Grow(sc.otherKV[:0], n)[:n]
	sc.otherPrefill = slices.Grow(sc.otherPrefill[:0], n)[:n]
	sc.otherMisses = slices.Grow(sc.otherMisses[:0], n)[:n]
	for i := range cands {
		sc.others[i], sc.otherKV[i], sc.otherPrefill[i], sc.otherMisses[i] = 0, 0, 0, 0
		if p.peers != nil {
			l := p.peers.PeerLoad(cands[i].Address, sc.eps[i])
			sc.others[i], sc.otherKV[i] = l.Requests, float64(l.KVBlocks)
			sc.otherPrefill[i], sc.otherMisses[i] = l.Prefill, l.Misses
			sc.loads[i] += l.Requests + p.unheardPicks(sc.eps[i], key)
			continue
		}
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
// heldBlocks blocks and no request for it is in flight there) and no other candidate holds it:
// the request missesInPrefill wherever it goes, so its prefix is recomputed on the candidate with
// KV room of least home share (homeShare), and that one becomes the home. p.mu must be
// held.
func (p *Policy) rehome(e *prefixEntry, key uint64, cands []scoring.Endpoint, sc *scratch, heldBlocks int) {
	old := -1
	for i := range cands {
		if sc.pos[i] < 0 {
			continue
		}
		if sc.lead[i] >= max(heldBlocks, 1) || sc.eps[i].active[key] != nil ||
			(p.peers != nil && p.peers.PeerActive(cands[i].Address, key)) {
			return // someone holds it, or is computing it
		}
		if e.sites[sc.pos[i]].home {
			old = i
		}
	}
	if old < 0 {
		return
	}
	// Requests other routers sent there (scraped, as stale as the scrape) may be
	// computing the prefix now: leave the home alone. Router replicas' own requests
	// (SetPeers) are not among them: each peer's in-flight prefixes are known
	// (PeerActive, above), and counting any of their requests there stopped almost every
	// rehome (kvbench --sim --replicas 2, N = 24, C = 16: 7 rehomes by both replicas against
	// one router's 68; docs/results-policy.md).
	others := sc.others[old] > 0 && p.peers == nil
	if m := cands[old].Metrics; others || (m.Valid && m.Running+m.Waiting > sc.loads[old]) {
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
			return float64(sc.eps[i].prefill+sc.otherPrefill[i]+len(sc.keys)*sc.blockSize+p.cfg.RehomeLoadTokens*sc.loads[i]) * d
		}
		bestEst := est(old)
		if !sc.ok[old] {
			bestEst = math.Inf(1)
		}
		for i := range cands {
			if i == old || !sc.ok[i] {
				continue
			}
			if p.homeShare(sc, cands, i, e.weight()) > limit {
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
			share := p.homeShare(sc, cands, i, e.weight())
			if share < bestShare || (share == bestShare && p.wait(sc, i) < p.wait(sc, best)) {
				best, bestShare = i, share
			}
		}
	}
	if best == old {
		return
	}
	j := sc.pos[old]
	p.unplace(e, &e.sites[j])
	p.resite(e, slices.Delete(e.sites, j, j+1))
	for i := range cands {
		if sc.pos[i] > j {
			sc.pos[i]--
		}
	}
	sc.pos[old] = -1
	sc.pos[best] = p.place(e, cands[best].Address, true)
}

// homeShare is candidate i's home blocks, plus extra, per block of its KV capacity.
func (p *Policy) homeShare(sc *scratch, cands []scoring.Endpoint, i, extra int) float64 {
	return float64(sc.eps[i].homeBlocks+extra) / float64(p.capacity(&cands[i]))
}

func (p *Policy) fillOf(ep *endpointState, c *scoring.Endpoint) float64 {
	return float64(ep.placedBlocks) / float64(p.capacity(c))
}

// newHome places a prefix no candidate holds on the candidate with the least home
// blocks per block of capacity, among those below SpillLoad if any. A prefix seen once
// has an unknown size, its prompt only bounding it; where its prompt fits one engine
// step, it counts, here and in the endpoints' shares, as the mean size learned so far
// (prefixEntry.guess). Counted as its whole prompt, long tails' 1,024-token prefixes
// seen once (2,024-token prompts) weighed twice their size, and a new prefix went to an
// endpoint prefilling a miss while another, homing as many blocks, idled (long tails,
// N = 24: TTFT p99 174 -> 168 ms alone, 149 with the divert behind a prefill, kv 149;
// docs/results-workloads.md). On longer prompts (tight memory's 2,371 tokens, mixed's
// contexts) the guess cost ratio and throughput there and is not made.
func (p *Policy) newHome(e *prefixEntry, key uint64, cands []scoring.Endpoint, sc *scratch) int {
	if p.cfg.Balance > 0 {
		if i := p.rendezvous(e, key, cands, sc); i >= 0 {
			sc.pos[i] = p.place(e, cands[i].Address, true)
			return i
		}
	}
	// A fleet starting (no decode time measured) takes its clients' first requests at
	// once, each a new prefix's miss computed now: homed by share alone, the endpoints
	// of most KV capacity took several of them in prefill together while others idled
	// (two 4 GiB and four 1 GiB endpoints, N = 24, C = 8: TTFT p99 266 ms, kv 189). So
	// while an endpoint with no prefill in progress can take it, the home is chosen
	// among those; the share still ranks them, and decides alone once each prefills.
	best, bestShare, bestOK := -1, 0.0, false
	free := false
	for i := range cands {
		free = free || (sc.cold && sc.ok[i] && sc.eps[i].prefill+sc.otherPrefill[i] == 0)
	}
	for i := range cands {
		ok := sc.ok[i] && (!free || sc.eps[i].prefill+sc.otherPrefill[i] == 0)
		share := float64(sc.eps[i].homeGuessed+e.guessed()) / float64(p.capacity(&cands[i]))
		better := best < 0 || (ok && !bestOK) ||
			(ok == bestOK && (share < bestShare || (share == bestShare && (p.wait(sc, i) < p.wait(sc, best) ||
				p.wait(sc, i) == p.wait(sc, best) && p.coldTie(sc, i, best)))))
		if better {
			best, bestShare, bestOK = i, share, ok
		}
	}
	if f := p.fastHome(e, cands, sc, best); f >= 0 {
		best = f
	}
	sc.pos[best] = p.place(e, cands[best].Address, true)
	return best
}

// fastHome returns the candidate a new prefix whose first prompt is a long prefill
// (more than 1/(1-MissSpeedup) steps) is homed on instead of the partition's choice
// part, or -1: the one where its prefill ends soonest, its backlog plus its prompt at
// its measured prefill speed for prompts of that size (unmeasured: the slowest
// measured, so an unknown endpoint is not assumed fast), when that is under
// MissSpeedup of the time at part and the prefix fits there beside its homes. The
// partition ranks by home blocks per capacity only, and homed a 64k-token context on a
// 0.7-speed endpoint while a full-speed one had room (mixed, seed 3: p99 TTFT 249 ms,
// kv 195). p.mu must be held.
func (p *Policy) fastHome(e *prefixEntry, cands []scoring.Endpoint, sc *scratch, part int) int {
	tokens := len(sc.keys) * sc.blockSize
	if !p.cfg.LongContexts || !p.long(tokens) {
		return -1
	}
	// Seconds (or, with no prefill of its size measured anywhere, decode time) per
	// token at each candidate, the slowest measured where it is not measured.
	class := prefillClass(tokens)
	speed := func(i int) float64 {
		if m := sc.eps[i].prefillSpeed[class]; m.tokens > 0 {
			return m.secs / m.tokens
		}
		return 0
	}
	if !slices.ContainsFunc(sc.eps, func(ep *endpointState) bool { return ep.prefillSpeed[class].tokens > 0 }) {
		speed = func(i int) float64 { return sc.decode[i] }
	}
	slowest := 0.0
	for i := range cands {
		slowest = max(slowest, speed(i))
	}
	if slowest == 0 {
		return -1
	}
	est := func(i int) float64 {
		spt := speed(i)
		if spt == 0 {
			spt = slowest
		}
		return float64(sc.eps[i].prefill+tokens) * spt
	}
	best, limit := -1, p.cfg.MissSpeedup*est(part)
	for i := range cands {
		if i == part || !sc.ok[i] || sc.eps[i].homeBlocks+e.weight() > p.capacity(&cands[i]) {
			continue
		}
		if x := est(i); x < limit {
			best, limit = i, x
		}
	}
	return best
}

// coldTie reports whether candidate i wins an exact tie against j (i after j in cands)
// for a new home or a copy. One router keeps the candidates' order, and its consecutive
// picks take the first candidates in turn. Router replicas, while no decode time is
// measured (a fleet starting), rotate the order by their rank: replicas that home or
// copy prefixes at the same instant on the same view would otherwise all take the first
// candidates (kvbench --sim --replicas 4, N = 2: both prefixes homed on one endpoint and
// every request sent there; with only homes rotated, C = 16's first burst copied the
// prefixes onto the first four endpoints alone and left two unused). Rank 0 and one
// router keep the order. p.mu must be held.
func (p *Policy) coldTie(sc *scratch, i, j int) bool {
	if p.peers == nil || sc.replicas < 2 || !sc.cold {
		return false
	}
	n := len(sc.eps)
	r := sc.rank % n
	return (i-r+n)%n < (j-r+n)%n
}

// crowded reports whether a copy's exact ties rotate (coldTie): when this replica's own
// requests on the prefix's least-loaded holder h, times the number of replicas, exceed
// the candidates. Replicas deciding at the same instant on the same view each carry
// such a burst, so together they need more endpoints than the fleet's first ones and
// their copies must spread (kvbench --sim --replicas 4, N = 2, C = 8 and 16: two to four
// requests each). A smaller burst is one replica's own (--replicas 2, N = 24, C = 4: two
// requests of one prefix, no peer on it): its copy goes where one router's would, and
// rotating it moved the early layout (ratio -1.1 points from one router's, -0.8
// without). p.mu must be held.
func (p *Policy) crowded(sc *scratch, h int) bool {
	return (sc.loads[h]-sc.others[h])*sc.replicas > len(sc.eps)
}

// holderTurn returns the holder this router replica takes when the best holder g is
// idle: the (rank+1)-th of the picks one router would make in a row by better, each
// counted as load on the holder it took. Replicas picking at the same instant on the
// same view see the same idle holder g; taking their turns by rank they spread over a
// prefix's holders as one router's consecutive picks do, instead of all joining g
// (kvbench --sim --replicas 4, N = 2, C = 16: 2 to 5 requests of one instant on one
// slow endpoint, TTFT p99 121 ms against kv's 101). Rank 0 and one router take g.
// p.mu must be held.
func (p *Policy) holderTurn(cands []scoring.Endpoint, sc *scratch, g int, better func(i, j int) bool) int {
	if p.peers == nil || sc.replicas < 2 || sc.rank == 0 {
		return g
	}
	sc.turnLoads = append(sc.turnLoads[:0], sc.loads...)
	pick := g
	for range sc.rank {
		sc.loads[pick]++
		pick = -1
		for i := range cands {
			if sc.pos[i] >= 0 && sc.ok[i] && better(i, pick) {
				pick = i
			}
		}
	}
	copy(sc.loads, sc.turnLoads)
	return pick
}

// rendezvous returns the candidate of highest capacity-weighted rendezvous score for key
// among those with KV room whose home blocks stay within Balance of their capacity
// share (bounded-load rendezvous hashing: router replicas with the same view choose the
// same home without talking), or -1 when none qualifies. p.mu must be held.
func (p *Policy) rendezvous(e *prefixEntry, key uint64, cands []scoring.Endpoint, sc *scratch) int {
	var used, capacity float64
	for i := range cands {
		used += float64(sc.eps[i].homeBlocks)
		capacity += float64(p.capacity(&cands[i]))
	}
	used += float64(e.weight())
	best, bestScore := -1, 0.0
	for i := range cands {
		c := float64(p.capacity(&cands[i]))
		bound := max(float64(e.weight()), p.cfg.Balance*used*c/capacity)
		if !sc.ok[i] || float64(sc.eps[i].homeBlocks+e.weight()) > bound {
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
func (p *Policy) score(key uint64, ep *endpointState, c *scoring.Endpoint) float64 {
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

// divert returns the candidate a request should go to instead of best when best's
// estimated time to first token, its prefill backlog plus the request's uncached tokens
// scaled by its measured speed, exceeds the deadline and another candidate with KV room
// would start it at least twice as soon; -1 otherwise. The deadline is one engine step:
// MaxNumBatchedTokens plus a block (the index counts a hit in whole blocks), i.e. the
// request's prefill would not finish in the next step there. When best has no KV room
// for the request and no candidate has any, the request goes where room comes soonest
// (soonestRoom). A diverted request places nothing. The backlog is this router's own:
// router replicas' prefill, as last heard from them (SetPeers), is left out, which
// diverted fewer hits away from their holders (kvbench --sim, 9 repetitions: N = 24,
// C = 16 from 1.0 to 0.3 points under one router's cached-token ratio at 2 replicas,
// from 2.7 to 1.0 at 4; docs/results-policy.md). p.mu must be held.
func (p *Policy) divert(e *prefixEntry, key uint64, cands []scoring.Endpoint, sc *scratch, best, tokens, bs int) int {
	est := func(i int) float64 { return p.startEst(sc, i, tokens, bs) }
	eb := est(best)
	late := p.cfg.DivertDeadline && eb > float64(p.cfg.MaxNumBatchedTokens+bs)
	full := p.cfg.DivertOnFull && !sc.room[best]
	// A busy endpoint that lost most of the prefix would recompute it behind others.
	miss := p.cfg.DivertMisses && sc.loads[best] > 0 &&
		sc.lead[best] < e.held(p.cfg.HolderShare) &&
		!(p.peers != nil && p.peers.PeerActive(cands[best].Address, key)) // a peer is computing it there
	if !late && !full && !miss {
		return -1
	}
	// Past Saturated an endpoint takes no divert (queueing there costs more than a miss
	// elsewhere), unless the fleet is behind its arrivals (behind): a late request then
	// stays behind a long prefill at its holder while another endpoint would start it
	// twice as soon (the 200-request trace at 8x: short hits waited 4.9 to 5.6 s behind
	// a 35k-token prefill; p99 5,604 -> 4,362 ms, 10.54 -> 12.07 requests/s, kv 4,387
	// and 11.14).
	behind := late && p.behind(sc, best)
	eligible := func(i int) bool {
		if i == best || !(sc.ok[i] || behind && sc.room[i]) {
			return false
		}
		if miss && !full && (sc.loads[i] > 0 || !(sc.decode[i] > 0 && sc.decode[i] < p.cfg.MissSpeedup*sc.decode[best])) {
			return false
		}
		return full || p.moveOK(sc, i, best)
	}
	// movable is any candidate that may take the request, not only an idle faster one,
	// for a miss that misses wherever it goes or waits behind a long prefill.
	movable := func(i int) bool { return i != best && sc.ok[i] && p.moveOK(sc, i, best) }
	alt, ea := -1, 0.0
	for i := range cands {
		if !eligible(i) {
			continue
		}
		if x := est(i); alt < 0 || x < ea {
			alt, ea = i, x
		}
	}
	if alt < 0 && late && miss && !full && p.long(sc.eps[best].prefill) {
		// A miss that no idle faster endpoint takes, behind a long prefill at best,
		// still goes where it starts twice as soon, as a late hit would: vLLM
		// schedules its running requests first, so a long prompt's chunks take every
		// step's whole token budget until its prefill ends, and a request behind it
		// waits all of it (mixed, seed 2: a 2,384-token one-shot request homed beside
		// a 65,840-token prefill took 12.9 s to its first token, a 930-token turn
		// behind another 10.9 s; docs/results-workloads.md, held-out). Behind a
		// shorter backlog the miss stays: it clears within a few steps, and the
		// reference's misses diverted behind 2,371-token ones lost N = 24, C = 16
		// (0.951 -> 0.929 x the partition).
		for i := range cands {
			if !movable(i) {
				continue
			}
			if x := est(i); 2*x <= eb && (alt < 0 || x < ea) {
				alt, ea = i, x
			}
		}
		if alt >= 0 {
			return alt
		}
	}
	if alt < 0 && full {
		return p.soonestRoom(key, cands, sc, best, tokens)
	}
	if late && !full && (alt < 0 || 2*ea > eb) && sc.eps[best].prefill > 0 && (!miss || (alt < 0 && p.heldNowhere(key, cands, sc))) {
		// A miss of a prefix held nowhere misses wherever it goes: any endpoint that
		// may take it, not only an idle faster one.
		el := eligible
		if miss {
			el = movable
		}
		if r := p.besidePrefill(key, cands, sc, el, est, eb, tokens, bs); r >= 0 {
			return r
		}
	}
	if alt < 0 || (!full && !miss && 2*ea > eb) {
		return -1
	}
	if full && !p.fitsStep((sc.lead[best]-sc.lead[alt])*bs, bs) && !p.firstSooner(key, cands, sc, alt, best, tokens) {
		return -1
	}
	// Candidates whose backlog fits in one step start the request in the next step
	// alike: their estimates differ by less than a step. Diverted to a holder of its
	// prefix, the request goes to the least-loaded of those holders caching as much of
	// it whose measured decode time is within noise (MissSpeedup) of the soonest one's:
	// where its decode steps are shared least, as kv would choose, instead of one a few
	// milliseconds faster in measured decode time running several requests
	// (12 servers, N = 2, C = 16: throughput 28.25 -> 29.14 requests/s, kv 29.02).
	step := float64(p.cfg.MaxNumBatchedTokens + bs)
	if ea > step || sc.pos[alt] < 0 {
		return alt
	}
	lead := sc.lead[alt]
	same := func(i int) bool {
		return sc.pos[i] >= 0 && sc.lead[i] >= lead && eligible(i) &&
			est(i) <= step && (full || miss || 2*est(i) <= eb)
	}
	decode := func(i int) float64 {
		if sc.decode[i] > 0 {
			return sc.decode[i]
		}
		return sc.meanDecode
	}
	da := decode(alt)
	for i := range cands {
		if i == alt || !same(i) || decode(i)*p.cfg.MissSpeedup > da || da*p.cfg.MissSpeedup > decode(i) {
			continue
		}
		if sc.loads[i] < sc.loads[alt] {
			alt = i
		}
	}
	return alt
}

// firstSooner reports whether a request best has no KV room for gets its first token
// sooner at alt, which has room and holds more than one engine step less of it (a
// prefix one step recomputes moves freely, as in moveOK: the reference's 2,032-token
// prefixes held back by it lost N = 24, C = 16, p99 TTFT 209 -> 243 ms, kv 230), than
// it would waiting at best:
// at best, when room comes there (roomWait) plus its prefill backlog and uncached
// tokens; at alt, its backlog and the tokens alt does not hold; each at the endpoint's
// measured prefill speed for that many (prefillEnds; at best, none when it fits one
// step: it starts and ends in the step after room comes), alt's better than MissSpeedup
// (the margin a long prefill is timed to, as longMiss's). Sent where it started
// soonest (startEst), with no room at its holder, a 33,644-token turn left the
// endpoint holding 1,142 of its 2,103 blocks to recompute it all on one running a
// single request (5.5 s to its first token; Mooncake-shaped conversations, seed 2 at
// 6x: 3.73 requests/s, kv 3.80; docs/results-workloads.md). Unmeasured speeds, or no
// room coming at best while its decodes run, leave the move. p.mu must be held.
func (p *Policy) firstSooner(key uint64, cands []scoring.Endpoint, sc *scratch, alt, best, tokens int) bool {
	w, _ := p.roomWait(key, cands, sc)(best)
	fb, fa := sc.prefillEnds(best, sc.eps[best].prefill, tokens), sc.prefillEnds(alt, sc.eps[alt].prefill, tokens)
	short := p.fitsStep(sc.eps[best].prefill+max(0, tokens-sc.lead[best]*sc.blockSize), sc.blockSize)
	if math.IsInf(w, 1) || fa == 0 || fb == 0 && !short {
		return true
	}
	return fa < p.cfg.MissSpeedup*(w+fb)
}

// behind reports whether the fleet is behind its arrivals as best sees it: best is past
// Saturated, or every other candidate is while best's prefill backlog is long (more
// than 1/(1-MissSpeedup) steps). vLLM schedules its running requests first, so a long
// prompt's chunks take each step's whole budget and requests routed behind it wait
// without running: its endpoint's load stays low while it is the slowest to start
// anything. At the 200-request trace at 8x, a 35k-token first turn's endpoint was the
// one below Saturated (5 requests, 6 and 7 everywhere else); a hit routed there waited
// 5.8 s for its first token and two later turns of its conversation joined it
// (throughput 11.07 -> 11.24 requests/s, kv 11.14; docs/results-workloads.md,
// "Overload"). Behind a short backlog best starts it within a few steps, and an
// endpoint past Saturated costs more. p.mu must be held.
func (p *Policy) behind(sc *scratch, best int) bool {
	if sc.loads[best] >= p.cfg.Saturated {
		return true
	}
	if !p.long(sc.eps[best].prefill) {
		return false
	}
	for i, l := range sc.loads {
		if i != best && l < p.cfg.Saturated {
			return false
		}
	}
	return true
}

// besidePrefill returns the candidate a late request (its prefill would not finish in
// the next step at best, behind a prefill in progress there) goes to when no candidate
// starts it twice as soon: among eligible candidates with no prefill in progress, whose
// prefill of the request fits one step (it starts and finishes in their next step) and
// that have room for it and its prefix beside their live placements and requests (the
// copy evicts nothing live, spare), the one of least estimate, if sooner than best's
// (eb); -1 otherwise. At best the request's prefill would join the prefill in progress
// and finish a step later: long tails' hits (1,000-token tails) behind a miss in
// prefill took 166 and 194 ms where an idle endpoint would have started them as misses
// in 110 and 143, and a new prefix's first request homed beside a prefill as clients
// finished together 203 ms (long tails, N = 24: TTFT p99 at workload seeds 1 to 4 174,
// 157, 157, 150 -> 149, 150, 150, 149 ms with the guessed size of newHome, kv 149, 150,
// 149, 149; docs/results-workloads.md). A miss goes so only when the prefix is held
// nowhere (a new prefix's first request) and no idle faster candidate takes it
// (DivertMisses): for any miss, the reference grid lost N = 24, C = 16 (0.951 -> 0.940
// x the partition). A prompt longer than a step (the reference's 2,371 tokens, long
// contexts) is left to the twice-as-soon rule. p.mu must be held.
func (p *Policy) besidePrefill(key uint64, cands []scoring.Endpoint, sc *scratch, eligible func(int) bool, est func(int) float64, eb float64, tokens, bs int) int {
	r, er := -1, 0.0
	for i := range cands {
		if !eligible(i) || sc.eps[i].prefill+sc.otherPrefill[i] > 0 ||
			!p.fitsStep(max(0, tokens-sc.lead[i]*bs), bs) || !p.spare(key, cands, sc, i) {
			continue
		}
		if x := est(i); x < eb && (r < 0 || x < er) {
			r, er = i, x
		}
	}
	return r
}

// startEst estimates when candidate i would start a request of tokens prompt tokens,
// in tokens of prefill at the mean measured speed: its prefill backlog plus the
// request's uncached tokens there, scaled by its measured decode time. p.mu must be
// held.
func (p *Policy) startEst(sc *scratch, i, tokens, bs int) float64 {
	d := sc.decode[i]
	if d == 0 {
		d = sc.meanDecode
	}
	backlog := sc.eps[i].prefill + max(0, tokens-sc.lead[i]*bs)
	return float64(backlog) * d / sc.meanDecode
}

// longMiss returns the candidate a long miss should go to instead of best, or -1. A
// long miss has more than one engine step of uncached tokens at best, and they are
// known: best holds less than the blocks the index was asked about (the agent
// workload's 100k-token steps, asked about their 64k-token context only, looked like
// 37k-token misses and went to cold endpoints: throughput 2.19 -> 1.46 requests/s).
// Candidates are those with KV room below Saturated that moveOK allows, where it evicts
// no more of the recent long prompts (histories) than at best.
//
// A prefill timed to better than MissSpeedup (more than 1/(1-MissSpeedup) steps,
// 13,653 tokens at 2,048 a step: a prefill of n steps is timed to within the step under
// way when it comes) goes to the candidate of least cost, when less than MissSpeedup
// times best's: when its prefill ends there (the prefill backlog and its uncached
// tokens), in seconds at the endpoint's measured prefill speed for prompts of its size
// (unmeasured: the slowest measured, prefillSecsPerToken, as the other rules timing
// prefills count it; the mean of the measured ones kept a 34k-token first turn on an
// unmeasured 0.7-speed endpoint, a full-speed one measured not 0.85 times the mean).
// Weighed by its own tokens alone, a 20,393-token first turn went to its system
// prompt's holder and waited 5.1 s behind a 35,916-token prefill there
// (Mooncake-shaped conversations, seed 1 at 6x; docs/results-workloads.md). The
// histories it evicts bound where it
// may go (no more than at best) but add nothing to the cost: their recompute is paid
// only if their next turns come, which is not known, and not by this request. Added
// at full weight, they sent a 34k-token first turn off an idle full-speed endpoint
// (720 history blocks, 7.5 s) to a 0.7-speed one (none, 5.8 s; its prefill took 6.2
// s), whose next turns followed it there (trace-600 seed 2 at 3x: 5.85 -> 5.92
// requests/s, kv 5.90; docs/results-workloads.md). Decode time does not tell speeds apart for long prefills
// (trace-600 seed 1: 1.319 s at a 0.7-speed endpoint against 1.304 s at a full-speed
// one), and shorter prefills' speeds moved the reference's 2,371-token misses by noise
// (12 servers, N = 7, C = 16: throughput 27.81 -> 27.54 requests/s, kv 27.93).
//
// Otherwise (shorter, or no speed measured for its size), when at best it would evict
// a history, it goes where it evicts none, when the prefill the move adds is less than
// what it keeps, soonest start first (startEst); where it evicts some everywhere it
// stays: which histories a next turn needs is not known. p.mu must be held.
func (p *Policy) longMiss(cands []scoring.Endpoint, sc *scratch, best, tokens, bs int) int {
	uncached := tokens - sc.lead[best]*bs
	if !p.cfg.LongContexts || sc.lead[best] >= sc.looked || !p.long(uncached) {
		return -1
	}
	lost := p.evicts(cands, sc, best)
	if sc.prefillSecsPerToken(best, uncached) > 0 {
		cost := func(i int) float64 {
			return float64(sc.eps[i].prefill+max(0, tokens-sc.lead[i]*bs)) * sc.prefillSecsPerToken(i, uncached)
		}
		alt, limit := -1, p.cfg.MissSpeedup*cost(best)
		for i := range cands {
			if i == best || !sc.ok[i] || !p.moveOK(sc, i, best) {
				continue
			}
			if p.evicts(cands, sc, i) <= lost {
				if c := cost(i); c < limit {
					alt, limit = i, c
				}
			}
		}
		return alt
	}
	if lost == 0 {
		return -1
	}
	alt := -1
	for i := range cands {
		if i == best || !sc.ok[i] || !p.moveOK(sc, i, best) || sc.lead[best]-sc.lead[i] >= lost || p.evicts(cands, sc, i) > 0 {
			continue
		}
		if alt < 0 || p.startEst(sc, i, tokens, bs) < p.startEst(sc, alt, tokens, bs) {
			alt = i
		}
	}
	return alt
}

// fitsStep reports whether a prefill of n tokens counts as one engine step: at most
// MaxNumBatchedTokens plus one block of bs tokens, the one-step test of the learned-size
// guess, the histories, prefill timing and besidePrefill.
func (p *Policy) fitsStep(n, bs int) bool { return n <= p.cfg.MaxNumBatchedTokens+bs }

// long reports whether a prefill of n uncached tokens is long: more than
// 1/(1-MissSpeedup) engine steps (13,653 tokens at 2,048 a step). A prefill of n steps
// is timed to within the step under way when it comes, so only past that are speeds
// MissSpeedup apart told apart.
func (p *Policy) long(n int) bool {
	return float64(n)*(1-p.cfg.MissSpeedup) > float64(p.cfg.MaxNumBatchedTokens)
}

// evicts returns the blocks of candidate i's histories the request would evict there.
// vLLM evicts free blocks least recently used first, a request's tail first: a history
// keeps its blocks while the blocks allocated there since it was routed (its own
// included), plus its cached head, fit in the endpoint's capacity; the request's own
// new blocks (uncached there, plus its expected output) push out the part past it. Histories
// already past it are forgotten.
//
// With peers, the blocks allocated there are every replica's (turnover) and the
// histories are theirs too (PeerView.PeerTurnover): the endpoint's cache turns over
// with all of them. With its own only, a replica saw an endpoint where its peer had
// sent ten long prompts as one where a 34k-token first turn evicted nothing, and kept
// the turn there, a 0.7-speed endpoint, rather than move it to a full-speed one
// evicting less of what both had sent (trace-600 seed 1 at 2x, 2 replicas: 4.65 ->
// 4.74 requests/s, kv 4.73; docs/results-workloads.md, "Probed axes"). p.mu must be held.
func (p *Policy) evicts(cands []scoring.Endpoint, sc *scratch, i int) int {
	ep := sc.eps[i]
	capacity := p.capacity(&cands[i])
	var sent int
	sent, sc.peerHistories = p.turnover(ep, sc.peerHistories[:0])
	ep.histories = slices.DeleteFunc(ep.histories, func(h history) bool {
		return sent-h.before+h.cached > capacity
	})
	add := len(sc.keys) - sc.lead[i] + sc.out
	lost := 0
	count := func(before, cached, blocks int) {
		if sent-before+cached > capacity {
			return
		}
		if over := sent - before + cached + add - capacity; over > 0 {
			lost += min(over, blocks)
		}
	}
	for _, h := range ep.histories {
		count(h.before, h.cached, h.blocks)
	}
	for _, h := range sc.peerHistories {
		count(h.Before, h.Cached, h.Blocks)
	}
	return lost
}

// turnover is the KV blocks every router's requests have allocated on ep: this
// router's (sent) plus, with peers, theirs as last heard; the peers' histories there
// are appended to dst. p.mu must be held.
func (p *Policy) turnover(ep *endpointState, dst []History) (int, []History) {
	if p.peers == nil {
		return ep.sent, dst
	}
	o, dst := p.peers.PeerTurnover(ep.addr, dst)
	return ep.sent + o, dst
}

// soonestRoom returns the candidate other than best where KV room for the request
// comes soonest, when it comes sooner than at best; -1 otherwise. No candidate has room
// now: the request waits in the engine for blocks wherever it goes, until requests
// decoding there finish and free theirs (each expected to finish its measured decode
// time after its first token). Requests still in prefill are not counted as freeing
// anything. A decoding request frees its own blocks; its prefix's free with the last
// of the prefix's requests there, once all of them decode, and never for a request of
// that prefix, which needs them. (Counted freed, a holder with a miss queued for blocks
// looked as if room came after one decode, and the hit queued behind the miss; counted
// never freed when two requests shared it, endpoints running two requests of one
// prefix looked short of room for good. Both together: tight memory, N = 24, C = 8,
// p99 TTFT 883 -> 674 ms, kv 830; C = 16 2,107 -> 1,736 ms, kv 2,082.) Where even
// every decoding request's blocks are not enough, requests not started yet are queued
// for blocks there, ahead of this one, and when they free cannot be timed; their blocks
// beyond the capacity (queued) rank such candidates instead, and the request leaves
// best only for a candidate queueing at least its own blocks less: one whole request
// fewer ahead of it (tight memory, N = 24, C = 16: p99 TTFT 2,393 -> 2,107 ms, kv
// 2,082, before the counting above; docs/results-workloads.md). Where room comes as
// soon at several (decodes past their measured time free it at once), the request goes
// where its prefill ends soonest: the prefill backlog there and its own uncached tokens
// (tokens, less what the endpoint caches), at the endpoint's measured prefill speed for
// that size. Kept on its tie with best, a 19,002-token first turn waited at a 0.7-speed
// holder of its 2,048-token system prompt behind 31,452 tokens of prefill while a
// full-speed endpoint had none, and two history hits queued behind it (Mooncake-shaped
// conversations, seed 1, at 6x: 3.83 -> 3.98 requests/s, kv 3.98;
// docs/results-workloads.md, "Probed axes"). p.mu must be held.
func (p *Policy) soonestRoom(key uint64, cands []scoring.Endpoint, sc *scratch, best, tokens int) int {
	wait := p.roomWait(key, cands, sc)
	// ends is when the request's prefill would end at i once room comes, router
	// replicas' backlog counted.
	ends := func(i int) float64 { return sc.prefillEnds(i, sc.eps[i].prefill+sc.otherPrefill[i], tokens) }
	wb, qb := wait(best)
	blocks := len(sc.keys)
	alt, wa, qa, ea := -1, wb, qb, ends(best)
	for i := range cands {
		if i == best {
			continue
		}
		w, q := wait(i)
		if w < wa || (math.IsInf(w, 1) && math.IsInf(wa, 1) && q+float64(blocks) <= qb && q < qa) {
			alt, wa, qa, ea = i, w, q, ends(i)
		} else if w == wa && !math.IsInf(w, 1) {
			if e := ends(i); e < ea {
				alt, wa, qa, ea = i, w, q, e
			}
		}
	}
	return alt
}

// roomWait returns when KV room for the request (its keys in sc) comes at candidate i,
// in seconds from now, as soonestRoom counts it, or +Inf and the blocks still queued
// beyond i's capacity once every decoding request there has finished. p.mu must be
// held.
func (p *Policy) roomWait(key uint64, cands []scoring.Endpoint, sc *scratch) func(i int) (at, queued float64) {
	if sc.epIndex == nil {
		sc.epIndex = make(map[*endpointState]int, len(cands))
	}
	idx := sc.epIndex
	clear(idx)
	for i := range cands {
		idx[sc.eps[i]] = i
	}
	sc.frees = slices.Grow(sc.frees[:0], len(cands))[:len(cands)]
	frees := sc.frees
	for i := range frees {
		frees[i] = frees[i][:0]
	}
	sc.prefixes = sc.prefixes[:0]
	now := p.now()
	for _, r := range p.reqs {
		i, ok := idx[r.ep]
		if !ok || r.first.IsZero() {
			continue
		}
		d := sc.decode[i]
		if d == 0 {
			d = sc.meanDecode
		}
		at := max(0, d-now.Sub(r.first).Seconds())
		a := r.ep.active[r.key]
		if r.key == key || a == nil {
			frees[i] = append(frees[i], freeing{at: at, blocks: r.unique})
			continue
		}
		if a.requests == 1 { // the prefix's only request there: they free together
			frees[i] = append(frees[i], freeing{at: at, blocks: r.unique + a.blocks})
			continue
		}
		frees[i] = append(frees[i], freeing{at: at, blocks: r.unique})
		if a.stamp != p.tick {
			a.stamp, a.decoding, a.freeAt = p.tick, 0, 0
			sc.prefixes = append(sc.prefixes, activeOn{a, i})
		}
		a.decoding++
		a.freeAt = max(a.freeAt, at)
	}
	// A prefix's blocks free with the last of its requests there, when every one of them
	// is decoding (one not started holds them further).
	for _, x := range sc.prefixes {
		if x.a.requests == x.a.decoding {
			frees[x.i] = append(frees[x.i], freeing{at: x.a.freeAt, blocks: x.a.blocks})
		}
	}
	blocks := len(sc.keys)
	return func(i int) (at, queued float64) {
		capacity := p.cfg.Headroom * float64(p.capacity(&cands[i]))
		used := float64(sc.eps[i].footprint) + sc.otherKV[i] + float64(p.need(sc.eps[i], key, &cands[i], blocks, sc.out, sc.shared(sc.eps[i])))
		f := frees[i]
		slices.SortFunc(f, func(a, b freeing) int { return cmp.Compare(a.at, b.at) })
		for _, x := range f {
			if used <= capacity {
				break
			}
			used -= float64(x.blocks)
			if used <= capacity {
				return x.at, 0
			}
		}
		if used <= capacity {
			return 0, 0
		}
		return math.Inf(1), used - capacity
	}
}

// moveOK reports whether the request may go to candidate i instead of from: the
// prefill the move adds (its uncached tokens at i beyond those at from) fits in one
// step's token budget (MaxNumBatchedTokens) plus the prefill backlog it skips at from.
// A prefix that one step recomputes moves freely; a long context moves only past a
// backlog at least as long as its recompute. p.mu must be held.
func (p *Policy) moveOK(sc *scratch, i, from int) bool {
	n := len(sc.keys) * sc.blockSize
	add := max(0, n-sc.lead[i]*sc.blockSize) - max(0, n-sc.lead[from]*sc.blockSize)
	return add <= p.cfg.MaxNumBatchedTokens+sc.eps[from].prefill-sc.own[from]
}

// missBeforeWait reports whether the request's miss at candidate i ends before the
// queue at holder h would: its tokens i lacks, behind i's prefill backlog, at i's
// measured prefill speed for their size (prefillEnds), take less than h's wait exceeds
// i's (wait: the requests in flight there, plus this one, times the endpoint's measured
// decode time, the fleet's mean where it has none). A spill off a real queue (the holder at SpillLoad) may then add more
// than one engine step of prefill (moveOK): with agents' histories the fleet fell
// behind with one endpoint running 49 to 59 requests, its requests decoding in 5.1 s
// against 1.2 to 1.7 s elsewhere, while the other endpoints ran 1 to 8 and idled 17 to
// 28% of the time (toolagent seed 1 at 16x: throughput 17.13 requests/s, kv 18.43;
// docs/results-workloads.md, "Mooncake-shaped traces"). Unmeasured (no prefill speed
// for the size anywhere), it is false. p.mu must be held.
func (p *Policy) missBeforeWait(sc *scratch, i, h int) bool {
	t := sc.prefillEnds(i, sc.eps[i].prefill, len(sc.keys)*sc.blockSize)
	return t > 0 && t < p.wait(sc, h)-p.wait(sc, i)
}

// copyWorth reports whether a replica on candidate i, past Fill, is worth its miss
// against the request's hit at the busy holder h. The prefix must be a shared one that
// stays put (its last two requests diverged right past it; a conversation's history
// grows every turn, and a copy of it goes stale), h must hold it, and i must be idle
// (the copy's prefill joins no other request's steps) with room for the copy and the
// request beside its live placements and in-flight requests (it evicts nothing live).
// Then the copy costs the request the prefix's tokens i lacks; the hit costs each
// request running at h the request's own tokens past the prefix, prefilled in their
// steps. So the larger the share of the prompt a hit saves, the busier its holder must
// be: the reference's 2,032 of 2,371 tokens need seven requests there, long tails'
// 1,024 of 2,024 two (long tails, N = 12: throughput 10.68 -> 10.87 requests/s, kv
// 10.79; N = 24: 10.37 -> 10.73, kv 10.63; docs/results-workloads.md). h may also be a
// home that lost a prefix the index shows held nowhere (heldNowhere): rehome keeps such
// a home where moving it would push another endpoint's home share past RehomeSlack, and
// its misses queued there behind running requests while endpoints were idle (long
// tails, N = 12, seeds 3 and 4: p99 TTFT 184 -> 152 ms, kv 149). The copy is judged as
// against a hit: judged against the miss h would be (worth it whenever h is busy), it
// fired on the reference (N = 24, C = 16 0.951 -> 0.944 x the partition). p.mu must be
// held.
func (p *Policy) copyWorth(e *prefixEntry, key uint64, cands []scoring.Endpoint, sc *scratch, i, h, heldBlocks int) bool {
	if e.branch == 0 || e.blocks > e.branch || sc.loads[i] > 0 {
		return false
	}
	if sc.lead[h] < max(heldBlocks, 1) && !p.heldNowhere(key, cands, sc) {
		return false
	}
	if !p.spare(key, cands, sc, i) {
		return false
	}
	return hitCostsMore(e, sc, i, h)
}

// hitCostsMore reports whether the request's hit at the busy holder h costs more than
// its miss at candidate i: the hit adds the request's own tokens past the prefix to the
// steps of each request running at h, the miss the prefix's tokens i lacks.
func hitCostsMore(e *prefixEntry, sc *scratch, i, h int) bool {
	n := len(sc.keys) * sc.blockSize
	prefix := min(n, e.blocks*sc.blockSize)
	add := max(0, prefix-sc.lead[i]*sc.blockSize)
	return add < (n-prefix)*sc.loads[h]
}

// soonestHolder returns the holder a request whose copy did not pay for its miss
// (copyCost) goes to: as a copy's request diverted back to the holders would, the least
// loaded of the holders that can take it now that start it within one step, whose
// measured decode time is within noise (MissSpeedup) of the soonest one's; g when none
// other qualifies. Before copy_cost such copies were made and their requests diverted
// back so (the reference at 1 GiB, N = 2, C = 8: by wait, g, the request went to a
// 0.7-speed holder running one where the full-speed ones ran two, p99 TTFT 69 -> 71 ms,
// kv 69). p.mu must be held.
func (p *Policy) soonestHolder(cands []scoring.Endpoint, sc *scratch, g int) int {
	tokens := len(sc.keys) * sc.blockSize
	step := float64(p.cfg.MaxNumBatchedTokens + sc.blockSize)
	holder := func(i int) bool { return sc.pos[i] >= 0 && sc.ok[i] && sc.lead[i] >= sc.lead[g] }
	alt, ea := g, p.startEst(sc, g, tokens, sc.blockSize)
	for i := range cands {
		if x := p.startEst(sc, i, tokens, sc.blockSize); holder(i) && x < ea {
			alt, ea = i, x
		}
	}
	if ea > step {
		return g
	}
	decode := func(i int) float64 {
		if sc.decode[i] > 0 {
			return sc.decode[i]
		}
		return sc.meanDecode
	}
	da, best := decode(alt), alt
	for i := range cands {
		if !holder(i) || p.startEst(sc, i, tokens, sc.blockSize) > step ||
			decode(i)*p.cfg.MissSpeedup > da || da*p.cfg.MissSpeedup > decode(i) {
			continue
		}
		if sc.loads[i] < sc.loads[best] {
			best = i
		}
	}
	return best
}

// underShare reports whether the prefix is on fewer endpoints than its share of the
// requests in flight (its own, this one's included, against all of them) times the
// endpoints: the load its requests bring already needs that many, and a copy within
// it is judged by Fill alone (CopyCost). Without it, small fleets' few prefixes took
// their copies late, in the measured run instead of the warm-up (the reference at
// workload seed 2, N = 2, C = 8: p99 TTFT 81 ms, kv 69). As a cap on copies instead of
// an allowance it lost 12 servers, N = 7, C = 16 (27.73 requests/s, kv 27.93). Both
// sides of the share are this router's own view: it knows its own requests per prefix
// but only the totals of other routers' (sc.others), and against the whole fleet's
// load a prefix's share looked 1/replicas of what it is (4 replicas, N = 24, C = 16:
// -1.6 points against one router, now -1.0; one router's grids unchanged). p.mu must
// be held.
func (p *Policy) underShare(key uint64, sc *scratch) bool {
	own, all, sites := 1, 1, 0
	for i, ep := range sc.eps {
		if a := ep.active[key]; a != nil {
			own += a.requests
		}
		all += sc.loads[i] - sc.others[i]
		if sc.pos[i] >= 0 {
			sites++
		}
	}
	return sites*all < own*len(sc.eps)
}

// missCostsLess reports whether a copy of a shared prefix on candidate i, within Fill
// and past the prefix's share (underShare), is worth its miss against the hit at the
// busy holder h (CopyCost): the request's prefill there delays fewer requests' steps,
// counted in tokens, its uncached tokens at each times the requests running there plus
// itself, plus the prefill backlog it waits behind; or i is measured faster beyond
// noise (MissSpeedup), where the decode time it saves pays for the miss. With i idle
// and h holding the prefix the first is hitCostsMore. Fill alone judged such copies,
// and with KV memory to spare every busy holder's prefix was copied to every less
// loaded endpoint: the reference at 80 GiB per server, N = 24, C = 16, put a prefix on
// 4.58 servers for a cached-token ratio of 0.464 against kv's 3.08 and 0.593 (now 2.00
// and 0.686; N = 7, C = 16 0.707 -> 0.782, kv 0.775; docs/results-workloads.md,
// held-out). Loads alone, without the faster endpoint, kept 0.757 at N = 24 but lost
// 80 GiB N = 7, C = 8 throughput (12.1 -> 11.2 requests/s, kv 11.5): copies let the
// full-speed servers take requests from the 0.7-speed ones. The backlog is counted
// over the same requests as the loads, router replicas' included (sc.otherPrefill):
// with peers' requests but this router's backlog only, a holder running a peer's
// 2,371-token miss in prefill looked to start the hit at once, and the copy one router
// makes there was refused (4 replicas, N = 24, C = 16, seed 8, at a replica's 5th pick:
// 0.654 -> 0.665; the cell's median of 9 -1.02 -> -0.8 points against one router).
// With costOnly (evenShare) only the cost judges. p.mu must be held.
func (p *Policy) missCostsLess(sc *scratch, i, h int, costOnly bool) bool {
	n := len(sc.keys) * sc.blockSize
	ui := max(0, n-sc.lead[i]*sc.blockSize)
	uh := max(0, n-sc.lead[h]*sc.blockSize)
	if ui*(sc.loads[i]+1)+sc.eps[i].prefill+sc.otherPrefill[i] < uh*(sc.loads[h]+1)+sc.eps[h].prefill+sc.otherPrefill[h] {
		return true
	}
	return !costOnly && sc.decode[i] > 0 && sc.decode[h] > 0 && sc.decode[i] < p.cfg.MissSpeedup*sc.decode[h]
}

// evenShare reports whether the prefix is on at least its even share of the endpoints,
// its share of the requests routed since it was first seen times the endpoints (to the
// nearest whole endpoint, at least one), in a fleet of at least two endpoints per
// placed prefix. There a further copy must pay for its miss by cost (missCostsLess,
// costOnly): neither the share of the requests in flight (underShare) nor a faster
// endpoint makes it. The share in flight is a handful of requests and swings (3 of 4 at
// one moment), and a copy once made stays, so a prefix's endpoints followed the largest
// share it ever had, not its mean: two prefixes on 4 servers took 3.5 each (kv 2.5),
// each copy a cold miss of the prefix, and the faster endpoint's clause copied the
// 0.7-speed holders' prefix onto idle full-speed servers the same way. The share since
// its first request is the mean, and rounded to whole endpoints an even split's noise
// buys no copy. Only with two endpoints or more per placed prefix: with fewer, a
// prefix's copies are what spread its requests, and both clauses buy throughput (off,
// 12 servers at N = 7 and N = 7, C = 8 at 2 and 80 GiB lost it; docs/results-workloads.md,
// "Probed axes", N = 2). p.mu must be held.
func (p *Policy) evenShare(e *prefixEntry, sc *scratch) bool {
	n := len(sc.eps)
	if 2*p.sited > n {
		return false
	}
	sites := 0
	for i := range sc.eps {
		if sc.pos[i] >= 0 {
			sites++
		}
	}
	share := float64(e.picks) / float64(p.tick-e.born+1)
	return sites >= max(1, int(math.Round(share*float64(n))))
}

// moveWorth reports whether a replica on candidate i of a prefix that grows (a
// conversation's or an agent's history: prefixEntry.grows) is worth its miss. With no other request of it in flight, the replica
// moves this one request: it takes no load off the holder h and goes stale as the
// history grows, so it must pay for itself as copyWorth's copy does (hitCostsMore).
// Within Fill such moves went unjudged, and with KV memory to spare every busy holder
// sent turns away: chat at 80 GiB per server spread a session over 2.54 servers for a
// cached-token ratio of 0.662, kv 2.02 and 0.716 (docs/results-workloads.md, held-out).
// With other requests of it in flight (agents on one context) a replica shares their
// load, and Fill alone judges it, as before. p.mu must be held.
func (p *Policy) moveWorth(e *prefixEntry, key uint64, sc *scratch, i, h int) bool {
	if !e.grows() {
		return true
	}
	for _, ep := range sc.eps {
		if ep.active[key] != nil {
			return true
		}
	}
	return hitCostsMore(e, sc, i, h)
}

// spare reports whether candidate i has room for the request and its prefix beside its
// live placements and in-flight requests: a copy there evicts nothing live. p.mu must be
// held.
func (p *Policy) spare(key uint64, cands []scoring.Endpoint, sc *scratch, i int) bool {
	ep := sc.eps[i]
	return float64(ep.placedBlocks+ep.footprint+p.need(ep, key, &cands[i], len(sc.keys), sc.out, sc.shared(ep)))+sc.otherKV[i] <= float64(p.capacity(&cands[i]))
}

// fasterCopy returns the idle candidate that takes a copy of the prefix and the
// request instead of the idle holder g, or -1; router replicas only. In a fleet of
// unequal speeds a request's time is mostly its decode, and an idle holder takes its
// prefix's requests however slow it is: with replicas, homes partition evenly over
// fast and slow endpoints (the cold-start rotation; one router's ties and rehomes go to
// the endpoints it has measured fastest), and the fast ones idle (kvbench --sim
// --replicas 4, N = 12, C = 4: the two fast endpoints of six took 36% of the requests,
// kv's replicas 40%; throughput 5.90 requests/s against kv's 5.94; with this 6.04;
// docs/results-policy.md). A candidate qualifies when g holds the prefix (the copy
// trades a hit for a miss; a prefix held nowhere misses anywhere, and rehoming places
// it), no holder is faster than g beyond noise (one fast copy per prefix), the prefix
// is a shared one that stays put (as for copyWorth: a conversation's copy goes stale),
// and the candidate is idle, does not hold it, is faster than g beyond noise (measured
// decode time under MissSpeedup of g's), holds no copy beyond its homes, would add a
// prefill that fits in one step (moveOK), and has room for the copy beside its
// placements with a request of each, the copy's included (its request's blocks past
// the prefix and the output blocks it holds), beside peers' blocks. A copy past that room, or a
// second one, is evicted by the requests of the endpoint's other prefixes and made
// again: one endpoint took five prefixes, ten misses a repetition, and N = 7, C = 4's
// TTFT p99 became a miss's (69 -> 115 ms, kv 83). Of those candidates, the fastest.
// p.mu must be held.
func (p *Policy) fasterCopy(e *prefixEntry, key uint64, cands []scoring.Endpoint, sc *scratch, g, heldBlocks int) int {
	if !p.cfg.FasterCopies || p.peers == nil || sc.decode[g] == 0 || e.branch == 0 || e.blocks > e.branch || sc.lead[g] < max(heldBlocks, 1) {
		return -1
	}
	for i := range cands {
		if sc.pos[i] >= 0 && sc.decode[i] > 0 && sc.decode[i] < p.cfg.MissSpeedup*sc.decode[g] {
			return -1 // a faster holder has it already
		}
	}
	tail := max(0, len(sc.keys)-e.blocks) + sc.out
	best := -1
	for i := range cands {
		if sc.pos[i] >= 0 || !sc.ok[i] || sc.loads[i] > 0 || sc.decode[i] == 0 ||
			sc.decode[i] >= p.cfg.MissSpeedup*sc.decode[g] || !p.moveOK(sc, i, g) {
			continue
		}
		ep := sc.eps[i]
		if ep.placedBlocks > ep.homeBlocks {
			continue
		}
		if float64(ep.placedBlocks+e.weight()+(ep.placed+1)*tail)+sc.otherKV[i] > float64(p.capacity(&cands[i])) {
			continue
		}
		if best < 0 || sc.decode[i] < sc.decode[best] {
			best = i
		}
	}
	return best
}

// heldNowhere reports whether no candidate has a block of the prefix in the index and
// no request is computing it on any (in flight from this router or a peer): the request
// misses wherever it goes. It is worked out once per pick (copyWorth asks for each idle
// candidate, and with peers each PeerActive takes the sync view's lock). p.mu must be
// held.
func (p *Policy) heldNowhere(key uint64, cands []scoring.Endpoint, sc *scratch) bool {
	if sc.nowhere == 0 {
		sc.nowhere = 1
		for i := range cands {
			if sc.lead[i] > 0 || sc.eps[i].active[key] != nil ||
				(p.peers != nil && p.peers.PeerActive(cands[i].Address, key)) {
				sc.nowhere = 2
				break
			}
		}
	}
	return sc.nowhere == 1
}

// wait ranks candidate i by the time its queue takes to drain past a new request: its
// load plus one, times its measured decode time (the mean of the measured ones when it
// has none yet). p.mu must be held.
func (p *Policy) wait(sc *scratch, i int) float64 {
	d := sc.decode[i]
	if d == 0 {
		d = sc.meanDecode
	}
	return float64(sc.loads[i]+1) * d
}

// room reports whether candidate i can start the request without waiting for KV blocks:
// its footprint, plus others (blocks other routers' requests hold), plus the request's
// blocks not already active there and the out output blocks it holds, stays within
// Headroom of its capacity. p.mu must be held.
func (p *Policy) room(ep *endpointState, key uint64, c *scoring.Endpoint, blocks, out, shared int, others float64) bool {
	capacity := float64(p.capacity(c))
	used := float64(ep.footprint) + others
	if p.cfg.ScrapedLoad && c.Metrics.Valid {
		used = max(used, c.Metrics.KVCacheUsage*capacity)
	}
	return used+float64(p.need(ep, key, c, blocks, out, shared)) <= p.cfg.Headroom*capacity
}

// need is the KV blocks the request adds at the endpoint: its blocks and out output blocks,
// less its prefix's when a request in flight there holds it, or the shared blocks an
// in-flight request of its conversation holds there (scratch.shared), whichever is
// more; for a conversation's turn on a branched prefix longer than a step, that
// prefix's blocks count as held when a request on it is in flight there (Routed
// activates a turn's parent beside it: counted in each turn, an agent's 100k-token
// context looked twice its size beside another agent's turn, short of room, and the
// turn was sent to recompute it on a cold endpoint: agent workload on 4 servers), and
// so when a peer's request on it is in flight there (its blocks are in the peer's
// load: 2 router replicas on the agent workload recomputed three 103k-token histories
// beside a peer's agent on their context, 1.91 requests/s against one router's 2.24;
// docs/results-workloads.md, "Probed axes"). p.mu must be held.
func (p *Policy) need(ep *endpointState, key uint64, c *scoring.Endpoint, blocks, out, shared int) int {
	held, parent := shared, 0
	if e := p.prefixes[key]; e != nil && e.base > 0 && e.parent != 0 && !p.fitsStep(e.base*p.blockSize(c), p.blockSize(c)) {
		if a := ep.active[e.parent]; a != nil {
			parent = min(a.blocks, e.base)
		} else if p.peers != nil && p.peers.PeerActive(c.Address, e.parent) {
			parent = e.base
		}
		held = max(held, parent)
	}
	if a := ep.active[key]; a != nil {
		held = max(held, parent+a.blocks)
	} else if p.peers != nil && p.peers.PeerActive(c.Address, key) {
		// A peer's request holds the prefix there (counted in others): only the tail.
		held = max(held, p.prefixes[key].blocks)
	}
	return blocks + out - min(held, blocks)
}
