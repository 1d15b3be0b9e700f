package tokenizer_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/tokenizer"
)

// FuzzEncode checks on arbitrary input that encoding never panics, that the prefix
// cache changes nothing, and that decoding gives the (UTF-8-sanitised) input back
// (the tiny tokenizer has no normalizer), for the Qwen2 and GPT-2 pre-tokenizers.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"hello world", "<|x|>he<|xy|>", "  \n\r\n\t x", "'S 'll 'ſ", "١٢٣ 12345", "a\u0301\u0338", "\xff\xfe", "👩🏽‍🚀 🇫🇷", strings.Repeat("ab", 100)} {
		f.Add(s)
	}
	gpt2 := func(doc map[string]any) {
		doc["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}
	}
	added := []string{"<|x|>", "<|xy|>", "he"}
	tks := [][2]*tokenizer.Tokenizer{
		{tiny(f, helloMerges, added, nil), tiny(f, helloMerges, added, nil, tokenizer.WithPrefixCache(0))},
		{tiny(f, helloMerges, added, gpt2, tokenizer.WithPrefixCache(2048)), tiny(f, helloMerges, added, gpt2, tokenizer.WithPrefixCache(0))},
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := strings.ToValidUTF8(s, "\uFFFD")
		for _, pair := range tks {
			a := pair[0].Encode(s, true)
			b := pair[0].Encode(s, true) // possibly from the cache now
			c := pair[1].Encode(s, true)
			if !slices.Equal(a, b) || !slices.Equal(a, c) {
				t.Fatalf("ids differ with the cache: %v %v %v", a, b, c)
			}
			if got := pair[0].Decode(a); got != want {
				t.Fatalf("Decode(Encode(%q)) = %q", s, got)
			}
		}
	})
}

// FuzzParse checks that arbitrary tokenizer.json and tokenizer_config.json contents
// give an error or a working tokenizer, never a panic.
func FuzzParse(f *testing.F) {
	// Seeds stay small: a valid tokenizer.json is >= 4 KB, which makes the fuzzer spend
	// its time minimising; FuzzParseConfig covers the config with a valid tokenizer.
	f.Add([]byte(`{"model":{"type":"WordPiece"}}`), []byte(`{}`))
	f.Add([]byte(`{"normalizer":{"type":"Sequence","normalizers":[{"type":"NFC"}]},"model":{"type":"BPE","vocab":{},"merges":[["a","b"]]}}`), []byte(nil))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]},"pre_tokenizer":{"type":"ByteLevel"}}`), []byte(nil))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"\u0041":4000000000},"merges":[]}}`), []byte(nil))
	f.Fuzz(func(t *testing.T, tok, cfg []byte) {
		tk, err := tokenizer.Parse(tok, cfg)
		if err != nil {
			return
		}
		ids := tk.Encode("hello <s> world 123", true)
		_ = tk.Decode(ids)
	})
}

// FuzzParseConfig fuzzes tokenizer_config.json beside a valid tokenizer.json.
func FuzzParseConfig(f *testing.F) {
	tok := tinyJSON(f, helloMerges, []string{"<s>"}, nil)
	for _, c := range []string{`{"bos_token":"<s>","eos_token":{"content":"</s>"},"chat_template":"{{ x }}"}`,
		`{"chat_template":[{"name":"default","template":"D"}]}`, `{"bos_token":null}`, `[]`} {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, cfg []byte) {
		tk, err := tokenizer.Parse(tok, cfg)
		if err != nil {
			return
		}
		_ = tk.BOS() + tk.EOS() + tk.ChatTemplate()
	})
}

