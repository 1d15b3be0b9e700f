package scoring

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// kvCore is the state shared by the kv and approximate policies: the load each endpoint
// carries from the requests they routed, the predicted caches, and the cost.
type kvCore struct {
	cfg     KVConfig
	ix      PrefixIndex // nil: every overlap is predicted
	health  EventHealth // nil: every endpoint's events are trusted
	batch   EventHealthSnapshot
	predict bool // keep a predicted cache per endpoint
	keyBufs keyPool
	// costHook, when set (tests only, see export_test.go), sees every pick's costs.
	costHook func(cands []Endpoint, costs []float64)
	m        *kvMetrics
	scratch  sync.Pool

	mu      sync.Mutex
	rng     *rand.Rand
	eps     map[string]*kvEndpoint
	reqs    map[string]*kvRequest
	pending map[string]*kvPending
	// active maps each block key of an in-flight request to its entry in held: the
	// endpoints whose in-flight requests hold it (usually one; several when a prefix is
	// in flight on several endpoints at once), so that a pick counts the request's
	// already-active blocks on every candidate with one map lookup per block, and
	// routing or finishing a request costs one map lookup per block and allocates
	// nothing once held has grown. freeHeld lists held's unused entries.
	active   map[uint64]int32
	held     []kvHeld
	freeHeld []int32
	stamp    uint64
	pendings sync.Pool // *kvPending, recycled once Routed or Finished consumed them
}

type kvEndpoint struct {
	prefillTokens int // uncached prompt tokens of in-flight requests before their first token
	activeBlocks  int // distinct block keys of in-flight requests
	requests      int
	blockSize     int
	lru           *blockLRU // nil unless predicting
	shared        int       // scratch for pick, valid when sharedStamp is the pick's stamp
	sharedStamp   uint64
}

type kvHolder struct {
	ep *kvEndpoint
	n  int32
}

type kvRequest struct {
	ep          *kvEndpoint
	keys        []uint64
	prefill     int
	prefillDone bool
}

// kvPending is what a pick learned, kept until Routed says which candidate was used.
type kvPending struct {
	isl       int
	endpoints []string
	overlaps  []int
	sizes     []int
	keys      []kvKeys
}

type kvKeys struct {
	blockSize int
	keys      []uint64
}

type kvScratch struct {
	predicted []bool
	sizes     []int
	overlaps  []int
	costs     []float64
	names     []string
	pos       []int
	lead      []int
	probs     []float64
	eps       []*kvEndpoint
}

type kvMetrics struct {
	untokenized prometheus.Counter
	predicted   prometheus.Counter
	dropped     prometheus.Counter
	blocks      prometheus.Counter
	matched     prometheus.Counter
}

func newKVMetrics(policy string, reg prometheus.Registerer) *kvMetrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{
			Name: name, Help: help, ConstLabels: prometheus.Labels{"policy": policy},
		})
	}
	m := &kvMetrics{
		untokenized: c("kvrouter_scoring_untokenized_requests_total", "Requests without token ids, scored by load alone."),
		predicted:   c("kvrouter_scoring_predicted_overlaps_total", "Candidate overlaps taken from the predicted cache because the endpoint's KV events were not healthy (kv) or by design (approximate)."),
		dropped:     c("kvrouter_scoring_dropped_requests_total", "Tracked requests dropped, oldest state first, because max_tracked was reached."),
		blocks:      c("kvrouter_scoring_routed_blocks_total", "Full prompt blocks of routed requests."),
		matched:     c("kvrouter_scoring_matched_blocks_total", "Of those, the leading blocks the chosen endpoint held (or was predicted to hold) at the pick."),
	}
	if reg != nil {
		reg.MustRegister(m.untokenized, m.predicted, m.dropped, m.blocks, m.matched)
	}
	return m
}

func newKVCore(policy string, cfg KVConfig, ix PrefixIndex, health EventHealth, predict bool,
	src rand.Source, reg prometheus.Registerer) (*kvCore, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("scoring: %s config: %w", policy, err)
	}
	if src == nil {
		src = rand.NewPCG(rand.Uint64(), rand.Uint64())
	}
	batch, _ := health.(EventHealthSnapshot)
	return &kvCore{
		cfg: cfg, ix: ix, health: health, batch: batch, predict: predict,
		m:       newKVMetrics(policy, reg),
		rng:     rand.New(src),
		eps:     make(map[string]*kvEndpoint),
		reqs:    make(map[string]*kvRequest),
		pending: make(map[string]*kvPending),
		active:  make(map[uint64]int32),
	}, nil
}

