package tokenizer

import (
	"container/heap"
	"math"
)

// byteToRune is GPT-2's bytes_to_unicode: the printable rune that stands for each byte
// in byte-level vocabularies.
var byteToRune = func() (m [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			m[b] = rune(b)
		} else {
			m[b] = rune(256 + n)
			n++
		}
	}
	return m
}()

// runeToByte inverts byteToRune; -1 marks runes outside the byte-level alphabet.
var runeToByte = func() (m [256 + 68]int16) {
	for i := range m {
		m[i] = -1
	}
	for b, r := range byteToRune {
		m[r] = int16(b)
	}
	return m
}()

// byteLevelDecode maps a byte-level token string back to raw bytes; ok is false when
// the string holds a rune outside the byte-level alphabet.
func byteLevelDecode(tok string) (b []byte, ok bool) {
	b = make([]byte, 0, len(tok))
	for _, r := range tok {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return nil, false
		}
		b = append(b, byte(runeToByte[r]))
	}
	return b, true
}

// merge is the result of merging one pair of token ids.
type merge struct {
	rank uint32 // position in the merges list: lower merges first
	id   uint32 // id of the merged token
}

// bpeModel is a byte-level BPE model: vocabulary keyed by raw bytes and merges by rank.
type bpeModel struct {
	vocab        vocab       // raw bytes <-> id
	byteID       [256]uint32 // id of each single-byte token
	merges       mergeTable  // left<<32|right -> merge
	ignoreMerges bool        // a word found whole in vocab is emitted as is
	// whole[id] is true when BPE applied to the bytes of vocabulary token id yields
	// exactly [id]: such words skip the merge loop (precomputed at load, so exact).
	whole []bool
}

// precomputeWhole runs BPE once over every multi-byte vocabulary token and records
// those that merge back into themselves.
func (m *bpeModel) precomputeWhole() {
	m.whole = make([]bool, m.vocab.size())
	var buf []uint32
	for i := range m.whole {
		id := uint32(i)
		tok := m.vocab.bytes(id)
		if len(tok) < 2 {
			continue
		}
		buf = m.merge(tok, buf[:0])
		m.whole[id] = len(buf) == 1 && buf[0] == id
	}
}

const noRank = math.MaxUint32

func (m *bpeModel) lookup(a, b uint32) merge {
	return m.merges.get(uint64(a)<<32 | uint64(b))
}

// mergeTable is an open-addressing hash table (linear probing, at most half full) from
// a pair of ids to its merge. Keys and values share a slot, so a lookup touches one
// cache line; this is the innermost loop of BPE.
type mergeTable struct {
	slots []mergeSlot
	shift uint8
}

type mergeSlot struct {
	key uint64 // pair key + 1; 0 marks an empty slot
	merge
}

func newMergeTable(n int) mergeTable {
	bits := uint8(4)
	for 1<<bits < 2*n {
		bits++
	}
	return mergeTable{slots: make([]mergeSlot, 1<<bits), shift: 64 - bits}
}

func (t *mergeTable) index(key uint64) uint64 { return (key * 0x9E3779B97F4A7C15) >> t.shift }

// add inserts key unless present; it reports whether it did.
func (t *mergeTable) add(key uint64, mg merge) bool {
	mask := uint64(len(t.slots) - 1)
	for i := t.index(key); ; i = (i + 1) & mask {
		switch t.slots[i].key {
		case 0:
			t.slots[i] = mergeSlot{key: key + 1, merge: mg}
			return true
		case key + 1:
			return false
		}
	}
}

func (t *mergeTable) get(key uint64) merge {
	mask := uint64(len(t.slots) - 1)
	for i := t.index(key); ; i = (i + 1) & mask {
		switch t.slots[i].key {
		case key + 1:
			return t.slots[i].merge
		case 0:
			return merge{rank: noRank}
		}
	}
}

