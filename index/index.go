package index

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// numShards splits the key table so that lookups and ingestion of different keys do not
// contend on one lock. A power of two: a key's shard is its low bits.
const numShards = 64

// ErrInvalidBlocks is wrapped by Store when the blocks are malformed (block size not
// positive, token count not handles x block size). Nothing is stored.
var ErrInvalidBlocks = errors.New("index: invalid blocks")

// ErrOrphan is wrapped by Store when the blocks' parent handle is unknown for that endpoint
// rank (its BlockStored was missed or evicted). The blocks are not guessed at: nothing is
// stored, and the blocks are counted as orphans.
var ErrOrphan = errors.New("index: parent block unknown")

// Blocks is one BlockStored event's content, in the index's own, transport-free terms.
type Blocks struct {
	// Root is the key the chain starts from when HasParent is false: Root(model, lora,
	// salt) of the sequence the blocks belong to. Blocks without a parent are a chain's
	// first: lookups take a rank's block i as proof of its blocks 0..i (see
	// LeadingBlocks), which a root that stands for a block would break.
	Root uint64
	// Parent is the vLLM handle of the block just before the first one, valid when
	// HasParent. A parent handle of 0 that the rank does not hold is read as "no parent"
	// (llm-d-inference-sim sends 0 for nil).
	Parent    uint64
	HasParent bool
	// Handles are vLLM's block hashes, normalised to uint64; meaningful only per rank.
	Handles []uint64
	// Tokens holds len(Handles) x BlockSize token ids.
	Tokens    []uint32
	BlockSize int
}

// RankStats are one endpoint rank's counters, for the debug view.
type RankStats struct {
	Rank            int    `json:"rank"`
	Blocks          int    `json:"blocks"`
	Capacity        int    `json:"capacity"`
	Stored          uint64 `json:"stored"`
	Removed         uint64 `json:"removed"`
	Orphans         uint64 `json:"orphans"`
	Evicted         uint64 `json:"evicted"`
	UnknownRemovals uint64 `json:"unknown_removals"`
	Conflicts       uint64 `json:"conflicts"`
	Clears          uint64 `json:"clears"`
	// Detached counts the times the rank lost a block while it held one stored under
	// it (an order vLLM does not produce): lookups then walk its blocks one by one until
	// it is empty.
	Detached uint64 `json:"detached"`
}

// EndpointStats are one endpoint's counters, for the debug view.
type EndpointStats struct {
	Endpoint     string      `json:"endpoint"`
	NumGPUBlocks int         `json:"num_gpu_blocks"`
	Blocks       int         `json:"blocks"`
	Ranks        []RankStats `json:"ranks"`
}

type endpoint struct {
	name         string
	ranks        []*source // sorted by rank
	numGPUBlocks int       // 0 when unknown
}

type shard struct {
	mu sync.RWMutex
	t  keyTable
	_  [48]byte // keep neighbouring shards' locks off one cache line
}

// Index maps block keys to the endpoints holding them. See the package doc for the data
// layout and the concurrency guarantees. Create it with New.
type Index struct {
	cfg Config
	m   *metrics

	// mu guards endpoints, sources, freeIDs and words. Every operation holds it for
	// reading; registering, purging and widening hold it for writing. Shard and source
	// locks are taken inside it: mu, then a source's mu, then a shard's mu.
	mu        sync.RWMutex
	endpoints map[string]*endpoint
	sources   []*source // by id; nil when free
	freeIDs   []uint32
	words     int

	shards [numShards]shard

	blocks        atomic.Int64
	keys          atomic.Int64
	endpointCount atomic.Int64
	scratch       sync.Pool
}

// New returns an empty index. reg may be nil (metrics are then not registered).
func New(cfg Config, reg prometheus.Registerer) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ix := &Index{cfg: cfg, endpoints: make(map[string]*endpoint), words: 1}
	for i := range ix.shards {
		ix.shards[i].t = newKeyTable(1)
	}
	ix.m = newMetrics(reg, ix)
	return ix, nil
}

func (ix *Index) capacityFor(numGPUBlocks int) int {
	if numGPUBlocks <= 0 {
		return ix.cfg.DefaultBlocksPerRank
	}
	c := math.Ceil(float64(numGPUBlocks) * ix.cfg.Headroom)
	return int(min(c, float64(ix.cfg.MaxBlocksPerRank)))
}

// find returns the source of (endpoint, rank); ix.mu must be held.
func (ix *Index) find(name string, rank int) *source {
	e := ix.endpoints[name]
	if e == nil {
		return nil
	}
	for _, s := range e.ranks {
		if s.rank == rank {
			return s
		}
	}
	return nil
}

