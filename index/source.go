package index

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// nilRec marks the absence of a record in links and free lists; record numbers stay below
// it (Config.MaxBlocksPerRank <= maxRecords).
const nilRec = linkMask

// A record's meta word packs its links and reference count: prev in bits 0-22, next in
// bits 23-45, refs in bits 46-63 (saturating at maxRefs).
const (
	linkBits  = 23
	linkMask  = 1<<linkBits - 1
	refsShift = 2 * linkBits
	maxRefs   = 1<<(64-refsShift) - 1
)

// source is the state of one (endpoint, data-parallel rank): the blocks it reported, as
// records in a slab of parallel slices, found by vLLM handle through an open-addressing
// table of record numbers, and linked oldest-to-newest for eviction. Its bit in the key
// table (id) is set for every key one of its records holds; dups counts the records beyond
// the first that hold the same key, so the bit is cleared only with the last of them.
//
// Each record also knows the record it was stored under (its block's parent, nilRec for
// a chain's first block) and how many live records were stored under it. While no
// record has lost its parent (detached false), every block the rank holds has its whole
// chain held too, so that holding a request's block i means holding its blocks 0..i and
// LeadingBlocks can search for the depth instead of walking to it. vLLM keeps this
// order (it frees a request's blocks tail first, so a block is evicted before its
// parent); the first removal that breaks it sets detached, and lookups walk the rank's
// blocks one by one until it is empty again.
//
// Per record: handle 8 + key 8 + meta 8 (links and reference count) + parent 4 +
// children 4 = 32 bytes, plus its handle-table slot (4 bytes at load 0.47..0.7).
type source struct {
	mu       sync.Mutex
	id       uint32
	endpoint string
	rank     int
	dead     bool // purged: every later operation is a no-op
	capacity int

	handle []uint64
	key    []uint64
	// meta: prev (toward older), next (toward newer; on free records, the next free
	// record) and refs (stores minus removals of the handle; 0 on free records).
	meta []uint64
	// parent is the record each record was stored under (nilRec: none), children how
	// many live records were stored under it; exact while detached is false.
	parent   []uint32
	children []uint32
	// detached is set (before the parent's key leaves the key table) when a record
	// goes while one stored under it stays, and cleared when the rank is empty.
	// Lookups read it without the rank's lock.
	detached atomic.Bool
	free     uint32
	oldest   uint32
	newest   uint32
	live     int

	htab  []uint32 // record number + 1; 0 is empty
	dups  map[uint64]uint32
	stats RankStats
}

func newSource(id uint32, endpoint string, rank, capacity int) *source {
	return &source{id: id, endpoint: endpoint, rank: rank, capacity: capacity,
		free: nilRec, oldest: nilRec, newest: nilRec}
}

func (s *source) prev(r uint32) uint32 { return uint32(s.meta[r] & linkMask) }
func (s *source) next(r uint32) uint32 { return uint32(s.meta[r] >> linkBits & linkMask) }
func (s *source) refs(r uint32) uint32 { return uint32(s.meta[r] >> refsShift) }

func (s *source) setPrev(r, p uint32) { s.meta[r] = s.meta[r]&^linkMask | uint64(p) }
func (s *source) setNext(r, n uint32) {
	s.meta[r] = s.meta[r]&^(linkMask<<linkBits) | uint64(n)<<linkBits
}
func (s *source) setRefs(r, n uint32) {
	s.meta[r] = s.meta[r]&(1<<refsShift-1) | uint64(min(n, maxRefs))<<refsShift
}

// mix scrambles a vLLM handle, which may be a small integer from a simulator.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// The handle table's slots hold a record number + 1 in the low recBits bits (0 is an
// empty slot) and a tag of the handle's hash in the high bits, so that a probe reads a
// record's handle only when the tag matches (1 in 512 otherwise).
const (
	recBits = 23
	recMask = 1<<recBits - 1
	// MaxRecords bounds the records of one rank; Config.MaxBlocksPerRank may not exceed it.
	maxRecords = recMask - 1
)

func (s *source) hhome(h uint64) (int, uint32) {
	m := mix(h)
	hi, _ := bits.Mul64(m, uint64(len(s.htab)))
	return int(hi), uint32(m) &^ recMask
}

// lookup returns the record holding handle h, or nilRec.
func (s *source) lookup(h uint64) uint32 {
	n := len(s.htab)
	if n == 0 {
		return nilRec
	}
	i, tag := s.hhome(h)
	for {
		e := s.htab[i]
		if e == 0 {
			return nilRec
		}
		if e&^recMask == tag && s.handle[e&recMask-1] == h {
			return e&recMask - 1
		}
		if i++; i == n {
			i = 0
		}
	}
}

