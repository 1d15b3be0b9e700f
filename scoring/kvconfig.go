package scoring

import (
	"math"

	"github.com/kvrouter/kvrouter/config/field"
)

// KVConfig weighs cached blocks against the load already on an endpoint, in the form of
// NVIDIA Dynamo's KV router cost (lib/kv-router, selector/default.rs), for the kv and
// approximate policies. Per candidate, lowest wins:
//
//	cost = PrefillLoadScale x max(0, active_prefill_blocks + request_blocks - OverlapCredit x overlap_blocks)
//	     + decode_blocks
//	     + DecodeActiveRequestWeight x active_requests
//
// active_prefill_blocks is the uncached prompt tokens of the endpoint's in-flight requests
// that have not produced a first token, over the block size; request_blocks is this
// prompt's tokens over the block size; overlap_blocks is the prompt's leading blocks the
// endpoint holds; decode_blocks is the endpoint's active footprint if the request joins:
// the full blocks of its in-flight requests counted once per distinct block, plus this
// request's blocks not already among them. The defaults are Dynamo's.
type KVConfig struct {
	// PrefillLoadScale weighs the prefill term (Dynamo's prefill_load_scale, formerly
	// overlap_score_weight). Default 1.
	PrefillLoadScale float64 `yaml:"prefill_load_scale"`
	// OverlapCredit is the share of a cached block subtracted from the prefill term, in
	// [0, 1] (Dynamo's overlap_score_credit). Default 1.
	OverlapCredit float64 `yaml:"overlap_credit"`
	// DecodeActiveRequestWeight adds a cost per in-flight request. Default 0.
	DecodeActiveRequestWeight float64 `yaml:"decode_active_request_weight"`
	// Temperature 0 picks the lowest cost (exact ties at random); above 0 it samples a
	// softmax over the costs normalised to [0, 1] (Dynamo's router_temperature). Default 0.
	Temperature float64 `yaml:"temperature"`
	// BlockSize is used for an endpoint whose scraped block size is unknown: the served
	// model's models.*.block_size, set by the runner. Default 16.
	BlockSize int `yaml:"-"`
	// ApproxBlocks sizes an endpoint's predicted cache (approximate policy, and the kv
	// policy's fallback for endpoints whose events are not flowing) when its
	// num_gpu_blocks is unknown: kv.approx_blocks, set by the runner. Default 4096.
	ApproxBlocks int `yaml:"-"`
	// MaxTracked bounds the requests followed between Pick and Finished, so that requests
	// whose Finished never comes cannot grow the policy without limit: kv.max_tracked,
	// set by the runner. Default 65536.
	MaxTracked int `yaml:"-"`
}

// DefaultKVConfig returns Dynamo's defaults (prefill_load_scale 1, overlap credit 1,
// decode_active_request_weight 0, temperature 0) and kvrouter's for the rest.
func DefaultKVConfig() KVConfig {
	return KVConfig{
		PrefillLoadScale:          1,
		OverlapCredit:             1,
		DecodeActiveRequestWeight: 0,
		Temperature:               0,
		BlockSize:                 16,
		ApproxBlocks:              4096,
		MaxTracked:                65536,
	}
}

// Validate reports every invalid field, each weight with its YAML name as the path.
func (c KVConfig) Validate() error {
	var errs field.Errors
	finite := func(name string, v float64) bool {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			errs.Addf(name, "must be finite, got %v", v)
			return false
		}
		return true
	}
	if finite("prefill_load_scale", c.PrefillLoadScale) && c.PrefillLoadScale < 0 {
		errs.Addf("prefill_load_scale", "must be >= 0, got %v", c.PrefillLoadScale)
	}
	if finite("overlap_credit", c.OverlapCredit) && (c.OverlapCredit < 0 || c.OverlapCredit > 1) {
		errs.Addf("overlap_credit", "must be in [0, 1] (the share of a cached block credited), got %v", c.OverlapCredit)
	}
	if finite("decode_active_request_weight", c.DecodeActiveRequestWeight) && c.DecodeActiveRequestWeight < 0 {
		errs.Addf("decode_active_request_weight", "must be >= 0, got %v", c.DecodeActiveRequestWeight)
	}
	if finite("temperature", c.Temperature) && c.Temperature < 0 {
		errs.Addf("temperature", "must be >= 0, got %v", c.Temperature)
	}
	if c.BlockSize <= 0 {
		errs.Addf("", "block_size must be > 0, got %d", c.BlockSize)
	}
	if c.ApproxBlocks <= 0 {
		errs.Addf("", "approx_blocks must be > 0, got %d", c.ApproxBlocks)
	}
	if c.MaxTracked <= 0 {
		errs.Addf("", "max_tracked must be > 0, got %d", c.MaxTracked)
	}
	return errs.Err()
}