// longWord is the length in bytes above which words are merged with a heap (HF's own
// algorithm, O(n log n)) instead of by scanning (faster for the short words of prose).
const longWord = 96

// encodeWord appends the ids of one pre-tokenized word (raw bytes) to out.
func (m *bpeModel) encodeWord(word string, out []uint32) []uint32 {
	if len(word) == 1 {
		return append(out, m.byteID[word[0]])
	}
	// whole[id] is about the bytes id decodes as: another token of the same id
	// is merged.
	if id, ok := m.vocab.get(word); ok && (m.ignoreMerges || m.whole[id] && m.vocab.decodes(id, word)) {
		return append(out, id)
	}
	return m.merge(word, out)
}

// merge applies the BPE merges to word (at least two bytes) and appends the ids.
func (m *bpeModel) merge(word string, out []uint32) []uint32 {
	if len(word) > longWord {
		return m.encodeLong(word, out)
	}
	var symBuf [longWord]uint32
	var rankBuf [longWord]merge
	syms := symBuf[:len(word)]
	for i := 0; i < len(word); i++ {
		syms[i] = m.byteID[word[i]]
	}
	ranks := rankBuf[:len(word)-1]
	for i := range ranks {
		ranks[i] = m.lookup(syms[i], syms[i+1])
	}
	for len(ranks) > 0 {
		best := 0
		for i := 1; i < len(ranks); i++ {
			if ranks[i].rank < ranks[best].rank {
				best = i
			}
		}
		if ranks[best].rank == noRank {
			break
		}
		syms[best] = ranks[best].id
		copy(syms[best+1:], syms[best+2:])
		syms = syms[:len(syms)-1]
		copy(ranks[best:], ranks[best+1:])
		ranks = ranks[:len(ranks)-1]
		if best > 0 {
			ranks[best-1] = m.lookup(syms[best-1], syms[best])
		}
		if best < len(ranks) {
			ranks[best] = m.lookup(syms[best], syms[best+1])
		}
	}
	return append(out, syms...)
}

// heapItem is a candidate merge of the symbol at pos with its right neighbour.
type heapItem struct {
	rank, id uint32
	pos      int32
}

type mergeHeap []heapItem

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(heapItem)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// encodeLong is HuggingFace's Word::merge_all: a priority queue of (rank, position)
// over a doubly linked list of symbols, skipping stale entries.
func (m *bpeModel) encodeLong(word string, out []uint32) []uint32 {
	n := len(word)
	ids := make([]uint32, n)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := 0; i < n; i++ {
		ids[i] = m.byteID[word[i]]
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	h := make(mergeHeap, 0, n)
	for i := 0; i+1 < n; i++ {
		if mg := m.lookup(ids[i], ids[i+1]); mg.rank != noRank {
			h = append(h, heapItem{mg.rank, mg.id, int32(i)})
		}
	}
	heap.Init(&h)
	for h.Len() > 0 {
		top := heap.Pop(&h).(heapItem)
		p := top.pos
		if !alive[p] || next[p] >= int32(n) {
			continue
		}
		q := next[p]
		if mg := m.lookup(ids[p], ids[q]); mg.rank == noRank || mg.id != top.id {
			continue
		}
		ids[p] = top.id
		alive[q] = false
		next[p] = next[q]
		if next[q] < int32(n) {
			prev[next[q]] = p
		}
		if pp := prev[p]; pp >= 0 {
			if mg := m.lookup(ids[pp], ids[p]); mg.rank != noRank {
				heap.Push(&h, heapItem{mg.rank, mg.id, pp})
			}
		}
		if nn := next[p]; nn < int32(n) {
			if mg := m.lookup(ids[p], ids[nn]); mg.rank != noRank {
				heap.Push(&h, heapItem{mg.rank, mg.id, p})
			}
		}
	}
	for i := int32(0); i < int32(n); i = next[i] {
		out = append(out, ids[i])
	}
	return out
}