// addSource registers (endpoint, rank); ix.mu must be held for writing.
func (ix *Index) addSource(name string, rank int) *source {
	e := ix.endpoints[name]
	if e == nil {
		e = &endpoint{name: name}
		ix.endpoints[name] = e
		ix.endpointCount.Add(1)
	}
	var id uint32
	if n := len(ix.freeIDs); n > 0 {
		slices.Sort(ix.freeIDs)
		id = ix.freeIDs[0]
		ix.freeIDs = ix.freeIDs[1:]
	} else {
		id = uint32(len(ix.sources))
		ix.sources = append(ix.sources, nil)
	}
	if need := int(id)/64 + 1; need > ix.words {
		// No shard is in use: every shard access holds ix.mu for reading.
		for i := range ix.shards {
			ix.shards[i].t.widen(need)
		}
		ix.words = need
	}
	s := newSource(id, name, rank, ix.capacityFor(e.numGPUBlocks))
	s.stats.Rank = rank
	ix.sources[id] = s
	e.ranks = append(e.ranks, s)
	slices.SortFunc(e.ranks, func(a, b *source) int { return cmp.Compare(a.rank, b.rank) })
	return s
}

// withSource runs fn with the source of (endpoint, rank) locked and ix.mu held for
// reading, registering the source first when create is set. fn is not run for a source
// that does not exist or was purged; withSource reports whether fn ran.
func (ix *Index) withSource(name string, rank int, create bool, fn func(s *source)) bool {
	ix.mu.RLock()
	s := ix.find(name, rank)
	if s == nil && create {
		ix.mu.RUnlock()
		ix.mu.Lock()
		if ix.find(name, rank) == nil {
			ix.addSource(name, rank)
		}
		ix.mu.Unlock()
		ix.mu.RLock()
		s = ix.find(name, rank)
	}
	ran := false
	if s != nil {
		s.mu.Lock()
		if !s.dead {
			fn(s)
			ran = true
		}
		s.mu.Unlock()
	}
	ix.mu.RUnlock()
	return ran
}

// Store indexes the blocks of one BlockStored event from an endpoint's rank. Each block's
// key chains from the parent's key (Root when there is no parent) over the block's token
// ids. A handle the rank already holds gains a reference (vLLM does not deduplicate
// identical blocks) and becomes the newest. Past the rank's capacity the oldest blocks
// are dropped and counted. Errors wrap ErrInvalidBlocks or ErrOrphan; either way the
// index is unchanged.
func (ix *Index) Store(endpoint string, rank int, b Blocks) error {
	if len(b.Handles) == 0 {
		return nil
	}
	if b.BlockSize <= 0 {
		ix.m.rejected.WithLabelValues("block_size").Inc()
		return fmt.Errorf("%w: block size %d", ErrInvalidBlocks, b.BlockSize)
	}
	if len(b.Tokens) != len(b.Handles)*b.BlockSize {
		ix.m.rejected.WithLabelValues("token_count").Inc()
		return fmt.Errorf("%w: %d tokens for %d blocks of %d", ErrInvalidBlocks,
			len(b.Tokens), len(b.Handles), b.BlockSize)
	}
	var err error
	ix.withSource(endpoint, rank, true, func(s *source) {
		prev, parent := b.Root, uint32(nilRec)
		if b.HasParent {
			if r := s.lookup(b.Parent); r != nilRec {
				prev, parent = s.key[r], r
			} else if b.Parent != 0 {
				s.stats.Orphans += uint64(len(b.Handles))
				ix.m.orphans.Add(float64(len(b.Handles)))
				err = fmt.Errorf("%w: endpoint %s rank %d parent %#x (%d blocks dropped)",
					ErrOrphan, endpoint, rank, b.Parent, len(b.Handles))
				return
			}
		}
		before := s.live
		var evicted, conflicts int
		for i, h := range b.Handles {
			k := chain(prev, b.Tokens[i*b.BlockSize:(i+1)*b.BlockSize])
			prev = k
			if r := s.lookup(h); r != nilRec {
				s.setRefs(r, s.refs(r)+1)
				s.touch(r)
				if s.key[r] != k {
					// The record keeps its first key: the blocks stored under it
					// here chain from another one.
					conflicts++
					s.detach()
				}
				parent = r
				continue
			}
			for s.live >= s.capacity && s.oldest != nilRec {
				ix.dropKey(s, s.release(s.oldest))
				evicted++
			}
			if parent != nilRec && s.refs(parent) == 0 {
				// The cap evicted the block this one is stored under.
				s.detach()
				parent = nilRec
			}
			parent = s.alloc(h, k, parent)
			ix.setKey(s, k)
		}
		n := uint64(len(b.Handles))
		s.stats.Stored += n
		s.stats.Evicted += uint64(evicted)
		s.stats.Conflicts += uint64(conflicts)
		ix.blocks.Add(int64(s.live - before))
		ix.m.stored.Add(float64(n))
		if evicted > 0 {
			ix.m.evicted.Add(float64(evicted))
		}
		if conflicts > 0 {
			ix.m.conflicts.Add(float64(conflicts))
		}
	})
	return err
}

