package config

import (
	"encoding/json"

	"github.com/kvrouter/kvrouter/config/field"
)

// ModelConfig says how the router tokenizes prompts for one base model: either a
// Hugging Face model directory, or the paths of its two tokenizer files. Relative paths
// are relative to the configuration file's directory.
type ModelConfig struct {
	// Tokenizer is a directory holding tokenizer.json and tokenizer_config.json.
	Tokenizer string `yaml:"tokenizer"`
	// TokenizerJSON and TokenizerConfig name the two files directly (both or neither).
	TokenizerJSON   string `yaml:"tokenizer_json"`
	TokenizerConfig string `yaml:"tokenizer_config"`
	// BlockSize is the number of tokens per KV block, as the model's vLLM servers run with
	// (default 16). An endpoint's scraped cache_config_info block_size takes precedence.
	BlockSize int `yaml:"block_size"`
	// DefaultChatTemplateKwargs mirrors the servers' --default-chat-template-kwargs: a
	// JSON object merged under every request's chat_template_kwargs (default: none).
	DefaultChatTemplateKwargs string `yaml:"default_chat_template_kwargs"`
}

// DefaultBlockSize is vLLM's default KV block size.
const DefaultBlockSize = 16

// SetDefaults fills the defaults of a model entry (block size 16).
func (m *ModelConfig) SetDefaults() { m.BlockSize = DefaultBlockSize }

// Validate checks that the tokenizer is named exactly one way and the block size.
func (m *ModelConfig) Validate() error {
	var errs field.Errors
	files := m.TokenizerJSON != "" || m.TokenizerConfig != ""
	switch {
	case m.Tokenizer != "" && files:
		errs.Addf("tokenizer", "set either tokenizer (a directory) or tokenizer_json and tokenizer_config, not both")
	case m.Tokenizer == "" && !files:
		errs.Addf("tokenizer", "is required (a directory), or set tokenizer_json and tokenizer_config")
	case files && m.TokenizerJSON == "":
		errs.Addf("tokenizer_json", "is required with tokenizer_config")
	case files && m.TokenizerConfig == "":
		errs.Addf("tokenizer_config", "is required with tokenizer_json")
	}
	if m.BlockSize < 1 || m.BlockSize > 4096 {
		errs.Addf("block_size", "%d is out of range [1, 4096]", m.BlockSize)
	}
	if m.DefaultChatTemplateKwargs != "" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(m.DefaultChatTemplateKwargs), &obj); err != nil || obj == nil {
			errs.Addf("default_chat_template_kwargs", "must be a JSON object")
		}
	}
	return errs.Err()
}
