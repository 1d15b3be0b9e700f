package tokenizer

import "hash/maphash"

// vocab is a BPE model's vocabulary: the id of each token's raw bytes, and the bytes of
// each id. It holds one pointer (its text) and otherwise integers, so a garbage
// collection marks it in constant time. A map[string]uint32 and a []string of its
// tokens held a pointer per token, ~300k for Qwen3's 151k tokens, and a collection
// spent ~7 ms of CPU per loaded tokenizer following them (BenchmarkCollect): more,
// every cycle, than a 2k-token request's whole decision.
type vocab struct {
	text string   // every token's bytes, in id order
	ends []uint32 // ends[id] is where token id's bytes end in text; they start at ends[id-1] (0 for id 0)
	// slots is an open-addressing table (linear probing, at most two thirds full) of
	// the tokens by the seeded hash of their bytes. A slot holds what a lookup checks
	// (the hash's low half, the token's length and where its bytes are), so that a
	// lookup reads one slot and, when they match, the token's bytes: as a Go map does.
	slots []vocabSlot
	shift uint8
	seed  maphash.Seed
	// shared: some id has several tokens (all found by get; bytes returns one).
	shared bool
}

// vocabSlot is one token of vocab.slots; n == 0 marks an empty slot (no token is
// empty).
type vocabSlot struct {
	hash, off, n, id uint32
}

// newVocab builds the vocabulary from raw bytes -> id. An id given to several tokens
// finds each of them and decodes as the least of them (HF keeps one too); an empty
// token is never looked up (a word has bytes) and is left out.
func newVocab(byBytes map[string]uint32) vocab {
	maxID := uint32(0)
	for _, id := range byBytes {
		maxID = max(maxID, id)
	}
	n := 0
	if len(byBytes) > 0 {
		n = int(maxID) + 1
	}
	byID := make([]string, n)
	var extra []string // tokens of an id that decodes as another
	size := 0
	for tok, id := range byBytes {
		if tok == "" {
			continue
		}
		size += len(tok)
		switch cur := byID[id]; {
		case cur == "":
			byID[id] = tok
		case tok < cur:
			byID[id], extra = tok, append(extra, cur)
		default:
			extra = append(extra, tok)
		}
	}
	text := make([]byte, 0, size)
	v := vocab{ends: make([]uint32, n), seed: maphash.MakeSeed()}
	for id, tok := range byID {
		text = append(text, tok...)
		v.ends[id] = uint32(len(text))
	}
	for _, tok := range extra {
		text = append(text, tok...)
	}
	v.text = string(text)
	v.shared = len(extra) > 0
	bits := uint8(4)
	for 1<<bits < 3*len(byBytes)/2 {
		bits++
	}
	v.slots, v.shift = make([]vocabSlot, 1<<bits), 64-bits
	mask := uint64(len(v.slots) - 1)
	off := uint32(0)
	insert := func(tok string, id uint32) {
		h := maphash.String(v.seed, tok)
		i := v.index(h)
		for v.slots[i].n != 0 {
			i = (i + 1) & mask
		}
		v.slots[i] = vocabSlot{hash: uint32(h), off: off, n: uint32(len(tok)), id: id}
		off += uint32(len(tok))
	}
	for id, tok := range byID {
		if tok != "" {
			insert(tok, uint32(id))
		}
	}
	for _, tok := range extra {
		insert(tok, byBytes[tok])
	}
	return v
}

// size is one more than the largest id.
func (v *vocab) size() int { return len(v.ends) }

// bytes returns token id's bytes ("" for an id without a token).
func (v *vocab) bytes(id uint32) string {
	if int(id) >= len(v.ends) {
		return ""
	}
	start := uint32(0)
	if id > 0 {
		start = v.ends[id-1]
	}
	return v.text[start:v.ends[id]]
}

// index is the slot a hash starts probing at: its high bits (the slot keeps the low
// ones).
func (v *vocab) index(h uint64) uint64 { return h >> v.shift }

// decodes reports whether token id's bytes are tok (false only for a token that
// shares its id with another).
func (v *vocab) decodes(id uint32, tok string) bool {
	return !v.shared || v.bytes(id) == tok
}

// get returns the id of the token whose bytes are tok.
func (v *vocab) get(tok string) (uint32, bool) {
	if len(v.slots) == 0 || len(tok) == 0 {
		return 0, false
	}
	h := maphash.String(v.seed, tok)
	mask := uint64(len(v.slots) - 1)
	for i := v.index(h); ; i = (i + 1) & mask {
		s := &v.slots[i]
		if s.n == 0 {
			return 0, false
		}
		if s.hash == uint32(h) && int(s.n) == len(tok) && v.text[s.off:s.off+s.n] == tok {
			return s.id, true
		}
	}
}
