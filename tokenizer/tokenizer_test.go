package tokenizer_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/tokenizer"
)

var helloMerges = [][2]string{{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}, {"a", "a"}}

func TestEncodeTiny(t *testing.T) {
	tk := tiny(t, helloMerges, []string{"<|x|>", "<|xy|>"}, nil)
	cases := []struct {
		name string
		text string
		want []uint32
	}{
		// h e l l o: (h,e) rank 0, then (l,l) rank 1, then (he,ll) rank 2.
		{"merges by rank", "hello", []uint32{258, 'o'}},
		{"leftmost on ties", "aaa", []uint32{260, 'a'}},
		{"pre-tokenizer keeps the space with the word", " world", []uint32{259, 'o', 'r', 'l', 'd'}},
		{"added token split first", "he<|x|>he", []uint32{256, 1000, 256}},
		{"added tokens leftmost-longest", "<|xy|><|x|>", []uint32{1001, 1000}},
		{"partial added token is text", "<|x", []uint32{'<', '|', 'x'}},
		{"digits one by one", "12", []uint32{'1', '2'}},
		{"empty", "", nil},
		{"invalid UTF-8 becomes U+FFFD", "\xff", []uint32{0xEF, 0xBF, 0xBD}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := tk.Encode(c.text, false)
			if !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
				t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
			}
			dst := append(make([]uint32, 0, 16), 5, 6)
			if got := tk.AppendEncode(dst, c.text, false); !slices.Equal(got, append([]uint32{5, 6}, c.want...)) {
				t.Errorf("AppendEncode([5 6], %q) = %v, want [5 6] + %v", c.text, got, c.want)
			}
		})
	}
}

func TestPostProcessorTemplate(t *testing.T) {
	tk := tiny(t, helloMerges, []string{"<s>", "</s>"}, func(doc map[string]any) {
		doc["post_processor"] = map[string]any{"type": "TemplateProcessing",
			"single": []any{
				map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
				map[string]any{"SpecialToken": map[string]any{"id": "</s>", "type_id": 0}},
			},
			"special_tokens": map[string]any{
				"<s>":  map[string]any{"id": "<s>", "ids": []int{1000}, "tokens": []string{"<s>"}},
				"</s>": map[string]any{"id": "</s>", "ids": []int{1001}, "tokens": []string{"</s>"}},
			}}
	})
	if got, want := tk.Encode("hello", true), []uint32{1000, 258, 'o', 1001}; !slices.Equal(got, want) {
		t.Errorf("with special tokens: %v, want %v", got, want)
	}
	if got, want := tk.Encode("hello", false), []uint32{258, 'o'}; !slices.Equal(got, want) {
		t.Errorf("without special tokens: %v, want %v", got, want)
	}
}

