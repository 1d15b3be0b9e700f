package prompt

import (
	"encoding/json"
	"fmt"

	"github.com/kvrouter/kvrouter/openai"
)

// Encode returns the ids vLLM computes for a completions prompt given as text, with or
// without the model's special tokens. With ChatTokens it lets a Builder stand in for
// vLLM's tokenizer in the simulated server (sim/server.Tokenizer and ChatPrompter).
func (b *Builder) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	raw, err := json.Marshal(text)
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	return b.PromptTokens(&openai.Request{Kind: openai.KindCompletions, Prompt: raw, AddSpecialTokens: addSpecialTokens})
}

// ChatTokens returns the ids vLLM computes for a chat request (PromptTokens for chat).
func (b *Builder) ChatTokens(req *openai.Request) ([]uint32, error) { return b.PromptTokens(req) }
