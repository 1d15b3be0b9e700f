package tokenizer_test

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// loaded caches the real models across tests: loading one takes most of a second.
var loaded sync.Map // model name -> *tokenizer.Tokenizer

// model returns the shared tokenizer of a fetched model (default options).
func model(t testing.TB, name string) *tokenizer.Tokenizer {
	t.Helper()
	dir := testmodels.Dir(t, name)
	if tk, ok := loaded.Load(name); ok {
		return tk.(*tokenizer.Tokenizer)
	}
	tk, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	loaded.Store(name, tk)
	return tk
}

// byteLevel is GPT-2's bytes_to_unicode, written out independently of the package.
func byteLevel(b byte) string {
	switch {
	case b >= '!' && b <= '~', b >= 0xA1 && b <= 0xAC, b >= 0xAE:
		return string(rune(b))
	}
	n := 0
	for c := 0; c < int(b); c++ {
		if !(c >= '!' && c <= '~' || c >= 0xA1 && c <= 0xAC || c >= 0xAE) {
			n++
		}
	}
	return string(rune(256 + n))
}

func bl(s string) string {
	out := ""
	for i := 0; i < len(s); i++ {
		out += byteLevel(s[i])
	}
	return out
}

// tinyJSON builds a small byte-level BPE tokenizer.json: the 256 byte tokens (id =
// byte value), then one token per merge in order (ids 256...), the Qwen2 Split regex
// and optional added tokens (ids 1000...). edit may change the document.
func tinyJSON(t testing.TB, merges [][2]string, added []string, edit func(doc map[string]any)) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[byteLevel(byte(b))] = b
	}
	var ms [][2]string
	for i, m := range merges {
		vocab[bl(m[0]+m[1])] = 256 + i
		ms = append(ms, [2]string{bl(m[0]), bl(m[1])})
	}
	var at []map[string]any
	for i, a := range added {
		at = append(at, map[string]any{"id": 1000 + i, "content": a, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
	}
	doc := map[string]any{
		"version":      "1.0",
		"added_tokens": at,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`},
				"behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}},
		"post_processor": nil,
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "",
			"end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": ms},
	}
	if edit != nil {
		edit(doc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tiny(t testing.TB, merges [][2]string, added []string, edit func(map[string]any), opts ...tokenizer.Option) *tokenizer.Tokenizer {
	t.Helper()
	tk, err := tokenizer.Parse(tinyJSON(t, merges, added, edit), nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}
