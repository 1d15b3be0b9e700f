package index

import "math/bits"

// keyTable maps a block key to the set of sources (endpoint ranks) holding it, as a bitset
// of `words` uint64 words. It is an open-addressing table with linear probing and
// backward-shift deletion; each slot is 1+words consecutive uint64s (the key, then the
// bitset), so a probe touches one cache line. Slots are addressed by multiply-shift, so
// the table grows by 5/4 rather than doubling. A slot is empty exactly when its bitset is
// zero: a key whose last holder leaves is deleted at once, so key 0 needs no special case.
//
// Not safe for concurrent use; the index guards each shard's table with the shard's lock.
type keyTable struct {
	slots  []uint64 // n * stride
	n      int
	stride int // 1 + words
	count  int
}

const (
	// maxLoadNum/maxLoadDen is the load factor that triggers growth, by growNum/growDen:
	// between growths the load stays in [0.64, 0.8].
	maxLoadNum = 4
	maxLoadDen = 5
	minSlots   = 16
	growNum    = 5
	growDen    = 4
)

func newKeyTable(words int) keyTable {
	return keyTable{stride: 1 + words}
}

// home is the first slot probed for key.
func (t *keyTable) home(key uint64) int {
	hi, _ := bits.Mul64(key, uint64(t.n))
	return int(hi)
}

func (t *keyTable) empty(i int) bool {
	if t.stride == 2 {
		return t.slots[2*i+1] == 0
	}
	for _, w := range t.slots[i*t.stride+1 : (i+1)*t.stride] {
		if w != 0 {
			return false
		}
	}
	return true
}

// find returns the slot holding key, or -1.
func (t *keyTable) find(key uint64) int {
	if t.n == 0 {
		return -1
	}
	i := t.home(key)
	for {
		if t.empty(i) {
			return -1
		}
		if t.slots[i*t.stride] == key {
			return i
		}
		if i++; i == t.n {
			i = 0
		}
	}
}

// mask returns the bitset of slot i; the caller must not retain it past the lock.
func (t *keyTable) mask(i int) []uint64 {
	return t.slots[i*t.stride+1 : (i+1)*t.stride]
}

// set marks src as holding key and reports whether it already did.
func (t *keyTable) set(key uint64, src uint32) (already bool) {
	w, b := 1+int(src/64), uint64(1)<<(src%64)
	if i := t.find(key); i >= 0 {
		m := &t.slots[i*t.stride+w]
		already = *m&b != 0
		*m |= b
		return already
	}
	if (t.count+1)*maxLoadDen > t.n*maxLoadNum {
		t.resize(max(minSlots, t.n*growNum/growDen), t.stride)
	}
	i := t.home(key)
	for !t.empty(i) {
		if i++; i == t.n {
			i = 0
		}
	}
	t.slots[i*t.stride] = key
	t.slots[i*t.stride+w] |= b
	t.count++
	return false
}

// clear removes src from key's holders, deleting the key when none is left. It reports
// whether src held key.
func (t *keyTable) clear(key uint64, src uint32) bool {
	i := t.find(key)
	if i < 0 {
		return false
	}
	w, b := 1+int(src/64), uint64(1)<<(src%64)
	m := &t.slots[i*t.stride+w]
	if *m&b == 0 {
		return false
	}
	*m &^= b
	if t.empty(i) {
		t.count--
		t.shiftBack(i)
	}
	return true
}

// shiftBack refills the hole at slot i (already empty) by moving later entries of its probe
// run back, so that every remaining key stays reachable from its home slot.
func (t *keyTable) shiftBack(i int) {
	j := i
	for {
		if j++; j == t.n {
			j = 0
		}
		if t.empty(j) {
			return
		}
		h := t.home(t.slots[j*t.stride])
		// The entry at j may move to i only if its home is not cyclically in (i, j].
		if i <= j {
			if i < h && h <= j {
				continue
			}
		} else if i < h || h <= j {
			continue
		}
		copy(t.slots[i*t.stride:(i+1)*t.stride], t.slots[j*t.stride:(j+1)*t.stride])
		clear(t.slots[j*t.stride+1 : (j+1)*t.stride])
		i = j
	}
}

// resize rehashes into n slots of the given stride (>= t.stride).
func (t *keyTable) resize(n, stride int) {
	old := *t
	t.slots = make([]uint64, n*stride)
	t.n, t.stride = n, stride
	for i := range old.n {
		if old.empty(i) {
			continue
		}
		j := t.home(old.slots[i*old.stride])
		for !t.empty(j) {
			if j++; j == n {
				j = 0
			}
		}
		copy(t.slots[j*stride:], old.slots[i*old.stride:(i+1)*old.stride])
	}
}

// widen grows every slot's bitset to words words.
func (t *keyTable) widen(words int) {
	if 1+words <= t.stride {
		return
	}
	if t.n == 0 {
		t.stride = 1 + words
		return
	}
	t.resize(t.n, 1+words)
}
