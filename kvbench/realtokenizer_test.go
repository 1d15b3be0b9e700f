package kvbench

import (
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

type qwen3 struct{ t *tokenizer.Tokenizer }

func (q qwen3) Encode(s string) ([]uint32, error) { return q.t.Encode(s, true), nil }

// TestRealTokenizerAgreesWithEmbeddedIDs checks, with the real Qwen3 tokenizer, that every
// embedded word is one token with the embedded id and that a reference-sized workload's
// prompts tokenize to exactly P + T tokens, equal to the ids sim mode uses without it.
func TestRealTokenizerAgreesWithEmbeddedIDs(t *testing.T) {
	tk, err := tokenizer.LoadDir(testmodels.Dir(t, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	tok := qwen3{tk}
	for _, w := range mustWords() {
		if ids, _ := tok.Encode(" " + w.text); len(ids) != 1 || ids[0] != w.id {
			t.Fatalf("word %q encodes to %v, want [%d]", w.text, ids, w.id)
		}
	}
	cfg := DefaultWorkloadConfig()
	cfg.Requests = 20
	withTok, err := NewWorkload(cfg, tok)
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := NewWorkload(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range withTok.Requests() {
		r := &withTok.Requests()[i]
		ids, _ := tok.Encode(withTok.Text(r))
		if len(ids) != cfg.PrefixTokens+cfg.TailTokens {
			t.Fatalf("request %d: %d tokens, want %d", i, len(ids), cfg.PrefixTokens+cfg.TailTokens)
		}
		if !slices.Equal(ids, embedded.TokenIDs(&embedded.Requests()[i])) {
			t.Fatalf("request %d: tokenizer ids differ from the embedded ids", i)
		}
	}
}
