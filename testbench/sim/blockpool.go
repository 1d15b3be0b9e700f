package sim

import (
	"crypto/sha256"
	"encoding/binary"

	"github.com/kvrouter/kvrouter/kvevents"
)

// nilBlock marks the end of the free list.
const nilBlock = -1

// block is one KV cache block, as vLLM's KVCacheBlock.
type block struct {
	ref     int32
	hash    uint64
	hasHash bool
	// prev and next link the block into the free queue while it is in it.
	prev, next int32
	inFree     bool
}

// blockPool is vLLM v1's BlockPool for one full-attention KV cache group: a doubly linked
// free queue evicted from the head, blocks appended at the tail when their reference count
// drops to zero, a hash -> blocks map of cached full blocks (no de-duplication), and the
// KV events the changes produce. Block 0 is vLLM's null block: it is taken out of the
// free queue at start and never returned, so num_gpu_blocks-1 blocks are usable.
type blockPool struct {
	blocks     []block
	head, tail int32
	numFree    int
	cached     map[uint64][]int32
	emit       bool
	events     []kvevents.Event
	blockSize  int
}

func newBlockPool(numBlocks, blockSize int, emit bool) *blockPool {
	p := &blockPool{
		blocks:    make([]block, numBlocks),
		head:      nilBlock,
		tail:      nilBlock,
		cached:    make(map[uint64][]int32),
		emit:      emit,
		blockSize: blockSize,
	}
	// vLLM builds the queue in block-id order and pops block 0 as the null block.
	for i := 1; i < numBlocks; i++ {
		p.blocks[i].prev, p.blocks[i].next = nilBlock, nilBlock
		p.pushTail(int32(i))
	}
	return p
}

func (p *blockPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next, b.inFree = p.tail, nilBlock, true
	if p.tail != nilBlock {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.numFree++
}

func (p *blockPool) remove(id int32) {
	b := &p.blocks[id]
	if b.prev != nilBlock {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next != nilBlock {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next, b.inFree = nilBlock, nilBlock, false
	p.numFree--
}

// lookup returns the first cached block holding hash, as vLLM's get_cached_block.
func (p *blockPool) lookup(hash uint64) (int32, bool) {
	ids := p.cached[hash]
	if len(ids) == 0 {
		return 0, false
	}
	return ids[0], true
}

// allocate pops n blocks from the head of the free queue, evicting their cached hashes
// (one BlockRemoved each). The caller has checked that n blocks are free.
func (p *blockPool) allocate(n int, dst []int32) []int32 {
	for range n {
		id := p.head
		p.remove(id)
		b := &p.blocks[id]
		if b.hasHash {
			p.evict(id)
		}
		b.ref = 1
		dst = append(dst, id)
	}
	return dst
}

func (p *blockPool) evict(id int32) {
	b := &p.blocks[id]
	ids := p.cached[b.hash]
	for i, x := range ids {
		if x == id {
			ids = append(ids[:i], ids[i+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(p.cached, b.hash)
	} else {
		p.cached[b.hash] = ids
	}
	if p.emit {
		p.events = append(p.events, &kvevents.BlockRemoved{BlockHashes: []uint64{b.hash}, Medium: "GPU"})
	}
	b.hasHash, b.hash = false, 0
}

// touch takes a reference on cached blocks reused by a request, removing those that were
// free from the free queue.
func (p *blockPool) touch(ids []int32) {
	for _, id := range ids {
		b := &p.blocks[id]
		if b.ref == 0 && b.inFree {
			p.remove(id)
		}
		b.ref++
	}
}

// free drops one reference on each of a request's blocks (given in allocation order),
// tail first as vLLM's KVCacheManager.free does, appending those that reach zero to the
// free queue's tail: the last block of a prefix is evicted before its first.
func (p *blockPool) free(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &p.blocks[id]
		b.ref--
		if b.ref == 0 {
			p.pushTail(id)
		}
	}
}

// cacheBlock records a newly computed full block under its hash.
func (p *blockPool) cacheBlock(id int32, hash uint64) {
	b := &p.blocks[id]
	b.hash, b.hasHash = hash, true
	p.cached[hash] = append(p.cached[hash], id)
}

// reset drops every cached hash; it fails (false) while any block is in use.
func (p *blockPool) reset() bool {
	if p.numFree != len(p.blocks)-1 {
		return false
	}
	clear(p.cached)
	for i := range p.blocks {
		p.blocks[i].hasHash, p.blocks[i].hash = false, 0
	}
	if p.emit {
		p.events = append(p.events, &kvevents.AllBlocksCleared{})
	}
	return true
}

// usage is vLLM's kv_cache_usage_perc: the share of usable blocks not free.
func (p *blockPool) usage() float64 {
	total := len(p.blocks) - 1
	if total <= 0 {
		return 0
	}
	return 1 - float64(p.numFree)/float64(total)
}

// hasher chains block hashes the way vLLM's hash_block_tokens does: each block's digest
// covers its parent's digest (or the per-process root), its token ids and its extra keys.
// The handle published in events is the digest's last 8 bytes, big-endian, as vLLM's
// integer block hashes are.
type hasher struct {
	root [32]byte
	buf  []byte
}

func newHasher(seed uint64) *hasher {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seed)
	h := &hasher{root: sha256.Sum256(append([]byte("vllm-sim root "), s[:]...))}
	return h
}

// next returns the digest of one block given its parent's digest (nil for the first).
func (h *hasher) next(parent *[32]byte, tokens []uint32, extra string) [32]byte {
	h.buf = h.buf[:0]
	if parent == nil {
		h.buf = append(h.buf, h.root[:]...)
	} else {
		h.buf = append(h.buf, parent[:]...)
	}
	for _, t := range tokens {
		h.buf = binary.LittleEndian.AppendUint32(h.buf, t)
	}
	h.buf = append(h.buf, extra...)
	return sha256.Sum256(h.buf)
}

func handle(d [32]byte) uint64 { return binary.BigEndian.Uint64(d[24:]) }