func TestUnsupported(t *testing.T) {
	set := func(path []string, v any) func(map[string]any) {
		return func(doc map[string]any) {
			m := doc
			for _, k := range path[:len(path)-1] {
				m = m[k].(map[string]any)
			}
			m[path[len(path)-1]] = v
		}
	}
	cases := []struct {
		name      string
		edit      func(map[string]any)
		component string
	}{
		{"WordPiece model", set([]string{"model", "type"}, "WordPiece"), "model"},
		{"Unigram model", set([]string{"model", "type"}, "Unigram"), "model"},
		{"byte fallback", set([]string{"model", "byte_fallback"}, true), "model"},
		{"NFKC normalizer", set([]string{"normalizer"}, map[string]any{"type": "NFKC"}), "normalizer"},
		{"Lowercase in a Sequence", set([]string{"normalizer"}, map[string]any{"type": "Sequence",
			"normalizers": []any{map[string]any{"type": "NFC"}, map[string]any{"type": "Lowercase"}}}), "normalizer"},
		{"unknown Split regex", func(doc map[string]any) {
			doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"] =
				map[string]any{"Regex": `\w+|\s+`}
		}, "pre_tokenizer"},
		{"Metaspace pre-tokenizer", set([]string{"pre_tokenizer"}, map[string]any{"type": "Metaspace"}), "pre_tokenizer"},
		{"no pre-tokenizer", set([]string{"pre_tokenizer"}, nil), "pre_tokenizer"},
		{"Roberta post-processor", set([]string{"post_processor"}, map[string]any{"type": "RobertaProcessing"}), "post_processor"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := tokenizer.Parse(tinyJSON(t, helloMerges, nil, c.edit), nil)
			var ue *tokenizer.UnsupportedError
			if !errors.As(err, &ue) {
				t.Fatalf("err = %v, want *UnsupportedError", err)
			}
			if ue.Component != c.component {
				t.Errorf("component %q, want %q (%v)", ue.Component, c.component, err)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", string(tinyJSON(t, helloMerges, nil, nil)))
	cases := []struct {
		name        string
		tok, config string
	}{
		{"missing tokenizer.json", filepath.Join(dir, "nope.json"), ""},
		{"missing config", good, filepath.Join(dir, "nope_config.json")},
		{"tokenizer.json not JSON", write("bad.json", "{"), ""},
		{"no model", write("nomodel.json", `{"pre_tokenizer":{"type":"ByteLevel"}}`), ""},
		{"vocab not an object", write("badvocab.json", `{"pre_tokenizer":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":[1],"merges":[]}}`), ""},
		{"merge of unknown tokens", write("badmerge.json", strings.Replace(string(tinyJSON(t, helloMerges, nil, nil)), `"merges":[`, `"merges":[["zz","qq"],`, 1)), ""},
		{"config not JSON", good, write("bad_config.json", "[")},
		{"bos_token of the wrong type", good, write("bos_config.json", `{"bos_token": 7}`)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if tk, err := tokenizer.Load(c.tok, c.config); err == nil {
				t.Fatalf("Load succeeded (%v), want an error", tk)
			}
		})
	}
	if _, err := tokenizer.Parse(nil, nil); err == nil {
		t.Error("Parse(nil, nil) succeeded")
	}
	if _, err := tokenizer.LoadDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("LoadDir of a missing directory succeeded")
	}
	if _, err := tokenizer.Parse(tinyJSON(t, helloMerges, nil, nil), nil, tokenizer.WithPrefixCache(-1)); err == nil {
		t.Error("negative cache size accepted")
	}
}

func TestConfig(t *testing.T) {
	cases := []struct {
		name, config           string
		bos, eos, chatTemplate string
	}{
		{"strings", `{"bos_token":"<s>","eos_token":"</s>","chat_template":"{{ x }}"}`, "<s>", "</s>", "{{ x }}"},
		{"objects and null", `{"bos_token":null,"eos_token":{"content":"<|im_end|>","lstrip":false}}`, "", "<|im_end|>", ""},
		{"named templates", `{"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]}`, "", "", "D"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tk, err := tokenizer.Parse(tinyJSON(t, helloMerges, nil, nil), []byte(c.config))
			if err != nil {
				t.Fatal(err)
			}
			if tk.BOS() != c.bos || tk.EOS() != c.eos || tk.ChatTemplate() != c.chatTemplate {
				t.Errorf("BOS %q EOS %q template %q, want %q %q %q", tk.BOS(), tk.EOS(), tk.ChatTemplate(), c.bos, c.eos, c.chatTemplate)
			}
		})
	}
}