// kvHeld is the endpoints holding one in-flight block key.
type kvHeld struct {
	first kvHolder
	more  []kvHolder
}

// holders calls f for every endpoint whose in-flight requests hold key k; c.mu must be
// held.
func (c *kvCore) holders(k uint64, f func(kvHolder)) {
	i, ok := c.active[k]
	if !ok {
		return
	}
	h := &c.held[i]
	f(h.first)
	for _, m := range h.more {
		f(m)
	}
}

// hold adds one in-flight reference to key k on ep; c.mu must be held.
func (c *kvCore) hold(k uint64, ep *kvEndpoint) {
	i, ok := c.active[k]
	if !ok {
		if n := len(c.freeHeld); n > 0 {
			i = c.freeHeld[n-1]
			c.freeHeld = c.freeHeld[:n-1]
		} else {
			i = int32(len(c.held))
			c.held = append(c.held, kvHeld{})
		}
		c.held[i].first = kvHolder{ep, 1}
		c.active[k] = i
		ep.activeBlocks++
		return
	}
	h := &c.held[i]
	if h.first.ep == ep {
		h.first.n++
		return
	}
	if j := slices.IndexFunc(h.more, func(m kvHolder) bool { return m.ep == ep }); j >= 0 {
		h.more[j].n++
		return
	}
	h.more = append(h.more, kvHolder{ep, 1})
	ep.activeBlocks++
}

// unhold drops one in-flight reference to key k on ep; c.mu must be held.
func (c *kvCore) unhold(k uint64, ep *kvEndpoint) {
	i, ok := c.active[k]
	if !ok {
		return
	}
	h := &c.held[i]
	if h.first.ep == ep {
		if h.first.n--; h.first.n > 0 {
			return
		}
		ep.activeBlocks--
		last := len(h.more) - 1
		if last < 0 {
			h.first = kvHolder{}
			delete(c.active, k)
			c.freeHeld = append(c.freeHeld, i)
			return
		}
		h.first, h.more[last] = h.more[last], kvHolder{}
		h.more = h.more[:last]
		return
	}
	j := slices.IndexFunc(h.more, func(m kvHolder) bool { return m.ep == ep })
	if j < 0 {
		return
	}
	if h.more[j].n--; h.more[j].n > 0 {
		return
	}
	ep.activeBlocks--
	last := len(h.more) - 1
	h.more[j], h.more[last] = h.more[last], kvHolder{}
	h.more = h.more[:last]
}

// newPending returns a cleared kvPending with room for n candidates.
func (c *kvCore) newPending(isl, n int) *kvPending {
	p, _ := c.pendings.Get().(*kvPending)
	if p == nil {
		p = &kvPending{}
	}
	p.isl = isl
	p.endpoints = slices.Grow(p.endpoints[:0], n)[:n]
	p.overlaps = slices.Grow(p.overlaps[:0], n)[:n]
	p.sizes = slices.Grow(p.sizes[:0], n)[:n]
	p.keys = p.keys[:0]
	return p
}

// recycle returns p and its key slices to their pools; routed takes out (sets to nil)
// the key slice a routed request keeps.
func (c *kvCore) recycle(p *kvPending) {
	if p == nil {
		return
	}
	for _, k := range p.keys {
		c.keyBufs.put(k.keys)
	}
	if cap(p.endpoints) > 4096 {
		return
	}
	clear(p.endpoints)
	clear(p.keys)
	p.keys = p.keys[:0]
	c.pendings.Put(p)
}

func (c *kvCore) blockSize(e *Endpoint) int {
	if e.Metrics.Valid && e.Metrics.BlockSize > 0 {
		return e.Metrics.BlockSize
	}
	return c.cfg.BlockSize
}

func (c *kvCore) capacity(e *Endpoint) int {
	if e.Metrics.Valid && e.Metrics.NumGPUBlocks > 0 {
		return e.Metrics.NumGPUBlocks
	}
	return c.cfg.ApproxBlocks
}

// endpoint returns the state of addr, creating it; c.mu must be held.
func (c *kvCore) endpoint(addr string) *kvEndpoint {
	ep := c.eps[addr]
	if ep == nil {
		ep = &kvEndpoint{blockSize: c.cfg.BlockSize}
		if c.predict {
			ep.lru = newBlockLRU(c.cfg.ApproxBlocks)
		}
		c.eps[addr] = ep
	}
	return ep
}

func keysFor(all []kvKeys, blockSize int) []uint64 {
	for _, k := range all {
		if k.blockSize == blockSize {
			return k.keys
		}
	}
	return nil
}

