package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
)

// ErrNoTemplate is returned when a tokenizer config defines no chat template; vLLM
// then rejects chat requests for the model (unless started with --chat-template).
var ErrNoTemplate = errors.New("chattemplate: tokenizer config has no chat template")

// specialTokenNames are the keys of transformers' special_tokens_map, in its order.
var specialTokenNames = []string{
	"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
}

// TokenizerConfig is what a chat template needs from tokenizer_config.json.
type TokenizerConfig struct {
	// Template is the chat template source ("default" when the file holds a list of
	// named templates).
	Template string
	// ToolUseTemplate is the template named "tool_use", if any: transformers uses it
	// when the request has tools.
	ToolUseTemplate string
	// SpecialTokens is transformers' special_tokens_map: the set special tokens as
	// strings, additional_special_tokens as []string.
	SpecialTokens map[string]any
}

// ParseTokenizerConfig reads the chat template(s) and special tokens from the contents
// of a tokenizer_config.json. A separate chat_template.jinja file, when the model has
// one, takes precedence over Template (transformers loads it instead).
func ParseTokenizerConfig(data []byte) (*TokenizerConfig, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("chattemplate: tokenizer_config.json: %w", err)
	}
	c := &TokenizerConfig{SpecialTokens: map[string]any{}}
	if ct, ok := raw["chat_template"]; ok && string(ct) != "null" {
		if err := json.Unmarshal(ct, &c.Template); err != nil {
			var named []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err := json.Unmarshal(ct, &named); err != nil {
				return nil, fmt.Errorf("chattemplate: chat_template is neither a string nor a list of named templates: %w", err)
			}
			for _, n := range named {
				switch n.Name {
				case "default":
					c.Template = n.Template
				case "tool_use":
					c.ToolUseTemplate = n.Template
				}
			}
		}
	}
	for _, name := range specialTokenNames {
		if s, ok, err := tokenContent(raw[name]); err != nil {
			return nil, fmt.Errorf("chattemplate: %s: %w", name, err)
		} else if ok {
			c.SpecialTokens[name] = s
		}
	}
	if add, ok := raw["additional_special_tokens"]; ok && string(add) != "null" {
		var items []json.RawMessage
		if err := json.Unmarshal(add, &items); err != nil {
			return nil, fmt.Errorf("chattemplate: additional_special_tokens: %w", err)
		}
		list := make([]string, 0, len(items))
		for _, it := range items {
			s, ok, err := tokenContent(it)
			if err != nil {
				return nil, fmt.Errorf("chattemplate: additional_special_tokens: %w", err)
			}
			if ok {
				list = append(list, s)
			}
		}
		if len(list) > 0 {
			c.SpecialTokens["additional_special_tokens"] = list
		}
	}
	return c, nil
}

// tokenContent reads a token given as a string or as an AddedToken object.
func tokenContent(raw json.RawMessage) (string, bool, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true, nil
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.Content == nil {
		return "", false, errors.New("neither a string nor a token object")
	}
	return *obj.Content, true, nil
}
