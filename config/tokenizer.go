package config

import "github.com/kvrouter/kvrouter/config/field"

// TokenizerConfig bounds the caches that make a conversation's next turn cheap to
// tokenize: each model's tokenizer prefix cache and its chat-template message cache.
type TokenizerConfig struct {
	// PrefixCacheBytes bounds each model's tokenization prefix cache (ids of a rendered
	// prompt's prefixes): 0 is the default, 64 MiB (about 14M tokens of history, 4.9 bytes
	// a token); negative turns it off.
	PrefixCacheBytes int64 `yaml:"prefix_cache_bytes"`
	// MessageCacheBytes bounds each model's cache of request messages converted for its
	// chat template and their rendered loop iterations: 0 is the default, 64 MiB (about
	// 4M tokens of history); negative turns it off.
	MessageCacheBytes int64 `yaml:"message_cache_bytes"`
}

// maxCacheBytes is the largest cache budget accepted: beyond it a typo (bytes meant as
// KiB) would be taken for a budget.
const maxCacheBytes = 64 << 30

// Validate checks the budgets.
func (c *TokenizerConfig) Validate() error {
	var errs field.Errors
	if c.PrefixCacheBytes > maxCacheBytes {
		errs.Addf("prefix_cache_bytes", "%d is above 64 GiB", c.PrefixCacheBytes)
	}
	if c.MessageCacheBytes > maxCacheBytes {
		errs.Addf("message_cache_bytes", "%d is above 64 GiB", c.MessageCacheBytes)
	}
	return errs.Err()
}