func (c *kvCore) pick(req *Request, cands []Endpoint) (Decision, error) {
	if len(cands) == 0 {
		return Decision{}, ErrNoCandidates
	}
	sc, _ := c.scratch.Get().(*kvScratch)
	if sc == nil {
		sc = &kvScratch{}
	}
	defer c.scratch.Put(sc)
	n := len(cands)
	sc.sizes = slices.Grow(sc.sizes[:0], n)[:n]
	sc.overlaps = slices.Grow(sc.overlaps[:0], n)[:n]
	sc.costs = slices.Grow(sc.costs[:0], n)[:n]
	sc.eps = slices.Grow(sc.eps[:0], n)[:n]
	clear(sc.overlaps)

	tokenized := req.TokenIDs != nil
	var p *kvPending
	predicted := sc.predicted[:0]
	if tokenized {
		p = c.newPending(len(req.TokenIDs), n)
		for i := range cands {
			bs := c.blockSize(&cands[i])
			sc.sizes[i] = bs
			if !slices.ContainsFunc(p.keys, func(k kvKeys) bool { return k.blockSize == bs }) {
				p.keys = append(p.keys, kvKeys{bs, req.Keys(bs, c.keyBufs.get(len(req.TokenIDs)/bs))})
			}
		}
		predicted = slices.Grow(predicted, n)[:n]
		sc.predicted = predicted
		c.predicted(cands, predicted)
		if c.ix != nil {
			c.lookup(cands, sc, p.keys, predicted)
		}
	}

	c.mu.Lock()
	c.stamp++
	for i := range cands {
		ep := c.endpoint(cands[i].Address)
		sc.eps[i] = ep
		if tokenized {
			ep.blockSize = sc.sizes[i]
		}
		if ep.lru != nil {
			if capacity := c.capacity(&cands[i]); capacity != ep.lru.cap {
				ep.lru.resize(capacity)
			}
		}
	}
	if tokenized {
		var npred int
		for i, ep := range sc.eps {
			if predicted[i] && ep.lru != nil {
				sc.overlaps[i] = ep.lru.leading(keysFor(p.keys, sc.sizes[i]))
				npred++
			}
			ep.shared, ep.sharedStamp = 0, c.stamp
		}
		if npred > 0 {
			c.m.predicted.Add(float64(npred))
		}
		for _, g := range p.keys {
			for _, k := range g.keys {
				i, ok := c.active[k]
				if !ok {
					// Keys chain: an in-flight request holding a later key holds this one.
					break
				}
				h := &c.held[i]
				if ep := h.first.ep; ep.sharedStamp == c.stamp && ep.blockSize == g.blockSize {
					ep.shared++
				}
				for _, m := range h.more {
					if m.ep.sharedStamp == c.stamp && m.ep.blockSize == g.blockSize {
						m.ep.shared++
					}
				}
			}
		}
		for i, ep := range sc.eps {
			bs := float64(sc.sizes[i])
			prefill := float64(ep.prefillTokens+p.isl)/bs - c.cfg.OverlapCredit*float64(sc.overlaps[i])
			newBlocks := len(keysFor(p.keys, sc.sizes[i])) - ep.shared
			sc.costs[i] = c.cfg.PrefillLoadScale*max(0, prefill) +
				float64(ep.activeBlocks+newBlocks) +
				c.cfg.DecodeActiveRequestWeight*float64(ep.requests)
		}
	} else {
		c.m.untokenized.Inc()
		for i, ep := range sc.eps {
			sc.costs[i] = c.cfg.PrefillLoadScale*float64(ep.prefillTokens)/float64(ep.blockSize) +
				float64(ep.activeBlocks) + c.cfg.DecodeActiveRequestWeight*float64(ep.requests)
		}
	}
	best := c.choose(sc, tokenized)
	if c.costHook != nil {
		c.costHook(cands, sc.costs)
	}
	if tokenized {
		for i := range cands {
			p.endpoints[i] = cands[i].Address
		}
		copy(p.overlaps, sc.overlaps)
		copy(p.sizes, sc.sizes)
		if old, ok := c.pending[req.ID]; ok {
			c.recycle(old)
		} else if len(c.pending) >= c.cfg.MaxTracked {
			for id, old := range c.pending { // any one: Go's map order is random
				delete(c.pending, id)
				c.recycle(old)
				c.m.dropped.Inc()
				break
			}
		}
		c.pending[req.ID] = p
	}
	c.mu.Unlock()
	d := c.decision(cands, sc, best)
	d.Kind = kvKind(tokenized, sc.overlaps[best])
	return d, nil
}