func (s *source) hinsert(r uint32) {
	// The handle table's 4-byte slots are cheap: keep its load lower than the key
	// table's, in [0.47, 0.7], for shorter probes.
	if (s.live+1)*10 > len(s.htab)*7 {
		s.hresize(max(minSlots, len(s.htab)*3/2))
	}
	n := len(s.htab)
	i, tag := s.hhome(s.handle[r])
	for s.htab[i] != 0 {
		if i++; i == n {
			i = 0
		}
	}
	s.htab[i] = r + 1 | tag
}

func (s *source) hresize(n int) {
	old := s.htab
	s.htab = make([]uint32, n)
	for _, e := range old {
		if e == 0 {
			continue
		}
		i, _ := s.hhome(s.handle[e&recMask-1])
		for s.htab[i] != 0 {
			if i++; i == n {
				i = 0
			}
		}
		s.htab[i] = e
	}
}

// hdelete removes record r from the handle table (backward-shift deletion).
func (s *source) hdelete(r uint32) {
	n := len(s.htab)
	i, tag := s.hhome(s.handle[r])
	for s.htab[i] != r+1|tag {
		if i++; i == n {
			i = 0
		}
	}
	s.htab[i] = 0
	j := i
	for {
		if j++; j == n {
			j = 0
		}
		e := s.htab[j]
		if e == 0 {
			return
		}
		h, _ := s.hhome(s.handle[e&recMask-1])
		if i <= j {
			if i < h && h <= j {
				continue
			}
		} else if i < h || h <= j {
			continue
		}
		s.htab[i] = e
		s.htab[j] = 0
		i = j
	}
}

// alloc returns a fresh record linked as the newest, stored under parent (a live
// record, or nilRec for a chain's first block).
func (s *source) alloc(h, key uint64, parent uint32) uint32 {
	var r uint32
	if s.free != nilRec {
		r = s.free
		s.free = s.next(r)
	} else {
		r = uint32(len(s.handle))
		s.handle = append(s.handle, 0)
		s.key = append(s.key, 0)
		s.meta = append(s.meta, 0)
		s.parent = append(s.parent, 0)
		s.children = append(s.children, 0)
	}
	s.handle[r], s.key[r] = h, key
	s.parent[r], s.children[r] = parent, 0
	if parent != nilRec {
		s.children[parent]++
	}
	s.setRefs(r, 1)
	s.linkNewest(r)
	s.live++
	s.hinsert(r)
	return r
}

func (s *source) linkNewest(r uint32) {
	s.setPrev(r, s.newest)
	s.setNext(r, nilRec)
	if s.newest != nilRec {
		s.setNext(s.newest, r)
	} else {
		s.oldest = r
	}
	s.newest = r
}

func (s *source) unlink(r uint32) {
	p, n := s.prev(r), s.next(r)
	if p != nilRec {
		s.setNext(p, n)
	} else {
		s.oldest = n
	}
	if n != nilRec {
		s.setPrev(n, p)
	} else {
		s.newest = p
	}
}

// touch makes r the newest record.
func (s *source) touch(r uint32) {
	if s.newest == r {
		return
	}
	s.unlink(r)
	s.linkNewest(r)
}

// detach records that a live record lost its parent: until the rank is empty, its
// chains may have gaps. It must run before the parent's key leaves the key table.
func (s *source) detach() {
	if !s.detached.Load() {
		s.detached.Store(true)
		s.stats.Detached++
	}
}

// release frees record r and returns its key.
func (s *source) release(r uint32) uint64 {
	if s.children[r] > 0 {
		s.detach()
	} else if p := s.parent[r]; p != nilRec && s.children[p] > 0 {
		s.children[p]--
	}
	s.hdelete(r)
	s.unlink(r)
	k := s.key[r]
	s.setRefs(r, 0)
	s.setNext(r, s.free)
	s.free = r
	if s.live--; s.live == 0 {
		s.detached.Store(false) // no record, no gap
	}
	return k
}

// reset drops every record and gives the memory back.
func (s *source) reset() {
	s.handle, s.key, s.meta, s.htab, s.dups = nil, nil, nil, nil, nil
	s.parent, s.children = nil, nil
	s.free, s.oldest, s.newest, s.live = nilRec, nilRec, nilRec, 0
	s.detached.Store(false)
}
