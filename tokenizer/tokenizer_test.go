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
	if _, err := tokenizer.Parse(tinyJSON(t, helloMerges, nil, nil), nil, tokenizer.WithSegmentCache(-1, 0, 1<<20)); err == nil {
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

// TestCacheIdentical checks that the segment cache changes nothing: ids with a cache
// (cold and warm, from many goroutines at once) equal ids without one.
func TestCacheIdentical(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			plain := model(t, name)
			reg := prometheus.NewPedanticRegistry()
			m := tokenizer.NewMetrics(reg)
			small, err := plain.Derive(tokenizer.WithSegmentCache(64, 1, 1<<20), tokenizer.WithMetrics(m, name))
			if err != nil {
				t.Fatal(err)
			}
			off, err := plain.Derive(tokenizer.WithSegmentCache(0, 0, 1<<20))
			if err != nil {
				t.Fatal(err)
			}
			corpus := readJSONL[corpusEntry](t, "corpus.jsonl.gz")
			system := strings.Repeat("You are a helpful assistant. Answer in JSON: {\"a\": 1}.\n", 60)
			var texts []string
			for i := 0; i < len(corpus); i += 25 {
				texts = append(texts, corpus[i].Text, "<|im_start|>system\n"+system+"<|im_end|>\n<|im_start|>user\n"+corpus[i].Text+"<|im_end|>")
			}
			want := make([][]uint32, len(texts))
			for i, s := range texts {
				want[i] = off.Encode(s, true)
			}
			var wg sync.WaitGroup
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for pass := 0; pass < 2; pass++ {
						for i := g; i < len(texts); i += 2 {
							for _, tk := range []*tokenizer.Tokenizer{plain, small} {
								if got := tk.Encode(texts[i], true); !slices.Equal(got, want[i]) {
									t.Errorf("cached ids differ for %q", texts[i])
									return
								}
							}
						}
					}
				}()
			}
			wg.Wait()
			hits, misses := lookups(t, reg, "hit"), lookups(t, reg, "miss")
			if hits == 0 || misses == 0 {
				t.Errorf("cache hits %v misses %v: want both > 0", hits, misses)
			}
		})
	}
}

// lookups sums kvrouter_tokenizer_segment_cache_lookups_total{result} in reg.
func lookups(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
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

func TestMetricsGolden(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := tokenizer.NewMetrics(reg)
	tk := tiny(t, helloMerges, []string{"<|x|>"}, nil, tokenizer.WithSegmentCache(8, 4, 1<<20), tokenizer.WithMetrics(m, "tiny"))
	tk.Encode("hello world<|x|>hi", false) // "hello world" misses, "hi" is too short to cache
	tk.Encode("hello world", false)        // misses again, so it is admitted
	tk.Encode("hello world", false)        // hit
	tk.Encode("hello world!", false)       // miss
	want := `
# HELP kvrouter_tokenizer_segment_cache_lookups_total Lookups of tokenized text segments (text between added tokens) in the tokenizer's LRU, by result.
# TYPE kvrouter_tokenizer_segment_cache_lookups_total counter
kvrouter_tokenizer_segment_cache_lookups_total{model="tiny",result="hit"} 1
kvrouter_tokenizer_segment_cache_lookups_total{model="tiny",result="miss"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestCacheAdmitsRepeatedSegments checks the cache's doorkeeper: a segment is memoised
// the second time it misses, and segments seen once (unique user turns) do not evict
// what was memoised.
func TestCacheAdmitsRepeatedSegments(t *testing.T) {
	for _, tc := range []struct {
		name      string
		encodes   []string
		hit, miss float64
	}{
		{"once: not memoised", []string{"shared prompt"}, 0, 1},
		{"twice: memoised on the second miss", []string{"shared prompt", "shared prompt", "shared prompt"}, 1, 2},
		{"unique segments do not evict it", []string{"shared prompt", "shared prompt",
			"unique 1", "unique 2", "unique 3", "unique 4", "unique 5", "shared prompt"}, 1, 7},
		{"repeated segments do", []string{"shared prompt", "shared prompt",
			"other 1", "other 1", "other 2", "other 2", "shared prompt"}, 0, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			// Room for one segment: any other admitted segment evicts the prompt.
			tk := tiny(t, helloMerges, nil, nil, tokenizer.WithSegmentCache(1, 4, 1<<20), tokenizer.WithMetrics(tokenizer.NewMetrics(reg), "tiny"))
			for _, s := range tc.encodes {
				tk.Encode(s, false)
			}
			if hit, miss := lookups(t, reg, "hit"), lookups(t, reg, "miss"); hit != tc.hit || miss != tc.miss {
				t.Errorf("hits %v misses %v, want %v and %v", hit, miss, tc.hit, tc.miss)
			}
		})
	}
}

// TestAppendEncodeMax checks that stopping at maxTokens yields exactly the first
// maxTokens ids of the whole encoding, with or without the segment cache.
func TestAppendEncodeMax(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		tk := model(t, name)
		text := render(name, strings.Repeat("Be brief. ", 50), strings.Repeat("Tell me about caches, «ünïcode» and 42 tokens!\n", 200))
		whole := tk.Encode(text, true)
		for _, max := range []int{0, 1, 2, 17, 100, 1000, len(whole) - 1, len(whole), len(whole) + 1} {
			t.Run(fmt.Sprintf("%s/max=%d", name, max), func(t *testing.T) {
				for range 2 { // the second run goes through the segment cache
					got, complete := tk.AppendEncodeMax([]uint32{7}, text, true, max)
					want := whole
					if max > 0 && max < len(whole) {
						want = whole[:max]
					}
					if !slices.Equal(got[1:], want) || got[0] != 7 {
						t.Fatalf("got %d ids, want the first %d of the encoding", len(got)-1, len(want))
					}
					if wantComplete := max == 0 || max >= len(whole); complete != wantComplete {
						t.Fatalf("complete %v, want %v", complete, wantComplete)
					}
				}
			})
		}
	}
}