func TestRealModels(t *testing.T) {
	cases := []struct {
		model       string
		bos, eos    string
		ids         map[string]uint32
		hasTemplate bool
		text        string
		wantIDs     []uint32
	}{
		{"qwen3", "", "<|im_end|>", map[string]uint32{"<|im_end|>": 151645, "<think>": 151667, "Hello": 9707, "Ġworld": 1879},
			true, "Hello world", []uint32{9707, 1879}},
		{"llama3", "<|begin_of_text|>", "<|end_of_text|>", map[string]uint32{"<|begin_of_text|>": 128000, "Hello": 9906, "Ġworld": 1917},
			true, "Hello world", []uint32{9906, 1917}},
	}
	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			tk := model(t, c.model)
			if tk.BOS() != c.bos || tk.EOS() != c.eos {
				t.Errorf("BOS %q EOS %q, want %q %q", tk.BOS(), tk.EOS(), c.bos, c.eos)
			}
			if (tk.ChatTemplate() != "") != c.hasTemplate {
				t.Errorf("chat template present = %v, want %v", tk.ChatTemplate() != "", c.hasTemplate)
			}
			for s, want := range c.ids {
				if id, ok := tk.TokenID(s); !ok || id != want {
					t.Errorf("TokenID(%q) = %d, %v; want %d", s, id, ok, want)
				}
			}
			if _, ok := tk.TokenID("no such token ☃☃☃"); ok {
				t.Error("TokenID found a token that does not exist")
			}
			if got := tk.Encode(c.text, false); !slices.Equal(got, c.wantIDs) {
				t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.wantIDs)
			}
		})
	}
}

// TestDecodeRoundTrip: Llama 3 has no normalizer, so decoding must give the input back.
func TestDecodeRoundTrip(t *testing.T) {
	tk := model(t, "llama3")
	corpus := readJSONL[corpusEntry](t, "corpus.jsonl.gz")
	bad := 0
	for i := 0; i < len(corpus); i += 3 {
		e := corpus[i]
		if got := tk.Decode(tk.Encode(e.Text, true)); got != e.Text {
			if bad++; bad < 5 {
				t.Errorf("Decode(Encode(%q)) = %q", e.Text, got)
			}
		}
	}
	if got := tk.Decode([]uint32{1 << 30}); got != "" {
		t.Errorf("unknown id decoded to %q", got)
	}
}

// conversationTexts renders, for the given model's special tokens, the texts of the
// successive turns of conversations whose messages are corpus strings: each turn
// re-sends the whole history plus a new message, as chat clients do.
func conversationTexts(model string, corpus []corpusEntry, stride int) []string {
	open, mid, end, gen := "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n"
	if model == "llama3" {
		open, mid, end, gen = "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n"
	}
	system := strings.Repeat("You are a helpful assistant. Answer in JSON: {\"a\": 1}.\n", 60)
	var texts []string
	history := open + "system" + mid + system + end
	for i := 0; i < len(corpus); i += stride {
		if i%(stride*6) == 0 { // a new conversation every 6 messages
			history = open + "system" + mid + system + end
		}
		role := []string{"user", "assistant"}[(i/stride)%2]
		history += open + role + mid + corpus[i].Text + end
		texts = append(texts, corpus[i].Text, history+gen)
	}
	return texts
}

// TestCacheIdentical checks that the prefix cache changes nothing: ids with a cache
// (cold and warm, large and so small it evicts all the time, from many goroutines at
// once) equal ids without one, on texts whose pieces are the golden corpus strings
// (every added token, partial tokens, unicode edge cases) arranged as growing
// conversations.
func TestCacheIdentical(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			plain := model(t, name)
			reg := prometheus.NewPedanticRegistry()
			m := tokenizer.NewMetrics(reg)
			large, err := plain.Derive(tokenizer.WithPrefixCache(64<<20), tokenizer.WithMetrics(m, name))
			if err != nil {
				t.Fatal(err)
			}
			small, err := plain.Derive(tokenizer.WithPrefixCache(16 << 10))
			if err != nil {
				t.Fatal(err)
			}
			off, err := plain.Derive(tokenizer.WithPrefixCache(0))
			if err != nil {
				t.Fatal(err)
			}
			texts := conversationTexts(name, readJSONL[corpusEntry](t, "corpus.jsonl.gz"), 25)
			want := make([][]uint32, len(texts))
			for i, s := range texts {
				want[i] = off.Encode(s, i%3 == 0)
			}
			var wg sync.WaitGroup
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for pass := 0; pass < 2; pass++ {
						for i := g % 2; i < len(texts); i += 2 {
							for _, tk := range []*tokenizer.Tokenizer{large, small} {
								if got := tk.Encode(texts[i], i%3 == 0); !slices.Equal(got, want[i]) {
									t.Errorf("cached ids differ for %q", texts[i])
									return
								}
							}
						}
					}
				}()
			}
			wg.Wait()
			if hits, misses := lookups(t, reg, "hit"), lookups(t, reg, "miss"); hits == 0 || misses == 0 {
				t.Errorf("cache hits %v misses %v: want both > 0", hits, misses)
			}
		})
	}
}

