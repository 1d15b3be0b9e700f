package kvevents

// Batch is one message's payload as vLLM publishes it: a timestamp, the events in order,
// and the data-parallel rank that emitted them.
type Batch struct {
	// TS is the publisher's wall clock, seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank; HasDPRank is false when the field is nil or absent
	// (2-element batches from older vLLM).
	DPRank    int
	HasDPRank bool
	// Model is the served model name the publisher's topic named (central mode,
	// "kv@<ip:port>@<model>"); empty when the transport does not say, and then the Sink
	// knows the endpoint's model itself. Decode leaves it alone.
	Model string

	// scratch keeps the event structs Decode allocated, by type, for reuse by the next
	// Decode into this Batch whatever the order of event types.
	scratch *decodeScratch
}

// Event is one of *BlockStored, *BlockRemoved or *AllBlocksCleared. Unknown event types
// are skipped by the decoder and never appear here.
type Event interface{ isEvent() }

// BlockStored reports newly computed full blocks, in sequence order.
type BlockStored struct {
	// BlockHashes are vLLM's hashes, normalised to uint64 handles (binary hashes are
	// reduced to their last 8 bytes, big-endian). They are meaningful only per endpoint.
	BlockHashes []uint64
	// ParentHash is the handle of the block just before the first one; HasParent is false
	// at the start of a sequence.
	ParentHash uint64
	HasParent  bool
	// TokenIDs covers all blocks: len(BlockHashes) x BlockSize ids.
	TokenIDs  []uint32
	BlockSize int
	// LoRAID is 0 and HasLoRAID false without an adapter.
	LoRAID    int64
	HasLoRAID bool
	LoRAName  string
	Medium    string // "GPU", "CPU", ... empty when nil
	// GroupIdx is the KV cache group, for hybrid models; 0 when nil.
	GroupIdx int
	// HasGroupIdx is false when group_idx was nil or absent.
	HasGroupIdx bool
	// ExtraKeys is the raw msgpack of extra_keys (one entry per block: MM identifiers,
	// LoRA name, cache_salt, ...), copied out of the payload; empty when nil or absent.
	ExtraKeys []byte
	// KVCacheSpecKind is the cache-spec kind of the group ("full_attention", ...); empty
	// when nil or absent.
	KVCacheSpecKind string
	// KVCacheSpecSlidingWindow is the sliding window of the group's cache spec;
	// HasSlidingWindow is false when nil or absent.
	KVCacheSpecSlidingWindow int
	HasSlidingWindow         bool
}

// BlockRemoved reports evicted blocks.
type BlockRemoved struct {
	BlockHashes []uint64
	Medium      string
	GroupIdx    int
	// HasGroupIdx is false when group_idx was nil or absent.
	HasGroupIdx bool
}

// AllBlocksCleared reports that the publisher dropped its whole prefix cache.
type AllBlocksCleared struct{}

func (*BlockStored) isEvent()      {}
func (*BlockRemoved) isEvent()     {}
func (*AllBlocksCleared) isEvent() {}
