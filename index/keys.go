package index

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// maxStackBlock is the largest block (in tokens) hashed from a stack buffer; larger blocks
// are streamed through an xxhash.Digest.
const maxStackBlock = 256

// Root returns the key a sequence's first block chains from: a hash of the model name, the
// LoRA adapter name (empty for the base model) and the request's cache_salt (empty when
// none). vLLM folds the LoRA name into every block and the salt into the first one; folding
// both into the root gives the same separation, since every later key chains from it.
// The strings are length-prefixed so that ("ab", "c") and ("a", "bc") differ.
func Root(model, lora, salt string) uint64 {
	d := xxhash.NewWithSeed(0x6b76726f75746572) // "kvrouter"
	var n [8]byte
	for _, s := range [...]string{model, lora, salt} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		_, _ = d.Write(n[:])
		_, _ = d.WriteString(s)
	}
	return d.Sum64()
}

// Keys appends to dst the chained keys of every full block of tokens (blockSize tokens
// each; a trailing partial block has no key, as in vLLM) and returns the extended slice.
// Block i's key is xxhash64 over the previous key (root for block 0) and the block's token
// ids, all little-endian. blockSize <= 0 yields no keys.
//
// The index calls Keys on the token ids of BlockStored events, continuing from the
// parent's key; the policies call it on a request's prompt from Root. Equal token prefixes
// under the same root therefore get equal keys on every pod, whatever the pod's hash seed.
func Keys(root uint64, tokens []uint32, blockSize int, dst []uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	prev := root
	for len(tokens) >= blockSize {
		prev = chain(prev, tokens[:blockSize])
		dst = append(dst, prev)
		tokens = tokens[blockSize:]
	}
	return dst
}

// PrefixKeys describes the leading ids of a token sequence as segments that the
// sequence's producer keeps across requests (a tokenizer's prefix cache: a
// conversation's history is the same chain of segments turn after turn), on which the
// keys of the blocks ending in each segment can be stored once computed. A block's key
// depends only on the ids up to its end, so keys stored on a segment hold for every
// later sequence that starts with the same segments. Implementations must be safe for
// concurrent use.
type PrefixKeys interface {
	// Ends returns the end of each segment, as a count of ids from the sequence's
	// start, increasing.
	Ends() []int
	// SegmentKeys returns the keys stored on segment i for root and blockSize (those of
	// the blocks whose last id is in the segment), or nil.
	SegmentKeys(i int, root uint64, blockSize int) []uint64
	// StoreSegmentKeys offers keys as segment i's for root and blockSize; the
	// implementation copies what it keeps.
	StoreSegmentKeys(i int, root uint64, blockSize int, keys []uint64)
}

// PrefixedKeys is Keys(root, tokens, blockSize, dst) for tokens whose leading ids p
// describes: the keys of each segment's blocks are taken from p where it stored them
// and computed by Keys (then offered to p) otherwise, and the keys past p's segments are
// computed. A nil p computes them all. The keys are those of Keys either way; what is
// spared is hashing a history the previous turn already hashed.
func PrefixedKeys(root uint64, tokens []uint32, blockSize int, p PrefixKeys, dst []uint64) []uint64 {
	if blockSize <= 0 || p == nil {
		return Keys(root, tokens, blockSize, dst)
	}
	start := len(dst)
	prev, prevEnd := root, 0
	for i, end := range p.Ends() {
		if end > len(tokens) || end < prevEnd {
			break
		}
		done := len(dst) - start // blocks keyed so far: those ending before prevEnd
		n := end/blockSize - done
		if n > 0 {
			if ks := p.SegmentKeys(i, root, blockSize); len(ks) == n {
				dst = append(dst, ks...)
			} else {
				dst = Keys(prev, tokens[done*blockSize:end/blockSize*blockSize], blockSize, dst)
				p.StoreSegmentKeys(i, root, blockSize, dst[len(dst)-n:])
			}
			prev = dst[len(dst)-1]
		}
		prevEnd = end
	}
	return Keys(prev, tokens[(len(dst)-start)*blockSize:], blockSize, dst)
}

// chain hashes one block's token ids onto the previous key.
func chain(prev uint64, block []uint32) uint64 {
	if len(block) <= 32 { // the common sizes (16, 32) hash from a small buffer
		var buf [8 + 4*32]byte
		binary.LittleEndian.PutUint64(buf[:8], prev)
		b := buf[8:]
		for i, t := range block {
			binary.LittleEndian.PutUint32(b[4*i:], t)
		}
		return xxhash.Sum64(buf[:8+4*len(block)])
	}
	if len(block) <= maxStackBlock {
		var buf [8 + 4*maxStackBlock]byte
		binary.LittleEndian.PutUint64(buf[:8], prev)
		b := buf[8:]
		for i, t := range block {
			binary.LittleEndian.PutUint32(b[4*i:], t)
		}
		return xxhash.Sum64(buf[:8+4*len(block)])
	}
	d := xxhash.New()
	var buf [8 + 4*maxStackBlock]byte
	binary.LittleEndian.PutUint64(buf[:8], prev)
	_, _ = d.Write(buf[:8])
	for len(block) > 0 {
		n := min(len(block), maxStackBlock)
		for i, t := range block[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = d.Write(buf[:4*n])
		block = block[n:]
	}
	return d.Sum64()
}