// FuzzEncodeModels runs the real Qwen3 and Llama 3 tokenizers on arbitrary input:
// no panic, the same ids with and without the prefix cache, and for Llama 3 (no
// normalizer) decoding gives the input back.
func FuzzEncodeModels(f *testing.F) {
	for _, s := range []string{"<|im_start|>user\nHi<|im_end|>", "'S  \u00a0\r\n x", "a\u0338>\u0338<|endoftext|>\u0301", "👩🏽‍🚀", strings.Repeat("=", 200)} {
		f.Add(s)
	}
	type pair struct{ cached, plain *tokenizer.Tokenizer }
	var tks []pair
	for _, name := range []string{"qwen3", "llama3"} {
		tk := model(f, name)
		plain, err := tk.Derive(tokenizer.WithPrefixCache(0))
		if err != nil {
			f.Fatal(err)
		}
		cached, err := tk.Derive(tokenizer.WithPrefixCache(64 << 10))
		if err != nil {
			f.Fatal(err)
		}
		tks = append(tks, pair{cached, plain})
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i, p := range tks {
			a, b, c := p.cached.Encode(s, true), p.cached.Encode(s, true), p.plain.Encode(s, true)
			if !slices.Equal(a, b) || !slices.Equal(a, c) {
				t.Fatalf("model %d: ids differ with the cache: %v %v %v", i, a, b, c)
			}
			if i == 1 {
				if got, want := p.plain.Decode(c), strings.ToValidUTF8(s, "\uFFFD"); got != want {
					t.Fatalf("llama3: Decode(Encode(%q)) = %q", s, got)
				}
			}
		}
	})
}

// FuzzPrefixCache: texts sharing a fuzzed prefix, with added tokens whose flags make
// some splits inexact (lstrip, single_word, rstrip, tokens starting with a word
// character or a space, tokens containing another), give the same ids from a warm
// prefix cache as without one.
func FuzzPrefixCache(f *testing.F) {
	for _, s := range [][2]string{{"hello <R>  ", "<|s|>y"}, {"hellox", "<|s|> wd>"}, {"he <sp>", "<L> x<W>"}, {"aa<|s|>bb", "<|s|>"},
		{strings.Repeat("hello world ", 12), "ha"}, {"aa[e]" + strings.Repeat("hello ", 20), "[s]y b"}} {
		f.Add(s[0], s[1])
	}
	added := []string{"<|s|>", "<L>", "<W>", "x<|s|>", "<|s|>y", " <sp>", "wd>", "<R>"}
	flags := func(doc map[string]any) {
		for _, a := range doc["added_tokens"].([]map[string]any) {
			switch a["content"] {
			case "<L>":
				a["lstrip"] = true
			case "<W>":
				a["single_word"] = true
			case "<R>":
				a["rstrip"] = true
			}
		}
	}
	cached := tiny(f, helloMerges, added, flags, tokenizer.WithPrefixCache(1<<16))
	plain := tiny(f, helloMerges, added, flags, tokenizer.WithPrefixCache(0))
	// Tokens the cache walks its chain at ("[s]", "[e]": no token holds '[' further
	// in), beside tokens it does not walk at and longer tokens around them.
	walked := []string{"[s]", "[e]", "<|s|>", "a<|s|>b", "[s]y", "<W>"}
	walkCached := tiny(f, helloMerges, walked, flags, tokenizer.WithPrefixCache(1<<16))
	walkPlain := tiny(f, helloMerges, walked, flags, tokenizer.WithPrefixCache(0))
	f.Fuzz(func(t *testing.T, prefix, tail string) {
		for _, text := range []string{prefix + "<|s|>", prefix + tail, prefix + "<|s|>" + tail, prefix + tail + "<|s|>" + prefix} {
			if got, want := cached.Encode(text, true), plain.Encode(text, true); !slices.Equal(got, want) {
				t.Fatalf("%q: cached ids %v, want %v", text, got, want)
			}
		}
		// A growing conversation: each text continues the previous one.
		text := ""
		for _, part := range []string{"[s]" + prefix + "[e]", "[s]" + tail + "[e]", "[s]" + prefix + tail + "[e]", "[s]" + tail} {
			text += part
			for _, tt := range []string{text, text + "[s]", text + "a<|s|>b"} {
				if got, want := walkCached.Encode(tt, false), walkPlain.Encode(tt, false); !slices.Equal(got, want) {
					t.Fatalf("%q: cached ids %v, want %v", tt, got, want)
				}
			}
		}
	})
}
