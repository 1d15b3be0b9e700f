package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// UnsupportedError reports a tokenizer.json feature this package cannot reproduce
// exactly (another model type, normalizer, pre-tokenizer regex or post-processor).
// Callers route such models by load instead of by prefix.
type UnsupportedError struct {
	Component string // "model", "normalizer", "pre_tokenizer", "post_processor"
	Detail    string // what was found, e.g. `type "WordPiece"`
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("tokenizer: unsupported %s: %s", e.Component, e.Detail)
}

func unsupported(component, format string, args ...any) error {
	return &UnsupportedError{Component: component, Detail: fmt.Sprintf(format, args...)}
}

type fileJSON struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

type configJSON struct {
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// LoadDir loads dir/tokenizer.json and dir/tokenizer_config.json.
func LoadDir(dir string, opts ...Option) (*Tokenizer, error) {
	return Load(filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json"), opts...)
}

// Load loads a tokenizer from the paths of a tokenizer.json and a
// tokenizer_config.json. An empty config path means no config (no chat template, no
// BOS/EOS strings).
func Load(tokenizerJSON, tokenizerConfigJSON string, opts ...Option) (*Tokenizer, error) {
	tj, err := os.ReadFile(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var cj []byte
	if tokenizerConfigJSON != "" {
		if cj, err = os.ReadFile(tokenizerConfigJSON); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
	}
	return Parse(tj, cj, opts...)
}

// Parse builds a tokenizer from the contents of tokenizer.json and
// tokenizer_config.json (nil or empty config: none).
func Parse(tokenizerJSON, tokenizerConfigJSON []byte, opts ...Option) (*Tokenizer, error) {
	classOnce.Do(buildClasses)
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	// The model's vocab and merges are scanned by hand; the rest of the file goes
	// through encoding/json.
	top, err := fields(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	var f fileJSON
	if err := json.Unmarshal(object(top, "model"), &f); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	t := &Tokenizer{}
	if err := t.parseModel(top["model"]); err != nil {
		return nil, err
	}
	if err := t.parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.parseAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	if err := t.parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if len(tokenizerConfigJSON) > 0 {
		if err := t.parseConfig(tokenizerConfigJSON); err != nil {
			return nil, err
		}
	}
	if err := t.initCache(o); err != nil {
		return nil, err
	}
	return t, nil
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

func (t *Tokenizer) parseModel(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("tokenizer: tokenizer.json has no model")
	}
	var m modelJSON
	mf, err := fields(raw)
	if err == nil {
		err = json.Unmarshal(object(mf, "vocab", "merges"), &m)
	}
	if err != nil {
		return fmt.Errorf("tokenizer: model: %w", err)
	}
	m.Vocab, m.Merges = mf["vocab"], mf["merges"]
	switch {
	case m.Type != "BPE":
		return unsupported("model", "type %q (only byte-level BPE is supported)", m.Type)
	case m.Dropout != nil && *m.Dropout != 0:
		return unsupported("model", "BPE dropout %v", *m.Dropout)
	case m.ByteFallback:
		return unsupported("model", "BPE byte_fallback")
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return unsupported("model", "BPE continuing_subword_prefix %q", *m.ContinuingSubwordPrefix)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return unsupported("model", "BPE end_of_word_suffix %q", *m.EndOfWordSuffix)
	}
	if m.Vocab == nil || m.Merges == nil {
		return errors.New("tokenizer: model: BPE without vocab or merges")
	}
	vocab, err := scanVocab(m.Vocab)
	if err != nil {
		return fmt.Errorf("tokenizer: model %w", err)
	}
	maxID := uint32(0)
	for _, id := range vocab {
		maxID = max(maxID, id)
	}
	if len(vocab) > 0 && int(maxID) >= 4*len(vocab) {
		return fmt.Errorf("tokenizer: model vocab: ids up to %d for %d tokens", maxID, len(vocab))
	}
	t.model.ignoreMerges = m.IgnoreMerges
	byBytes := make(map[string]uint32, len(vocab))
	for tok, id := range vocab {
		b, ok := byteLevelDecode(tok)
		if !ok {
			return unsupported("model", "vocabulary token %q is not byte-level", tok)
		}
		byBytes[string(b)] = id
	}
	t.model.vocab = newVocab(byBytes)
	t.vocabSize = t.model.vocab.size()
	for c := 0; c < 256; c++ {
		id, ok := t.model.vocab.get(string([]byte{byte(c)}))
		if !ok {
			return unsupported("model", "vocabulary lacks the byte-level token for byte 0x%02x", c)
		}
		t.model.byteID[c] = id
	}
	pairs, err := scanMerges(m.Merges)
	if err != nil {
		return fmt.Errorf("tokenizer: model %w", err)
	}
	t.model.merges = newMergeTable(len(pairs))
	for rank, p := range pairs {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		ab, okAB := vocab[p[0]+p[1]]
		if !okA || !okB || !okAB {
			return fmt.Errorf("tokenizer: model merges: entry %d (%q %q) uses a token missing from the vocabulary", rank, p[0], p[1])
		}
		// A repeated pair keeps its first (lowest) rank, as in HF.
		t.model.merges.add(uint64(a)<<32|uint64(b), merge{rank: uint32(rank), id: ab})
	}
	if !t.model.ignoreMerges {
		t.model.precomputeWhole()
	}
	return nil
}

// vocabID looks up a byte-level token string in the model vocabulary.
func (t *Tokenizer) vocabID(tok string) (uint32, bool) {
	b, ok := byteLevelDecode(tok)
	if !ok {
		return 0, false
	}
	return t.model.vocab.get(string(b))
}

func (t *Tokenizer) parseNormalizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("tokenizer: normalizer: %w", err)
	}
	switch n.Type {
	case "NFC":
		t.nfc = true
		return nil
	case "Sequence":
		for _, sub := range n.Normalizers {
			if err := t.parseNormalizer(sub); err != nil {
				return err
			}
		}
		return nil
	}
	return unsupported("normalizer", "type %q (only NFC and Sequence are supported)", n.Type)
}

type preTokJSON struct {
	Type           string            `json:"type"`
	Pretokenizers  []json.RawMessage `json:"pretokenizers"`
	Pattern        map[string]string `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
}

func (t *Tokenizer) parsePreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return unsupported("pre_tokenizer", "none (byte-level BPE needs ByteLevel)")
	}
	var list []json.RawMessage
	var p preTokJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("tokenizer: pre_tokenizer: %w", err)
	}
	if p.Type == "Sequence" {
		list = p.Pretokenizers
	} else {
		list = []json.RawMessage{raw}
	}
	byteLevel := false
	for _, r := range list {
		var p preTokJSON
		if err := json.Unmarshal(r, &p); err != nil {
			return fmt.Errorf("tokenizer: pre_tokenizer: %w", err)
		}
		switch p.Type {
		case "Split":
			if t.split != splitNone || byteLevel {
				return unsupported("pre_tokenizer", "more than one splitting pre-tokenizer")
			}
			if p.Behavior != "Isolated" || p.Invert {
				return unsupported("pre_tokenizer", "Split behavior %q invert %v", p.Behavior, p.Invert)
			}
			re, ok := p.Pattern["Regex"]
			switch {
			case !ok:
				return unsupported("pre_tokenizer", "Split pattern %v (only the known regexes are supported)", p.Pattern)
			case re == patternQwen2:
				t.split = splitQwen2
			case re == patternLlama3:
				t.split = splitLlama3
			default:
				return unsupported("pre_tokenizer", "Split regex %q", re)
			}
		case "ByteLevel":
			if byteLevel {
				return unsupported("pre_tokenizer", "two ByteLevel pre-tokenizers")
			}
			byteLevel = true
			if p.AddPrefixSpace {
				return unsupported("pre_tokenizer", "ByteLevel add_prefix_space")
			}
			if p.UseRegex == nil || *p.UseRegex {
				if t.split != splitNone {
					return unsupported("pre_tokenizer", "ByteLevel use_regex after a Split")
				}
				t.split = splitGPT2
			}
		default:
			return unsupported("pre_tokenizer", "type %q", p.Type)
		}
	}
	if !byteLevel {
		return unsupported("pre_tokenizer", "no ByteLevel pre-tokenizer")
	}
	return nil
}

func (t *Tokenizer) parseAdded(tokens []addedToken) error {
	var raw, normalized []addedToken
	t.added = make(map[string]uint32, len(tokens))
	t.addedByID = make(map[uint32]string, len(tokens))
	for _, a := range tokens {
		if a.Content == "" {
			return fmt.Errorf("tokenizer: added token %d has empty content", a.ID)
		}
		t.added[a.Content] = a.ID
		t.addedByID[a.ID] = a.Content
		t.vocabSize = max(t.vocabSize, int(a.ID)+1)
		if a.Normalized {
			normalized = append(normalized, a)
		} else {
			raw = append(raw, a)
		}
	}
	t.rawMatcher = newMatcher(raw)
	t.normMatcher = newMatcher(normalized)
	return nil
}

type postJSON struct {
	Type       string            `json:"type"`
	Processors []json.RawMessage `json:"processors"`
	Single     []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
}

func (t *Tokenizer) parsePostProcessor(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var p postJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("tokenizer: post_processor: %w", err)
	}
	switch p.Type {
	case "ByteLevel":
		return nil // changes offsets only
	case "Sequence":
		for _, sub := range p.Processors {
			if err := t.parsePostProcessor(sub); err != nil {
				return err
			}
		}
		return nil
	case "TemplateProcessing":
		if len(t.prefix) > 0 || len(t.suffix) > 0 {
			return unsupported("post_processor", "two TemplateProcessing steps")
		}
		seen := false
		for _, piece := range p.Single {
			switch {
			case piece.Sequence != nil:
				if seen || piece.Sequence.ID != "A" {
					return unsupported("post_processor", "TemplateProcessing single sequence %q", piece.Sequence.ID)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := p.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("tokenizer: post_processor: special token %q is not in special_tokens", piece.SpecialToken.ID)
				}
				if seen {
					t.suffix = append(t.suffix, st.IDs...)
				} else {
					t.prefix = append(t.prefix, st.IDs...)
				}
			default:
				return unsupported("post_processor", "TemplateProcessing piece of unknown kind")
			}
		}
		if !seen {
			return unsupported("post_processor", "TemplateProcessing single template without $A")
		}
		return nil
	}
	return unsupported("post_processor", "type %q", p.Type)
}

// tokenString reads bos_token/eos_token: a string, an addedToken object or null.
func tokenString(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", err
	}
	return obj.Content, nil
}

func (t *Tokenizer) parseConfig(raw []byte) error {
	var c configJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("tokenizer: tokenizer_config.json: %w", err)
	}
	var err error
	if t.bos, err = tokenString(c.BOS); err != nil {
		return fmt.Errorf("tokenizer: tokenizer_config.json bos_token: %w", err)
	}
	if t.eos, err = tokenString(c.EOS); err != nil {
		return fmt.Errorf("tokenizer: tokenizer_config.json eos_token: %w", err)
	}
	if !isNull(c.ChatTemplate) {
		if err := json.Unmarshal(c.ChatTemplate, &t.chatTemplate); err != nil {
			// A list of named templates: transformers uses the one named "default".
			var named []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err2 := json.Unmarshal(c.ChatTemplate, &named); err2 != nil {
				return fmt.Errorf("tokenizer: tokenizer_config.json chat_template: %w", err)
			}
			for _, n := range named {
				if n.Name == "default" {
					t.chatTemplate = n.Template
				}
			}
		}
	}
	return nil
}
