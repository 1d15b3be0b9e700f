package index

import (
	"errors"
	"fmt"
)

// Config bounds the index's memory. The zero value is not valid; start from DefaultConfig.
type Config struct {
	// DefaultBlocksPerRank caps the blocks kept for one endpoint rank whose capacity was
	// never set with SetCapacity.
	DefaultBlocksPerRank int `yaml:"default_blocks_per_rank"`
	// Headroom multiplies an endpoint's num_gpu_blocks to give each rank's cap: a pod
	// never holds more than num_gpu_blocks, so anything past cap means lost removals or a
	// misbehaving publisher. Must be >= 1.
	Headroom float64 `yaml:"headroom"`
	// MaxBlocksPerRank caps every rank whatever num_gpu_blocks says.
	MaxBlocksPerRank int `yaml:"max_blocks_per_rank"`
}

// DefaultConfig returns the defaults: 262,144 blocks per rank until num_gpu_blocks is
// known (4M tokens at 16 per block, about 9 MiB of index), 10% headroom, and a hard cap of
// 4,194,304 blocks per rank.
func DefaultConfig() Config {
	return Config{DefaultBlocksPerRank: 1 << 18, Headroom: 1.1, MaxBlocksPerRank: 1 << 22}
}

// Validate reports every invalid field.
func (c Config) Validate() error {
	var errs []error
	if c.DefaultBlocksPerRank <= 0 {
		errs = append(errs, fmt.Errorf("index: default_blocks_per_rank must be > 0, got %d", c.DefaultBlocksPerRank))
	}
	if !(c.Headroom >= 1) {
		errs = append(errs, fmt.Errorf("index: headroom must be >= 1, got %v", c.Headroom))
	}
	if c.MaxBlocksPerRank <= 0 || c.MaxBlocksPerRank > maxRecords {
		errs = append(errs, fmt.Errorf("index: max_blocks_per_rank must be in [1, %d], got %d", maxRecords, c.MaxBlocksPerRank))
	}
	if c.MaxBlocksPerRank > 0 && c.DefaultBlocksPerRank > c.MaxBlocksPerRank {
		errs = append(errs, fmt.Errorf("index: default_blocks_per_rank (%d) exceeds max_blocks_per_rank (%d)",
			c.DefaultBlocksPerRank, c.MaxBlocksPerRank))
	}
	return errors.Join(errs...)
}
