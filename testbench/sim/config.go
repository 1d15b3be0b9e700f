package sim

import (
	"errors"
	"fmt"
)

// Geometry is the shape of a model's KV cache, enough to turn a byte budget into blocks.
type Geometry struct {
	Layers     int
	KVHeads    int
	HeadDim    int
	DTypeBytes int
}

// Qwen3_0_6B is Qwen/Qwen3-0.6B in bf16: 28 layers x 8 KV heads x 128 dims x K,V x 2 bytes
// = 114,688 bytes per token.
var Qwen3_0_6B = Geometry{Layers: 28, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}

// BytesPerToken is the KV cache size of one token over all layers.
func (g Geometry) BytesPerToken() int64 {
	return 2 * int64(g.Layers) * int64(g.KVHeads) * int64(g.HeadDim) * int64(g.DTypeBytes)
}

// NumBlocks is vLLM's get_num_blocks for a uniform full-attention model: the per-layer page
// is 2 x block_size x kv_heads x head_dim x dtype bytes, and
// num_blocks = available_memory // page_size // num_layers (floor twice). For Qwen3-0.6B
// and 1 GiB that is 585 blocks, of which vLLM keeps one as its null block.
func (g Geometry) NumBlocks(kvBytes int64, blockSize int) int {
	page := 2 * int64(blockSize) * int64(g.KVHeads) * int64(g.HeadDim) * int64(g.DTypeBytes)
	if page <= 0 || g.Layers <= 0 || kvBytes <= 0 {
		return 0
	}
	return int(kvBytes / page / int64(g.Layers))
}

// Timing is the step-time model. A step's duration, in seconds, is
//
//	(Base + PrefillToken*P + DecodeSeq*D + Attention*A) / speed
//
// where P is the number of prompt (prefill) tokens computed in the step, D the number of
// sequences decoding one token, and A the attention work in units of 10^6 query x key token
// pairs: a chunk of n tokens computed after c tokens of context contributes n*(c+n/2).
type Timing struct {
	Base         float64 `json:"base"`
	PrefillToken float64 `json:"prefill_token"`
	DecodeSeq    float64 `json:"decode_seq"`
	Attention    float64 `json:"attention"`
}

// DefaultTiming is the calibrated step-time model (see README.md, Fidelity).
var DefaultTiming = Timing{Base: 0.0045, PrefillToken: 0.00003, DecodeSeq: 0.0002, Attention: 0.005}

// Config describes one simulated vLLM engine.
type Config struct {
	// BlockSize is tokens per KV block (vLLM --block-size, default 16).
	BlockSize int
	// NumGPUBlocks is vLLM's num_gpu_blocks, including the null block.
	NumGPUBlocks int
	// MaxNumSeqs caps running requests (vLLM --max-num-seqs).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget (vLLM --max-num-batched-tokens).
	MaxNumBatchedTokens int
	// MaxModelLen caps prompt plus output tokens.
	MaxModelLen int
	// ReserveFullISL admits a waiting request only when its whole prompt fits in the free
	// blocks, not just its first chunk (vLLM's scheduler_reserve_full_isl, on by default in
	// recent versions; off reproduces older versions' over-admission and thrashing).
	ReserveFullISL bool
	// HashSeed derives the root of the block hash chain. Engines with different seeds
	// publish different hashes for the same tokens, as unseeded vLLM processes do.
	HashSeed uint64
	// EnableEvents turns on KV cache events.
	EnableEvents bool
	// Vocabulary, when set, is the token ids generated outputs are drawn from
	// (deterministically per request id and position); nil draws from 1000..100999. A
	// client that renders the outputs back into a prompt (a multi-turn chat) needs ids
	// whose text tokenizes back to the same ids, as a real model's outputs mostly do.
	Vocabulary []uint32
	// Timing is the step-time model and Speed divides every step's duration (2 = twice as
	// fast as the model).
	Timing Timing
	Speed  float64
}

// DefaultConfig is vLLM's defaults on a small GPU (block size 16, 256 sequences, a 2,048
// token budget for the OpenAI server) with 1 GiB of KV cache for Qwen3-0.6B.
func DefaultConfig() Config {
	return Config{
		BlockSize:           16,
		NumGPUBlocks:        Qwen3_0_6B.NumBlocks(1<<30, 16),
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 2048,
		MaxModelLen:         40960,
		ReserveFullISL:      true,
		EnableEvents:        true,
		Timing:              DefaultTiming,
		Speed:               1,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.BlockSize <= 0:
		return errors.New("sim: block size must be positive")
	case c.NumGPUBlocks < 2:
		return fmt.Errorf("sim: num_gpu_blocks %d: need at least 2 (one is the null block)", c.NumGPUBlocks)
	case c.MaxNumSeqs <= 0:
		return errors.New("sim: max_num_seqs must be positive")
	case c.MaxNumBatchedTokens <= 0:
		return errors.New("sim: max_num_batched_tokens must be positive")
	case c.MaxModelLen <= 1:
		return errors.New("sim: max_model_len must exceed 1")
	case c.Speed <= 0:
		return errors.New("sim: speed must be positive")
	case c.Timing.Base < 0 || c.Timing.PrefillToken < 0 || c.Timing.DecodeSeq < 0 || c.Timing.Attention < 0:
		return errors.New("sim: timing parameters must not be negative")
	}
	return nil
}