// Remove drops one reference to each handle for an endpoint's rank (one BlockRemoved
// event); a block goes when its last reference does. Unknown handles are counted and
// skipped.
func (ix *Index) Remove(endpoint string, rank int, handles []uint64) {
	if len(handles) == 0 {
		return
	}
	ran := ix.withSource(endpoint, rank, false, func(s *source) {
		before := s.live
		var removed, unknown int
		for _, h := range handles {
			r := s.lookup(h)
			if r == nilRec {
				unknown++
				continue
			}
			removed++
			if n := s.refs(r) - 1; n > 0 {
				s.setRefs(r, n)
			} else {
				ix.dropKey(s, s.release(r))
			}
		}
		s.stats.Removed += uint64(removed)
		s.stats.UnknownRemovals += uint64(unknown)
		ix.blocks.Add(int64(s.live - before))
		ix.m.removed.Add(float64(removed))
		if unknown > 0 {
			ix.m.unknownRemovals.Add(float64(unknown))
		}
	})
	if !ran { // removals for a rank never seen are all unknown
		ix.m.unknownRemovals.Add(float64(len(handles)))
	}
}

// Clear drops every block of an endpoint's rank (AllBlocksCleared, a sequence gap that
// could not be replayed, a publisher restart). The rank stays registered.
func (ix *Index) Clear(endpoint string, rank int) {
	ix.withSource(endpoint, rank, false, func(s *source) {
		ix.clearSource(s)
		s.stats.Clears++
		ix.m.clears.Inc()
	})
}

// clearSource drops every record of s; s.mu and ix.mu (read) must be held.
func (ix *Index) clearSource(s *source) {
	for r := s.oldest; r != nilRec; r = s.next(r) {
		ix.dropKey(s, s.key[r])
	}
	ix.blocks.Add(-int64(s.live))
	s.reset()
}

// Purge forgets an endpoint that left the fleet: all its ranks' blocks, counters and
// capacity. Lookups are blocked only while the endpoint is unregistered, not while its
// blocks are dropped. A later Store registers the endpoint afresh.
func (ix *Index) Purge(endpoint string) {
	ix.mu.Lock()
	e := ix.endpoints[endpoint]
	if e == nil {
		ix.mu.Unlock()
		return
	}
	delete(ix.endpoints, endpoint)
	ix.endpointCount.Add(-1)
	ix.mu.Unlock()

	ix.mu.RLock()
	for _, s := range e.ranks {
		s.mu.Lock()
		ix.clearSource(s)
		s.dead = true
		s.mu.Unlock()
	}
	ix.mu.RUnlock()

	ix.mu.Lock()
	for _, s := range e.ranks {
		ix.sources[s.id] = nil
		ix.freeIDs = append(ix.freeIDs, s.id)
	}
	ix.mu.Unlock()
	ix.m.purges.Inc()
}

// SetCapacity records an endpoint's num_gpu_blocks (per rank, as vLLM reports it) and
// caps each of its ranks at num_gpu_blocks x Headroom (at most MaxBlocksPerRank; the
// default cap when numGPUBlocks <= 0), dropping the oldest blocks of a rank over its new
// cap. It registers the endpoint if needed.
func (ix *Index) SetCapacity(name string, numGPUBlocks int) {
	ix.mu.Lock()
	e := ix.endpoints[name]
	if e == nil {
		e = &endpoint{name: name}
		ix.endpoints[name] = e
		ix.endpointCount.Add(1)
	}
	e.numGPUBlocks = max(numGPUBlocks, 0)
	ranks := slices.Clone(e.ranks)
	ix.mu.Unlock()

	c := ix.capacityFor(numGPUBlocks)
	for _, s := range ranks {
		ix.withSource(name, s.rank, false, func(s *source) {
			s.capacity = c
			before, evicted := s.live, 0
			for s.live > s.capacity {
				ix.dropKey(s, s.release(s.oldest))
				evicted++
			}
			s.stats.Evicted += uint64(evicted)
			ix.blocks.Add(int64(s.live - before))
			if evicted > 0 {
				ix.m.evicted.Add(float64(evicted))
			}
		})
	}
}