// kvKind is the kind of a kv or approximate decision for a request (tokenized or not)
// whose chosen endpoint holds overlap of its leading blocks.
func kvKind(tokenized bool, overlap int) string {
	switch {
	case !tokenized:
		return KindUntokenized
	case overlap > 0:
		return KindHit
	default:
		return KindLoad
	}
}

// decision builds the answer: best first, then up to MaxFallbacks others by rising cost
// (earlier candidates first among equals). It leaves Scores nil: Explain has the costs.
func (c *kvCore) decision(cands []Endpoint, sc *kvScratch, best int) Decision {
	d := Decision{Endpoint: cands[best].Address}
	var top [MaxFallbacks]int
	k := 0
	for i := range cands {
		if i == best {
			continue
		}
		// Insert i into top[:k], kept sorted by cost (stable: earlier candidates first).
		j := min(k, MaxFallbacks-1)
		if k == MaxFallbacks && sc.costs[i] >= sc.costs[top[j]] {
			continue
		}
		for j > 0 && sc.costs[i] < sc.costs[top[j-1]] {
			top[j] = top[j-1]
			j--
		}
		top[j] = i
		k = min(k+1, MaxFallbacks)
	}
	if k > 0 {
		d.Fallbacks = make([]string, k)
		for j := range k {
			d.Fallbacks[j] = cands[top[j]].Address
		}
	}
	return d
}

// predicted sets predicted[i] when candidate i's overlap must be predicted: always
// without an index, else when its events are not healthy (one snapshot for all the
// candidates when the health view offers it).
func (c *kvCore) predicted(cands []Endpoint, predicted []bool) {
	switch {
	case c.ix == nil:
		for i := range predicted {
			predicted[i] = true
		}
	case c.health == nil:
		clear(predicted)
	case c.batch != nil:
		c.batch.EventsHealthyAll(cands, predicted)
		for i, ok := range predicted {
			predicted[i] = !ok
		}
	default:
		for i := range cands {
			predicted[i] = !c.health.EventsHealthy(cands[i].Address)
		}
	}
}

// lookup fills sc.overlaps from the index for the candidates not predicted, one index
// call per block size.
func (c *kvCore) lookup(cands []Endpoint, sc *kvScratch, keys []kvKeys, predicted []bool) {
	for _, g := range keys {
		sc.names, sc.pos = sc.names[:0], sc.pos[:0]
		for i := range cands {
			if sc.sizes[i] == g.blockSize && !predicted[i] {
				sc.names = append(sc.names, cands[i].Address)
				sc.pos = append(sc.pos, i)
			}
		}
		if len(sc.names) == 0 || len(g.keys) == 0 {
			continue
		}
		sc.lead = c.ix.LeadingBlocks(g.keys, sc.names, sc.lead)
		for j, i := range sc.pos {
			sc.overlaps[i] = sc.lead[j]
		}
	}
}