// lookups sums kvrouter_tokenizer_prefix_cache_lookups_total{result} in reg.
func lookups(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "kvrouter_tokenizer_prefix_cache_lookups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// gauge returns kvrouter_tokenizer_prefix_cache_bytes in reg (one model).
func gauge(t *testing.T, reg *prometheus.Registry) float64 {
	return testmetrics.Value(t, reg, "kvrouter_tokenizer_prefix_cache_bytes")
}

func TestMetricsGolden(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := tokenizer.NewMetrics(reg)
	tk := tiny(t, helloMerges, []string{"<|x|>"}, nil, tokenizer.WithPrefixCache(1<<20), tokenizer.WithMetrics(m, "tiny"))
	tk.Encode("hello world<|x|>hi", false)    // miss: 10 ids encoded, the 7 before <|x|> stored
	tk.Encode("hello world<|x|>there", false) // hit: 7 ids cached, 5 encoded
	tk.Encode("hello world", false)           // no cut point: no lookup
	// hits, 7 ids cached and 1 encoded each: the first by hashing, which records the
	// provenance (its first 11 bytes are content 7), the second from it.
	tk.AppendEncodeProvenance(nil, "hello world<|x|>!", false, 0, nil, &tokenizer.Provenance{Ends: []int{11}, IDs: []uint64{7}})
	tk.AppendEncodeProvenance(nil, "hello world<|x|>?", false, 0, nil, &tokenizer.Provenance{Ends: []int{11}, IDs: []uint64{7}})
	want := `
# HELP kvrouter_tokenizer_prefix_cache_bytes Memory the prefix cache accounts for (ids at 4 bytes plus a fixed overhead per span, and the block keys stored on spans), bounded by its configured budget.
# TYPE kvrouter_tokenizer_prefix_cache_bytes gauge
kvrouter_tokenizer_prefix_cache_bytes{model="tiny"} 272
# HELP kvrouter_tokenizer_prefix_cache_lookups_total Encodes of a text with a cut point (an added token such as <|im_start|>) that looked up the prefix cache, by result: hit when a cached prefix was used.
# TYPE kvrouter_tokenizer_prefix_cache_lookups_total counter
kvrouter_tokenizer_prefix_cache_lookups_total{model="tiny",result="hit"} 3
kvrouter_tokenizer_prefix_cache_lookups_total{model="tiny",result="miss"} 1
# HELP kvrouter_tokenizer_prefix_cache_proven_total Encodes whose cached prefix was found from the caller's provenance of the text (a chat template's stored loop iterations) rather than by hashing the text.
# TYPE kvrouter_tokenizer_prefix_cache_proven_total counter
kvrouter_tokenizer_prefix_cache_proven_total{model="tiny"} 1
# HELP kvrouter_tokenizer_prefix_cache_tokens_total Token ids of those encodes, by source: cached (copied from the prefix cache) or encoded.
# TYPE kvrouter_tokenizer_prefix_cache_tokens_total counter
kvrouter_tokenizer_prefix_cache_tokens_total{model="tiny",source="cached"} 21
kvrouter_tokenizer_prefix_cache_tokens_total{model="tiny",source="encoded"} 19
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestPrefixCacheBounded checks that the cache's memory stays within its budget and
// that eviction is least recently used by chain: a prefix every request shares (a
// system prompt) survives a stream of unique conversations that do not fit.
func TestPrefixCacheBounded(t *testing.T) {
	const budget = 8 << 10
	reg := prometheus.NewPedanticRegistry()
	tk := tiny(t, helloMerges, []string{"<|s|>", "<|e|>"}, nil, tokenizer.WithPrefixCache(budget), tokenizer.WithMetrics(tokenizer.NewMetrics(reg), "tiny"))
	plain := tiny(t, helloMerges, []string{"<|s|>", "<|e|>"}, nil, tokenizer.WithPrefixCache(0))
	system := "<|s|>system " + strings.Repeat("hello world ", 40) + "<|e|>"
	const n = 200
	for i := 0; i < n; i++ {
		text := fmt.Sprintf("%s<|s|>user %d %s<|e|><|s|>", system, i, strings.Repeat("aa ", 50+i%7))
		if got, want := tk.Encode(text, false), plain.Encode(text, false); !slices.Equal(got, want) {
			t.Fatalf("request %d: ids differ", i)
		}
		if b := gauge(t, reg); b > budget || b <= 0 {
			t.Fatalf("request %d: cache holds %v bytes, budget %d", i, b, budget)
		}
	}
	if hits := lookups(t, reg, "hit"); hits != n-1 {
		t.Errorf("%v of %d requests hit the shared system prompt, want %d", hits, n, n-1)
	}
}

// TestCutSafety checks the conditions under which the cache splits a text before an
// added token, with tokens whose flags make a split inexact: lstrip (eats the space
// before it), single_word (depends on the character before it), a token that begins
// with a word character or a space, and tokens that contain another one (a longer
// match may straddle the cut). Each text is encoded after a text sharing its prefix
// has been cached; ids must equal those of a tokenizer without a cache.
func TestCutSafety(t *testing.T) {
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
	// With special tokens added around the text (BOS and EOS), as Meta's Llama 3
	// tokenizer.json does, the cached prefixes start with BOS and never hold EOS.
	withBOS := func(doc map[string]any) {
		flags(doc)
		doc["post_processor"] = map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|s|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}, map[string]any{"SpecialToken": map[string]any{"id": "<R>"}}},
			"special_tokens": map[string]any{"<|s|>": map[string]any{"ids": []int{1000}}, "<R>": map[string]any{"ids": []int{1007}}}}
	}
	cached := tiny(t, helloMerges, added, withBOS, tokenizer.WithPrefixCache(1<<20))
	plain := tiny(t, helloMerges, added, withBOS, tokenizer.WithPrefixCache(0))
	prefixes := []string{"hello <R>  ", "hello  ", "hellox", "hello<W>", "hello <W>", "<W>", "he <sp>", "aawd", "hello<|s|>", ""}
	cuts := []string{"<|s|>", "<L>", "<W>", " <sp>", "wd>", "<R>", "<|s|>y", "x<|s|>"}
	tails := []string{"", "hello", " world", "y<|s|>", "<L> x", "ll<W>"}
	for _, p := range prefixes {
		for _, c := range cuts {
			for _, a := range tails {
				for _, b := range tails {
					for i, text := range []string{p + c + a, p + c + b + c + a, p + "x" + c + a} {
						add := i == 1
						if got, want := cached.Encode(text, add), plain.Encode(text, add); !slices.Equal(got, want) {
							t.Fatalf("%q (special tokens %v): cached ids %v, want %v", text, add, got, want)
						}
					}
				}
			}
		}
	}
}

// TestAppendEncodeMax checks that stopping at maxTokens yields exactly the first
// maxTokens ids of the whole encoding, with or without the segment cache.
func TestAppendEncodeMax(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		shared := model(t, name)
		// Three turns, so that the prefix cache has cuts at each <|im_start|>-like token.
		text := render(name, strings.Repeat("Be brief. ", 50), strings.Repeat("Tell me about caches, «ünïcode» and 42 tokens!\n", 200))
		text += render(name, "Again.", strings.Repeat("And once more, with feeling.\n", 100))
		whole := shared.Encode(text, true)
		for _, max := range []int{0, 1, 2, 17, 100, 1000, len(whole) / 2, len(whole) - 1, len(whole), len(whole) + 1} {
			t.Run(fmt.Sprintf("%s/max=%d", name, max), func(t *testing.T) {
				// A fresh prefix cache: the cut run goes first and must store nothing
				// that makes a later run differ.
				tk, err := shared.Derive()
				if err != nil {
					t.Fatal(err)
				}
				for run := range 3 {
					got, complete := tk.AppendEncodeMax([]uint32{7}, text, true, max)
					want := whole
					if max > 0 && max < len(whole) {
						want = whole[:max]
					}
					if !slices.Equal(got[1:], want) || got[0] != 7 {
						t.Fatalf("run %d: got %d ids, want the first %d of the encoding", run, len(got)-1, len(want))
					}
					if wantComplete := max == 0 || max >= len(whole); complete != wantComplete {
						t.Fatalf("run %d: complete %v, want %v", run, complete, wantComplete)
					}
					if all := tk.Encode(text, true); !slices.Equal(all, whole) {
						t.Fatalf("run %d: a whole encoding after a cut one differs", run)
					}
				}
			})
		}
	}
}

// TestPrefixSegmentKeys: an encode describes the cached spans its ids start with; keys
// stored on them are found by the next encode sharing them, count in the cache's
// bytes (at most two sets per span, replacing the oldest) and go with their span when
// it is evicted, the cache staying within its budget.
func TestPrefixSegmentKeys(t *testing.T) {
	const budget = 8 << 10
	reg := prometheus.NewPedanticRegistry()
	tk := tiny(t, helloMerges, []string{"<|s|>", "<|e|>"}, nil, tokenizer.WithPrefixCache(budget), tokenizer.WithMetrics(tokenizer.NewMetrics(reg), "tiny"))
	system := "<|s|>system " + strings.Repeat("hello world ", 40) + "<|e|>"
	turn := func(i int) string {
		return fmt.Sprintf("%s<|s|>user %d %s<|e|><|s|>", system, i, strings.Repeat("aa ", 50))
	}
	var p tokenizer.Prefix
	ids, _ := tk.AppendEncodePrefix(nil, turn(0), false, 0, &p)
	ends := slices.Clone(p.Ends())
	if len(ends) == 0 || !slices.IsSorted(ends) || ends[len(ends)-1] > len(ids) {
		t.Fatalf("ends %v for %d ids", ends, len(ids))
	}
	before := gauge(t, reg)
	p.StoreSegmentKeys(0, 1, 16, []uint64{10, 11})
	if got := gauge(t, reg) - before; got != 104+16 {
		t.Errorf("a set of 2 keys added %v bytes, want 120", got)
	}
	p.StoreSegmentKeys(0, 2, 16, []uint64{20})
	p.StoreSegmentKeys(0, 3, 16, []uint64{30}) // replaces root 1's set
	if got := gauge(t, reg) - before; got != 104+16 {
		t.Errorf("two sets of one key hold %v bytes, want 120", got)
	}
	p.StoreSegmentKeys(0, 3, 16, []uint64{31, 32}) // replaces root 3's set in place
	if got := gauge(t, reg) - before; got != 104+8+16 {
		t.Errorf("after a replacement %v bytes, want 128", got)
	}

	// The next turn starts with the same spans and finds the keys.
	_, _ = tk.AppendEncodePrefix(nil, turn(1), false, 0, &p)
	if p.Ends()[0] != ends[0] {
		t.Fatalf("next turn's first span ends at %d, was %d", p.Ends()[0], ends[0])
	}
	for _, c := range []struct {
		root uint64
		want []uint64
	}{{1, nil}, {2, []uint64{20}}, {3, []uint64{31, 32}}} {
		if got := p.SegmentKeys(0, c.root, 16); !slices.Equal(got, c.want) {
			t.Errorf("root %d: keys %v, want %v", c.root, got, c.want)
		}
	}
	if got := p.SegmentKeys(0, 2, 32); got != nil {
		t.Errorf("another block size got keys %v", got)
	}

	// Other texts evict the spans; keys offered to an evicted span are dropped.
	evicted := p
	p = tokenizer.Prefix{}
	for i := range 200 {
		_, _ = tk.AppendEncodePrefix(nil, fmt.Sprintf("<|s|>other %d %s<|e|><|s|>", i, strings.Repeat("hello ", 30)), false, 0, &p)
		for j := range p.Ends() {
			p.StoreSegmentKeys(j, 1, 16, make([]uint64, 4))
		}
		if b := gauge(t, reg); b > budget || b <= 0 {
			t.Fatalf("text %d: cache holds %v bytes, budget %d", i, b, budget)
		}
	}
	b := gauge(t, reg)
	evicted.StoreSegmentKeys(0, 9, 16, make([]uint64, 100))
	if gauge(t, reg) != b {
		t.Error("keys stored on an evicted span were counted")
	}
	_, _ = tk.AppendEncodePrefix(nil, turn(2), false, 0, &p)
	if len(p.Ends()) > 0 && p.SegmentKeys(0, 2, 16) != nil {
		t.Error("keys survived their span's eviction")
	}
	p.Reset()
	if len(p.Ends()) != 0 {
		t.Error("Reset left segments")
	}
}

// TestWalkedChain: an encode first walks the chain of cached spans the previous encodes
// of the same text left, following each span's hint to the one after it. Conversations
// interleaved after a shared system prompt (each hint then leads to another
// conversation), edits in the middle of a history, a cut token replaced by another, a
// cut straddled by a longer token in the new text (whose first byte another token
// holds further in: "a<|s|>b" around "<|s|>"), invalid UTF-8 after the walked prefix
// or inside it, and a cache small enough to evict on every encode all give the ids of
// a tokenizer without a cache; the walk serves most of the ids of later turns.
func TestWalkedChain(t *testing.T) {
	added := []string{"[s]", "[e]", "<|s|>", "a<|s|>b"}
	reg := prometheus.NewPedanticRegistry()
	cached := tiny(t, helloMerges, added, nil, tokenizer.WithPrefixCache(1<<20), tokenizer.WithMetrics(tokenizer.NewMetrics(reg), "tiny"))
	small := tiny(t, helloMerges, added, nil, tokenizer.WithPrefixCache(2<<10))
	plain := tiny(t, helloMerges, added, nil, tokenizer.WithPrefixCache(0))
	system := "[s]system " + strings.Repeat("hello world ", 20) + "[e]"
	msg := func(conv, i int) string {
		return fmt.Sprintf("[s]user %d %d %s[e]", conv, i, strings.Repeat("aa hello ", 8+i%3))
	}
	turns := func(conv, n int) string {
		var b strings.Builder
		b.WriteString(system)
		for i := range n {
			b.WriteString(msg(conv, i))
		}
		return b.String() + "[s]"
	}
	var texts []string
	for n := 1; n <= 8; n++ {
		for conv := range 3 { // interleaved: the system span's hint changes every encode
			texts = append(texts, turns(conv, n))
		}
	}
	edited := turns(0, 8)
	texts = append(texts,
		strings.Replace(edited, msg(0, 3), msg(9, 3), 1),             // an edit in the middle
		strings.Replace(edited, msg(0, 5)+"[s]", msg(0, 5)+"[e]", 1), // another cut token
		edited[:len(edited)-3],                                       // the same text without its last cut
		edited+"user \xff\xfe tail [e][s]",                           // invalid UTF-8 after the walked prefix
		strings.Replace(edited, msg(0, 4), "[s]user \xc3 x[e]", 1),   // and inside the history
		// A cut of the cached text straddled by a longer token in the new one.
		system+"[s]user ha<|s|>c tail[e][s]", system+"[s]user ha<|s|>b tail[e][s]",
		system+"[s]user ha<|s|>c tail[e][s]",
	)
	for i, text := range texts {
		want := plain.Encode(text, false)
		for name, tk := range map[string]*tokenizer.Tokenizer{"large": cached, "small": small} {
			if got := tk.Encode(text, false); !slices.Equal(got, want) {
				t.Fatalf("%s cache, text %d %q: ids %v, want %v", name, i, text, got, want)
			}
		}
	}
	if hits := lookups(t, reg, "hit"); hits < float64(len(texts)-4) {
		t.Errorf("%v of %d encodes used a cached prefix", hits, len(texts))
	}
}

// TestVocabulary checks the vocabulary's two directions on a tiny model: every token's
// byte-level form finds its id and decodes to its bytes, a missing token is not found,
// an id without a token decodes to nothing, and two tokens given one id are both found.
func TestVocabulary(t *testing.T) {
	tk := tiny(t, helloMerges, []string{"<s>"}, nil)
	for b := 0; b < 256; b++ {
		if id, ok := tk.TokenID(byteLevel(byte(b))); !ok || id != uint32(b) {
			t.Errorf("byte %#x: id %d, %v", b, id, ok)
		}
		if got := tk.Decode([]uint32{uint32(b)}); b < 0x80 && got != string(rune(b)) {
			t.Errorf("Decode(%d) = %q", b, got)
		}
	}
	for i, m := range helloMerges {
		tok := m[0] + m[1]
		if id, ok := tk.TokenID(bl(tok)); !ok || id != uint32(256+i) {
			t.Errorf("%q: id %d, %v, want %d", tok, id, ok, 256+i)
		}
		if got := tk.Decode([]uint32{uint32(256 + i)}); got != tok {
			t.Errorf("Decode(%d) = %q, want %q", 256+i, got, tok)
		}
	}
	if id, ok := tk.TokenID(bl("hellohello")); ok {
		t.Errorf("a token missing from the vocabulary has id %d", id)
	}
	if got := tk.Decode([]uint32{500, 'h', 1000, 5000}); got != "h<s>" {
		t.Errorf("Decode with ids that have no token = %q, want %q", got, "h<s>")
	}
	if got, want := tk.VocabSize(), 1001; got != want {
		t.Errorf("VocabSize() = %d, want %d", got, want)
	}
	// Two tokens with one id: each is found, and the id decodes as the lesser.
	tk = tiny(t, helloMerges, nil, func(doc map[string]any) {
		doc["model"].(map[string]any)["vocab"].(map[string]int)[bl("zz")] = 'a'
	})
	for _, tok := range []string{"a", "zz"} {
		if id, ok := tk.TokenID(bl(tok)); !ok || id != 'a' {
			t.Errorf("%q: id %d, %v, want %d", tok, id, ok, 'a')
		}
	}
	if got := tk.Decode([]uint32{'a'}); got != "a" {
		t.Errorf("Decode of an id with two tokens = %q, want %q", got, "a")
	}
	if got := tk.Encode("zz", false); !slices.Equal(got, []uint32{'z', 'z'}) {
		t.Errorf(`Encode("zz") = %v: "zz" has no merge, so BPE never reaches it`, got)
	}
	// "he" merges to its own id, so it is emitted whole; "hx", a second token of
	// that id, is not (BPE gives h, x).
	tk = tiny(t, helloMerges, nil, func(doc map[string]any) {
		doc["model"].(map[string]any)["vocab"].(map[string]int)[bl("hx")] = 256
	})
	if got := tk.Encode("he", false); !slices.Equal(got, []uint32{256}) {
		t.Errorf(`Encode("he") = %v, want [256]`, got)
	}
	if got := tk.Encode("hx", false); !slices.Equal(got, []uint32{'h', 'x'}) {
		t.Errorf(`Encode("hx") = %v, want [h x]: the id's whole-word mark is for "he"`, got)
	}
}