// setKey marks s as holding k; s.mu and ix.mu (read) must be held.
func (ix *Index) setKey(s *source, k uint64) {
	sh := &ix.shards[k&(numShards-1)]
	sh.mu.Lock()
	before := sh.t.count
	already := sh.t.set(k, s.id)
	added := sh.t.count - before
	sh.mu.Unlock()
	if added != 0 {
		ix.keys.Add(1)
	}
	if already {
		if s.dups == nil {
			s.dups = make(map[uint64]uint32)
		}
		s.dups[k]++
	}
}

// dropKey releases one record's hold of k; s.mu and ix.mu (read) must be held.
func (ix *Index) dropKey(s *source, k uint64) {
	if n := s.dups[k]; n > 0 {
		if n == 1 {
			delete(s.dups, k)
		} else {
			s.dups[k] = n - 1
		}
		return
	}
	sh := &ix.shards[k&(numShards-1)]
	sh.mu.Lock()
	before := sh.t.count
	sh.t.clear(k, s.id)
	removed := before - sh.t.count
	sh.mu.Unlock()
	if removed != 0 {
		ix.keys.Add(-1)
	}
}

type scratch struct {
	alive, next, clean []uint64
	sets               []uint64 // searchClean's stack of source sets, words each
	frames             []frame
	depth              []int32
	eps                []*endpoint
}

// frame is one step of searchClean: the sources of sets[off:off+words] hold keys[:lo]
// and not keys[hi] (hi < len(keys)).
type frame struct {
	lo, hi int32
	off    int
}

