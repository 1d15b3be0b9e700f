package tokenizer_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// corpusEntry is one line of testdata/golden/corpus.jsonl.gz.
type corpusEntry struct {
	Cat  string `json:"c"`
	Text string `json:"t"`
}

// goldenIDs is one line of testdata/golden/<model>.jsonl.gz: HF's ids without special
// tokens (N) and with them (A, absent when equal to N).
type goldenIDs struct {
	N []uint32  `json:"n"`
	A *[]uint32 `json:"a"`
}

// readJSONL reads testdata/golden/<name>, a gzipped JSON Lines file.
func readJSONL[T any](t *testing.T, name string) []T {
	t.Helper()
	return testtext.ReadJSONL[T](t, filepath.Join("testdata", "golden", name))
}

// variantSpec is one entry of testdata/golden/variants.json: a model's tokenizer.json
// with top-level keys replaced and added-token flags changed, as gen.mjs builds it.
type variantSpec struct {
	Base       string                                `json:"base"`
	Set        map[string]json.RawMessage            `json:"set"`
	AddedFlags map[string]map[string]json.RawMessage `json:"added_flags"`
}

// variantTokenizer builds the tokenizer of a variant the way gen.mjs does.
func variantTokenizer(t *testing.T, spec variantSpec) *tokenizer.Tokenizer {
	t.Helper()
	dir := testmodels.Dir(t, spec.Base)
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for k, v := range spec.Set {
		doc[k] = v
	}
	if len(spec.AddedFlags) > 0 {
		var added []map[string]json.RawMessage
		if err := json.Unmarshal(doc["added_tokens"], &added); err != nil {
			t.Fatal(err)
		}
		for _, a := range added {
			var content string
			_ = json.Unmarshal(a["content"], &content)
			for k, v := range spec.AddedFlags[content] {
				a[k] = v
			}
		}
		if doc["added_tokens"], err = json.Marshal(added); err != nil {
			t.Fatal(err)
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Parse(out, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// checkGolden encodes every stride-th corpus string and compares with HF's ids; it
// reports per-category counts and the first mismatches on failure.
func checkGolden(t *testing.T, tk *tokenizer.Tokenizer, corpus []corpusEntry, want []goldenIDs, stride int) {
	t.Helper()
	sample := 1
	if raceEnabled {
		sample = 7 // see race_test.go
	}
	type tally struct{ total, ok int }
	cats := map[string]*tally{}
	var fails []string
	total, ok := 0, 0
	for k := 0; k < len(want); k += sample {
		g, e := want[k], corpus[k*stride]
		c := cats[e.Cat]
		if c == nil {
			c = &tally{}
			cats[e.Cat] = c
		}
		c.total++
		total++
		wantA := g.N
		if g.A != nil {
			wantA = *g.A
		}
		gotN, gotA := tk.Encode(e.Text, false), tk.Encode(e.Text, true)
		if slices.Equal(gotN, g.N) && slices.Equal(gotA, wantA) {
			c.ok++
			ok++
			continue
		}
		if len(fails) < 15 {
			fails = append(fails, fmt.Sprintf("[%s] %q\n   got  %v / %v\n   want %v / %v", e.Cat, e.Text, gotN, gotA, g.N, wantA))
		}
	}
	t.Logf("%d/%d strings identical to HuggingFace tokenizers (both add_special_tokens settings)", ok, total)
	if ok == total {
		return
	}
	names := make([]string, 0, len(cats))
	for n := range cats {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  %-14s %6d/%d\n", n, cats[n].ok, cats[n].total)
	}
	t.Errorf("%d of %d strings differ; per category (identical/total):\n%s first mismatches:\n%s", total-ok, total, b.String(), strings.Join(fails, "\n"))
}

func TestGolden(t *testing.T) {
	corpus := readJSONL[corpusEntry](t, "corpus.jsonl.gz")
	if len(corpus) < 20000 {
		t.Fatalf("corpus has %d strings, want >= 20000", len(corpus))
	}
	for _, name := range []string{"qwen3", "llama3"} {
		t.Run(name, func(t *testing.T) {
			tk := model(t, name)
			want := readJSONL[goldenIDs](t, name+".jsonl.gz")
			if len(want) != len(corpus) {
				t.Fatalf("%d golden lines for %d corpus strings", len(want), len(corpus))
			}
			checkGolden(t, tk, corpus, want, 1)
		})
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "golden", "variants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var variants map[string]variantSpec
	if err := json.Unmarshal(raw, &variants); err != nil {
		t.Fatal(err)
	}
	for name, spec := range variants {
		t.Run(name, func(t *testing.T) {
			if raceEnabled {
				t.Skip("variants are checked without -race only (make test runs TestGolden without -race too)")
			}
			tk := variantTokenizer(t, spec)
			want := readJSONL[goldenIDs](t, name+".jsonl.gz")
			const stride = 4 // gen.mjs VARIANT_STRIDE
			if len(want) != (len(corpus)+stride-1)/stride {
				t.Fatalf("%d golden lines for %d corpus strings at stride %d", len(want), len(corpus), stride)
			}
			checkGolden(t, tk, corpus, want, stride)
		})
	}
}
