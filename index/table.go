package index

import "math/bits"

// keyTable maps a block key to the set of sources (endpoint ranks) holding it, as a bitset
// of `words` uint64 words per slot. It is an open-addressing table with linear probing and
// backward-shift deletion, sized to any slot count (slots are addressed by multiply-shift,
// so growth is by 3/2, not doubling). A slot is empty exactly when its bitset is zero: a key
// whose last holder leaves is deleted at once, so key 0 needs no special case.
//
// Not safe for concurrent use; the index guards each shard's table with the shard's lock.
type keyTable struct {
	keys  []uint64
	masks []uint64 // len(keys) * words
	words int
	count int
}

const (
	// maxLoadNum/maxLoadDen is the load factor that triggers growth.
	maxLoadNum = 4
	maxLoadDen = 5
	minSlots   = 16
)

func newKeyTable(words int) keyTable {
	return keyTable{words: words}
}

// home is the first slot probed for key.
func (t *keyTable) home(key uint64) int {
	hi, _ := bits.Mul64(key, uint64(len(t.keys)))
	return int(hi)
}

func (t *keyTable) empty(i int) bool {
	m := t.masks[i*t.words : (i+1)*t.words]
	for _, w := range m {
		if w != 0 {
			return false
		}
	}
	return true
}

// find returns the slot holding key, or -1.
func (t *keyTable) find(key uint64) int {
	n := len(t.keys)
	if n == 0 {
		return -1
	}
	i := t.home(key)
	for {
		if t.empty(i) {
			return -1
		}
		if t.keys[i] == key {
			return i
		}
		i++
		if i == n {
			i = 0
		}
	}
}

// mask returns the bitset of slot i; the caller must not retain it past the lock.
func (t *keyTable) mask(i int) []uint64 {
	return t.masks[i*t.words : (i+1)*t.words]
}

// set marks src as holding key and reports whether it already did.
func (t *keyTable) set(key uint64, src uint32) (already bool) {
	w, b := int(src/64), uint64(1)<<(src%64)
	if i := t.find(key); i >= 0 {
		m := &t.masks[i*t.words+w]
		already = *m&b != 0
		*m |= b
		return already
	}
	if (t.count+1)*maxLoadDen > len(t.keys)*maxLoadNum {
		t.resize(max(minSlots, len(t.keys)*3/2), t.words)
	}
	i := t.home(key)
	for !t.empty(i) {
		i++
		if i == len(t.keys) {
			i = 0
		}
	}
	t.keys[i] = key
	t.masks[i*t.words+w] |= b
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
	w, b := int(src/64), uint64(1)<<(src%64)
	m := &t.masks[i*t.words+w]
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
	n := len(t.keys)
	j := i
	for {
		j++
		if j == n {
			j = 0
		}
		if t.empty(j) {
			return
		}
		h := t.home(t.keys[j])
		// The entry at j may move to i only if its home is not cyclically in (i, j].
		if i <= j {
			if i < h && h <= j {
				continue
			}
		} else if i < h || h <= j {
			continue
		}
		t.keys[i] = t.keys[j]
		copy(t.masks[i*t.words:(i+1)*t.words], t.masks[j*t.words:(j+1)*t.words])
		clear(t.masks[j*t.words : (j+1)*t.words])
		i = j
	}
}

// resize rehashes into n slots of the given width (words >= t.words).
func (t *keyTable) resize(n, words int) {
	old := *t
	t.keys = make([]uint64, n)
	t.masks = make([]uint64, n*words)
	t.words = words
	for i := range old.keys {
		if old.empty(i) {
			continue
		}
		j := t.home(old.keys[i])
		for !t.empty(j) {
			j++
			if j == n {
				j = 0
			}
		}
		t.keys[j] = old.keys[i]
		copy(t.masks[j*words:], old.masks[i*old.words:(i+1)*old.words])
	}
}

// widen grows every slot's bitset to words words.
func (t *keyTable) widen(words int) {
	if words <= t.words {
		return
	}
	if len(t.keys) == 0 {
		t.words = words
		return
	}
	t.resize(len(t.keys), words)
}

// bytes is the table's heap footprint.
func (t *keyTable) bytes() int {
	return 8 * (cap(t.keys) + cap(t.masks))
}