// LeadingBlocks reports, for each of endpoints, how many of keys' leading blocks it holds:
// dst[i] is the largest n such that endpoints[i] holds keys[0:n] (0 for an unknown
// endpoint). An endpoint with several data-parallel ranks scores the best of its ranks:
// each rank's cache is separate and vLLM, not the router, picks the rank, so the endpoint
// can serve the request from its best rank but is not promised it. dst is reused when
// large enough and returned.
//
// Cost: a rank none of whose blocks has lost its parent (vLLM's order: see source)
// holds block i only with blocks 0..i, so its count is found by bisection, the ranks
// that agree sharing each probe: one probe of the first key, then about log2(len(keys))
// per distinct count (13 for a 128k-token prompt's 8,000 blocks). Any other rank is walked: one probe per key
// until none of them holds the next key. A probe is one shard read-lock and one lookup,
// whatever the number of endpoints.
func (ix *Index) LeadingBlocks(keys []uint64, endpoints []string, dst []int) []int {
	dst = slices.Grow(dst[:0], len(endpoints))[:len(endpoints)]
	clear(dst)
	if len(keys) == 0 || len(endpoints) == 0 {
		return dst
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	sc, _ := ix.scratch.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	defer ix.scratch.Put(sc)
	w := ix.words
	sc.alive = slices.Grow(sc.alive[:0], w)[:w]
	sc.next = slices.Grow(sc.next[:0], w)[:w]
	sc.clean = slices.Grow(sc.clean[:0], w)[:w]
	sc.depth = slices.Grow(sc.depth[:0], len(ix.sources))[:len(ix.sources)]
	sc.eps = sc.eps[:0]
	clear(sc.alive)
	clear(sc.clean)
	alive, next, depth := sc.alive, sc.next, sc.depth
	walk, search := false, false
	for _, name := range endpoints {
		e := ix.endpoints[name]
		sc.eps = append(sc.eps, e)
		if e == nil {
			continue
		}
		for _, s := range e.ranks {
			if s.detached.Load() {
				alive[s.id/64] |= 1 << (s.id % 64)
				walk = true
			} else {
				sc.clean[s.id/64] |= 1 << (s.id % 64)
				search = true
			}
		}
	}
	if search {
		ix.searchClean(keys, sc)
	}
	n := int32(len(keys))
	for i, k := range keys {
		if !walk {
			break
		}
		sh := &ix.shards[k&(numShards-1)]
		sh.mu.RLock()
		if slot := sh.t.find(k); slot < 0 {
			clear(next)
		} else {
			m := sh.t.mask(slot)
			for j := range next {
				next[j] = alive[j] & m[j]
			}
		}
		sh.mu.RUnlock()
		left := false
		for j := range alive {
			for gone := alive[j] &^ next[j]; gone != 0; gone &= gone - 1 {
				depth[j*64+bits.TrailingZeros64(gone)] = int32(i)
			}
			alive[j] = next[j]
			left = left || next[j] != 0
		}
		walk = left
	}
	for j := range alive {
		for a := alive[j]; a != 0; a &= a - 1 {
			depth[j*64+bits.TrailingZeros64(a)] = n
		}
	}
	for i, e := range sc.eps {
		if e == nil {
			continue
		}
		best := int32(0)
		for _, s := range e.ranks {
			best = max(best, depth[s.id])
		}
		dst[i] = int(best)
	}
	return dst
}

// searchClean sets sc.depth of every rank in sc.clean, ranks whose chains have no gap:
// by bisection over keys, each probe splitting the ranks whose count lies in [lo, hi]
// into those holding keys[mid] (count in [mid+1, hi]) and the others ([lo, mid]). A rank
// that is detached since the caller read it clean still gets a count it held during
// the lookup: each block it was seen holding was stored under its parent, held then
// or when the lookup began.
func (ix *Index) searchClean(keys []uint64, sc *scratch) {
	w := len(sc.clean)
	sc.sets = append(sc.sets[:0], sc.clean...)
	sc.frames = append(sc.frames[:0], frame{lo: 0, hi: int32(len(keys)), off: 0})
	for len(sc.frames) > 0 {
		f := sc.frames[len(sc.frames)-1]
		sc.frames = sc.frames[:len(sc.frames)-1]
		if f.lo == f.hi {
			for j, word := range sc.sets[f.off : f.off+w] {
				for ; word != 0; word &= word - 1 {
					sc.depth[j*64+bits.TrailingZeros64(word)] = f.lo
				}
			}
			sc.sets = sc.sets[:f.off] // the top of the stack: its set is done
			continue
		}
		mid := f.lo + (f.hi-f.lo)/2
		if f.lo == 0 {
			mid = 0 // a request most ranks hold none of is told in one probe, as by a walk
		}
		k := keys[mid]
		// The set splits in place into those not holding keys[mid] (kept at f.off) and
		// those holding it (pushed above).
		yes := len(sc.sets)
		sc.sets = append(sc.sets, sc.sets[f.off:f.off+w]...)
		sh := &ix.shards[k&(numShards-1)]
		sh.mu.RLock()
		if slot := sh.t.find(k); slot < 0 {
			clear(sc.sets[yes:])
		} else {
			m := sh.t.mask(slot)
			for j := range w {
				sc.sets[yes+j] &= m[j]
				sc.sets[f.off+j] &^= m[j]
			}
		}
		sh.mu.RUnlock()
		held, missed := false, false
		for j := range w {
			held = held || sc.sets[yes+j] != 0
			missed = missed || sc.sets[f.off+j] != 0
		}
		switch {
		case held && missed:
			sc.frames = append(sc.frames, frame{lo: f.lo, hi: mid, off: f.off}, frame{lo: mid + 1, hi: f.hi, off: yes})
		case held:
			copy(sc.sets[f.off:], sc.sets[yes:yes+w])
			sc.sets = sc.sets[:f.off+w]
			sc.frames = append(sc.frames, frame{lo: mid + 1, hi: f.hi, off: f.off})
		default:
			sc.sets = sc.sets[:f.off+w]
			sc.frames = append(sc.frames, frame{lo: f.lo, hi: mid, off: f.off})
		}
	}
}

// Stats returns every endpoint's counters, sorted by endpoint.
func (ix *Index) Stats() []EndpointStats {
	ix.mu.RLock()
	eps := make([]*endpoint, 0, len(ix.endpoints))
	for _, e := range ix.endpoints {
		eps = append(eps, e)
	}
	out := make([]EndpointStats, 0, len(eps))
	for _, e := range eps {
		es := EndpointStats{Endpoint: e.name, NumGPUBlocks: e.numGPUBlocks}
		for _, s := range e.ranks {
			s.mu.Lock()
			rs := s.stats
			rs.Blocks, rs.Capacity = s.live, s.capacity
			s.mu.Unlock()
			es.Blocks += rs.Blocks
			es.Ranks = append(es.Ranks, rs)
		}
		out = append(out, es)
	}
	ix.mu.RUnlock()
	slices.SortFunc(out, func(a, b EndpointStats) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	return out
}

// Len returns the number of blocks held, summed over endpoint ranks, and the number of
// distinct keys.
func (ix *Index) Len() (blocks, keys int) {
	return int(ix.blocks.Load()), int(ix.keys.Load())
}
