package tokenizer

import (
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// checkVocab checks v against byBytes, the map it was built from: every non-empty
// token is found with its id, each id decodes as the least of its tokens, an empty or
// absent token is not found, and the table stays at most two thirds full.
func checkVocab(t *testing.T, v *vocab, byBytes map[string]uint32, absent []string) {
	t.Helper()
	least := map[uint32]string{}
	maxID, tokens := -1, 0
	for tok, id := range byBytes {
		maxID = max(maxID, int(id))
		if tok == "" {
			continue
		}
		tokens++
		if cur, ok := least[id]; !ok || tok < cur {
			least[id] = tok
		}
	}
	if v.size() != maxID+1 {
		t.Fatalf("size %d, want %d", v.size(), maxID+1)
	}
	for tok, id := range byBytes {
		if tok == "" {
			continue
		}
		got, ok := v.get(tok)
		if !ok || got != id {
			t.Fatalf("get(%q) = %d, %v; want %d", tok, got, ok, id)
		}
		if v.decodes(id, tok) != (least[id] == tok) {
			t.Fatalf("decodes(%d, %q) = %v; the id decodes as %q", id, tok, v.decodes(id, tok), least[id])
		}
	}
	for id := range v.size() {
		if got := v.bytes(uint32(id)); got != least[uint32(id)] {
			t.Fatalf("bytes(%d) = %q, want %q", id, got, least[uint32(id)])
		}
	}
	if got := v.bytes(uint32(v.size())); got != "" {
		t.Fatalf("bytes past the last id = %q", got)
	}
	for _, tok := range append(absent, "") {
		if _, in := byBytes[tok]; in && tok != "" {
			continue
		}
		if id, ok := v.get(tok); ok {
			t.Fatalf("get(%q) found id %d for a token not in the vocabulary", tok, id)
		}
	}
	if used := tokens; 3*used > 2*len(v.slots) {
		t.Fatalf("%d tokens in %d slots: more than two thirds full", used, len(v.slots))
	}
}

// TestVocabIndex builds vocabularies of many short tokens over a small alphabet (long
// probe chains, tokens that are prefixes of others), with ids given to several tokens,
// an empty token and gaps in the ids, and checks every lookup against the map they were
// built from. It also checks that the probing was exercised: some token sits past the
// slot its hash starts at.
func TestVocabIndex(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tokens  int
		shareEv int // every shareEv-th token takes the id of the previous one (0: none)
		gaps    bool
	}{
		{name: "empty"},
		{name: "one", tokens: 1},
		{name: "small", tokens: 300, shareEv: 7},
		{name: "large", tokens: 60_000, shareEv: 50, gaps: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.tokens)))
			byBytes := map[string]uint32{}
			id := uint32(0)
			for len(byBytes) < tc.tokens {
				b := make([]byte, 1+r.IntN(10))
				for i := range b {
					b[i] = "ab\x00\xff"[r.IntN(4)]
				}
				tok := string(b)
				if _, dup := byBytes[tok]; dup {
					continue
				}
				if tc.shareEv == 0 || len(byBytes)%tc.shareEv != 0 || id == 0 {
					id++
					if tc.gaps && r.IntN(10) == 0 {
						id++
					}
				}
				byBytes[tok] = id
			}
			if tc.tokens > 0 {
				byBytes[""] = id + 1 // left out, but its id counts in the size
			}
			v := newVocab(byBytes)
			var absent []string
			for range 1000 {
				b := make([]byte, 1+r.IntN(8))
				for i := range b {
					b[i] = "abc"[r.IntN(3)]
				}
				absent = append(absent, string(b))
			}
			checkVocab(t, &v, byBytes, absent)
			if tc.tokens < 300 {
				return
			}
			displaced := 0
			for i, s := range v.slots {
				if s.n != 0 && v.index(maphash.String(v.seed, v.text[s.off:s.off+s.n])) != uint64(i) {
					displaced++
				}
			}
			if displaced == 0 {
				t.Fatal("no token was displaced by a collision: the probing was not exercised")
			}
		})
	}
}

// FuzzVocab checks the vocabulary against the map it is built from on any tokens: the
// input is split at 0x01 bytes into tokens numbered by their position, a 0x02 byte in a
// token making it share the previous token's id.
func FuzzVocab(f *testing.F) {
	f.Add([]byte("a\x01b\x01ab\x01\x02ba\x01\x01abc"))
	f.Add([]byte("\x01\x01\x01"))
	f.Fuzz(func(t *testing.T, in []byte) {
		byBytes := map[string]uint32{}
		id := uint32(0)
		start := 0
		for i := 0; i <= len(in); i++ {
			if i < len(in) && in[i] != 1 {
				continue
			}
			tok := string(in[start:i])
			start = i + 1
			if len(tok) == 0 || tok[0] != 2 || id == 0 {
				id++
			}
			byBytes[tok] = id
		}
		v := newVocab(byBytes)
		checkVocab(t, &v, byBytes, []string{"zz", string(in)})
	})
}