// choose returns the index of the chosen candidate; c.mu must be held (for c.rng).
func (c *kvCore) choose(sc *kvScratch, tokenized bool) int {
	costs := sc.costs
	if c.cfg.Temperature > 0 {
		lo, hi := slices.Min(costs), slices.Max(costs)
		if hi > lo {
			sc.probs = slices.Grow(sc.probs[:0], len(costs))[:len(costs)]
			var sum float64
			for i, x := range costs {
				sc.probs[i] = math.Exp(-(x - lo) / (hi - lo) / c.cfg.Temperature)
				sum += sc.probs[i]
			}
			u := c.rng.Float64() * sum
			for i, p := range sc.probs {
				if u -= p; u < 0 {
					return i
				}
			}
			return len(costs) - 1
		}
	}
	best, ties := 0, 0
	for i, x := range costs {
		switch {
		case x < costs[best] || i == 0:
			best, ties = i, 1
		case x == costs[best]:
			// Without token ids, fewer requests wins before chance does.
			if !tokenized && sc.eps[i].requests != sc.eps[best].requests {
				if sc.eps[i].requests < sc.eps[best].requests {
					best, ties = i, 1
				}
				continue
			}
			ties++
			if c.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

func (c *kvCore) routed(req *Request, addr string) {
	c.mu.Lock()
	if _, dup := c.reqs[req.ID]; dup {
		c.mu.Unlock()
		return
	}
	p := c.pending[req.ID]
	delete(c.pending, req.ID)
	ep := c.endpoint(addr)
	bs := ep.blockSize
	c.mu.Unlock()
	defer c.recycle(p)

	var keys []uint64
	overlap, known := 0, false
	if p != nil {
		if i := slices.Index(p.endpoints, addr); i >= 0 {
			overlap, bs, known = p.overlaps[i], p.sizes[i], true
			for j := range p.keys {
				if p.keys[j].blockSize == bs {
					keys, p.keys[j].keys = p.keys[j].keys, nil // the request keeps them
					break
				}
			}
		}
	}
	predicted := false
	if !known {
		predicted = c.ix == nil || (c.health != nil && !c.health.EventsHealthy(addr))
	}
	if !known && req.TokenIDs != nil {
		keys = req.Keys(bs, nil)
		if !predicted {
			overlap = c.ix.LeadingBlocks(keys, []string{addr}, nil)[0]
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.reqs[req.ID]; dup {
		return
	}
	if len(c.reqs) >= c.cfg.MaxTracked {
		for id := range c.reqs {
			c.release(id)
			c.m.dropped.Inc()
			break
		}
	}
	if !known && predicted && ep.lru != nil {
		overlap = ep.lru.leading(keys)
	}
	r := &kvRequest{ep: ep, keys: keys, prefill: max(0, len(req.TokenIDs)-overlap*bs)}
	c.reqs[req.ID] = r
	ep.requests++
	ep.prefillTokens += r.prefill
	for _, k := range keys {
		c.hold(k, ep)
	}
	if ep.lru != nil {
		ep.lru.add(keys)
	}
	c.m.blocks.Add(float64(len(keys)))
	c.m.matched.Add(float64(overlap))
}

// moved moves a tracked request to addr: its request count, its prefill estimate (the
// one made at Routed: the proxy retried it there before any first token) and its blocks
// in flight, which also go into addr's predicted cache. Keys of another block size than
// addr's are dropped: they name nothing there.
func (c *kvCore) moved(id, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.reqs[id]
	if r == nil {
		return
	}
	from, to := r.ep, c.endpoint(addr)
	if from == to {
		return
	}
	from.requests--
	to.requests++
	if !r.prefillDone {
		from.prefillTokens -= r.prefill
		to.prefillTokens += r.prefill
	}
	for _, k := range r.keys {
		c.unhold(k, from)
	}
	if to.blockSize != from.blockSize {
		c.keyBufs.put(r.keys)
		r.keys = nil
	}
	for _, k := range r.keys {
		c.hold(k, to)
	}
	if to.lru != nil {
		to.lru.add(r.keys)
	}
	r.ep = to
}

func (c *kvCore) firstToken(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.reqs[id]; r != nil && !r.prefillDone {
		r.prefillDone = true
		r.ep.prefillTokens -= r.prefill
	}
}

func (c *kvCore) finished(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pending[id]; ok {
		delete(c.pending, id)
		c.recycle(p)
	}
	c.release(id)
}

// release forgets a tracked request and its load; c.mu must be held.
func (c *kvCore) release(id string) {
	r := c.reqs[id]
	if r == nil {
		return
	}
	delete(c.reqs, id)
	ep := r.ep
	if !r.prefillDone {
		ep.prefillTokens -= r.prefill
	}
	ep.requests--
	for _, k := range r.keys {
		c.unhold(k, ep)
	}
	c.keyBufs.put(r.keys)
}

// keyPool recycles the block-key slices of picks and routed requests, so that a
// request's keys are not a fresh allocation each time.
type keyPool struct {
	mu   sync.Mutex
	free [][]uint64
}

// Bounds on what keyPool keeps: slices, and the keys of one slice (64k tokens of 16).
const (
	maxFreeKeySlices = 1024
	maxPooledKeys    = 4096
)

// get returns an empty slice with room for at least n keys.
func (kp *keyPool) get(n int) []uint64 {
	kp.mu.Lock()
	var k []uint64
	if last := len(kp.free) - 1; last >= 0 {
		k, kp.free[last] = kp.free[last], nil
		kp.free = kp.free[:last]
	}
	kp.mu.Unlock()
	return slices.Grow(k[:0], n)
}

// put gives k back; its owner must not use it again.
func (kp *keyPool) put(k []uint64) {
	if k == nil || cap(k) > maxPooledKeys {
		return
	}
	kp.mu.Lock()
	if len(kp.free) < maxFreeKeySlices {
		kp.free = append(kp.free, k)
	}
	kp.mu.Unlock()
}

func (c *kvCore) forget(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.eps, addr)
}
