package tokenizer_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/tokenizer"
)

// provText is a text made the way a chat template makes it: a head, then contents
// named by ids (a render's stored loop iterations), then a tail; with its provenance.
func provText(head string, contents []string, ids []uint64, tail string) (string, *tokenizer.Provenance) {
	prov := &tokenizer.Provenance{Start: len(head)}
	var b strings.Builder
	b.WriteString(head)
	for i, c := range contents {
		b.WriteString(c)
		prov.Ends = append(prov.Ends, b.Len())
		prov.IDs = append(prov.IDs, ids[i])
	}
	b.WriteString(tail)
	return b.String(), prov
}

func message(i int, extra string) string {
	return fmt.Sprintf("<|s|>user %d %s%s<|e|>\n", i, strings.Repeat("hello world aa ", 3+i%5), extra)
}

// TestEncodeProvenance: encodes given a provenance that is true of their text give
// the ids of an encode without a cache, whatever the provenance shares with earlier
// ones (a growing conversation, sibling turns, an edited message under a new id, a
// changed head under the same ids, special tokens added or not, a branch back to an
// earlier turn, invalid UTF-8, a provenance that does not describe the text), with a
// cache that holds the conversation and one that evicts on every encode; and the
// growing conversation resumes from its provenance.
func TestEncodeProvenance(t *testing.T) {
	added := []string{"<|s|>", "<|e|>"}
	plain := tiny(t, helloMerges, added, nil, tokenizer.WithPrefixCache(0))
	const n = 12
	msgs := make([]string, n)
	ids := make([]uint64, n)
	for i := range msgs {
		msgs[i] = message(i, "")
		ids[i] = uint64(100 + i)
	}
	edited := slices.Clone(msgs)
	edited[3] = message(3, "!") // one byte more, rendered again: a new id
	editedIDs := slices.Clone(ids)
	editedIDs[3] = 999
	type step struct {
		name string
		add  bool
		text string
		prov *tokenizer.Provenance
	}
	var steps []step
	head := "<|s|>system " + strings.Repeat("hello ", 20) + "<|e|>\n"
	for k := 1; k <= n; k++ {
		text, prov := provText(head, msgs[:k], ids, "<|s|>assistant\n")
		steps = append(steps, step{fmt.Sprintf("turn %d", k), false, text, prov})
	}
	for k := 6; k < 9; k++ { // siblings: the same history, another last message
		text, prov := provText(head, append(slices.Clone(msgs[:6]), message(50+k, "")), append(slices.Clone(ids[:6]), uint64(500+k)), "<|s|>assistant\n")
		steps = append(steps, step{fmt.Sprintf("sibling %d", k), false, text, prov})
	}
	text, prov := provText(head, edited, editedIDs, "<|s|>assistant\n")
	steps = append(steps, step{"a message edited", false, text, prov})
	text, prov = provText(strings.Replace(head, "hello", "hellO", 1), msgs, ids, "<|s|>assistant\n")
	steps = append(steps, step{"the head changed, the same ids", false, text, prov})
	text, prov = provText(head, msgs, ids, "<|s|>assistant\n")
	steps = append(steps, step{"special tokens added", true, text, prov})
	text, prov = provText(head, msgs[:4], ids, "<|s|>assistant\n")
	steps = append(steps, step{"back to turn 4", false, text, prov})
	text, prov = provText(head, append(slices.Clone(msgs[:5]), "<|s|>user \xff\xfe<|e|>\n"), append(slices.Clone(ids[:5]), 777), "<|s|>assistant\n")
	steps = append(steps, step{"invalid UTF-8 in a new message", false, text, prov})
	text, prov = provText(head, msgs, ids, "<|s|>assistant\n")
	for _, bad := range []struct {
		name string
		prov tokenizer.Provenance
	}{
		{"ends past the text", tokenizer.Provenance{Start: prov.Start, Ends: []int{prov.Ends[0], len(text) + 1}, IDs: ids[:2]}},
		{"ends going back", tokenizer.Provenance{Start: prov.Start, Ends: []int{prov.Ends[1], prov.Ends[0]}, IDs: ids[:2]}},
		{"start after the first end", tokenizer.Provenance{Start: prov.Ends[0] + 1, Ends: prov.Ends[:2], IDs: ids[:2]}},
		{"fewer ids than ends", tokenizer.Provenance{Start: prov.Start, Ends: prov.Ends, IDs: ids[:3]}},
		{"negative start", tokenizer.Provenance{Start: -1, Ends: prov.Ends, IDs: ids}},
	} {
		steps = append(steps, step{bad.name, false, text, &bad.prov})
	}
	for _, c := range []struct {
		name   string
		budget int64
	}{{"large", 1 << 20}, {"small", 2 << 10}} {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			tk := tiny(t, helloMerges, added, nil, tokenizer.WithPrefixCache(c.budget), tokenizer.WithMetrics(tokenizer.NewMetrics(reg), "tiny"))
			var p tokenizer.Prefix
			for _, s := range steps {
				got, complete := tk.AppendEncodeProvenance(nil, s.text, s.add, 0, &p, s.prov)
				if want := plain.Encode(s.text, s.add); !complete || !slices.Equal(got, want) {
					t.Fatalf("%s: ids differ from an encode without cache\n got %v\nwant %v", s.name, got, want)
				}
				if ends := p.Ends(); len(ends) > 0 && ends[len(ends)-1] > len(got) {
					t.Fatalf("%s: prefix ends at %d of %d ids", s.name, ends[len(ends)-1], len(got))
				}
				if b := gauge(t, reg); b > float64(c.budget) {
					t.Fatalf("%s: cache holds %v bytes, budget %d", s.name, b, c.budget)
				}
			}
			proven := testmetrics.Value(t, reg, "kvrouter_tokenizer_prefix_cache_proven_total")
			if c.name == "large" && proven < n-1 {
				t.Errorf("%v encodes resumed from their provenance, want at least the %d later turns", proven, n-1)
			}
		})
	}
}

// TestEncodeProvenanceTrusted: the prefix cache takes what the provenance proves
// without checking the bytes (which is what makes it cheap), so only a caller that
// proved it, as a chat template's render does, may give one: a text whose provenance
// claims a stored content it does not hold gets the ids stored for that content up
// to the claim's last cut.
func TestEncodeProvenanceTrusted(t *testing.T) {
	tk := tiny(t, helloMerges, []string{"<|s|>", "<|e|>"}, nil, tokenizer.WithPrefixCache(1<<20))
	plain := tiny(t, helloMerges, []string{"<|s|>", "<|e|>"}, nil, tokenizer.WithPrefixCache(0))
	msgs := []string{message(0, ""), message(1, ""), message(2, "")}
	ids := []uint64{1, 2, 3}
	for k := 1; k <= 3; k++ {
		text, prov := provText("", msgs[:k], ids, "<|s|>")
		tk.AppendEncodeProvenance(nil, text, false, 0, nil, prov)
	}
	lie := slices.Clone(msgs)
	lie[0] = strings.Replace(lie[0], "hello", "olleh", 1) // not content 1 any more
	text, prov := provText("", lie, ids, "<|s|>")
	got, _ := tk.AppendEncodeProvenance(nil, text, false, 0, nil, prov)
	stored := plain.Encode(strings.Join(msgs, "")+"<|s|>", false)
	if honest := plain.Encode(text, false); slices.Equal(got, honest) {
		t.Fatalf("the false provenance was checked: ids %v", got)
	}
	if !slices.Equal(got, stored) {
		t.Fatalf("ids %v, want those stored for the content claimed %v", got, stored)
	}
}

// FuzzEncodeProvenance encodes sequences of texts made of a head, contents named by ids
// (a content keeps its ids; an id names one content, as a render's iterations) and a
// tail, with provenances true of them, through caches large and tiny, and requires the
// ids of a tokenizer without cache. Contents are drawn from a small pool, so later texts
// share prefixes, ids and spans with earlier ones; added tokens, partial tokens and
// invalid UTF-8 fall anywhere.
func FuzzEncodeProvenance(f *testing.F) {
	f.Add([]byte{3, 1, 2, 3, 0, 1, 2, 3, 4, 5})
	f.Add([]byte("conversation with edits\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09"))
	frags := []string{"hello", " world", "aa", "<|s|>", "<|e|>", "<|s", "|>", "\n", " ", "\xff", "é", "he", "<|s|>user ", "<|e|>\n"}
	heads := []string{"", "<|s|>system hello<|e|>\n", "<|s|>system aa aa<|e|>\n", "hello"}
	tails := []string{"<|s|>assistant\n", "", "<|s|>", " world"}
	added := []string{"<|s|>", "<|e|>"}
	plain := tiny(f, helloMerges, added, nil, tokenizer.WithPrefixCache(0))
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		var pool []string
		for range 6 {
			var b strings.Builder
			b.WriteString("<|s|>user ")
			for range 1 + next()%6 {
				b.WriteString(frags[next()%len(frags)])
			}
			b.WriteString("<|e|>\n")
			pool = append(pool, b.String())
		}
		ids := map[string][]uint64{} // a content's ids
		newID := uint64(0)
		tks := []*tokenizer.Tokenizer{
			tiny(t, helloMerges, added, nil, tokenizer.WithPrefixCache(1<<20)),
			tiny(t, helloMerges, added, nil, tokenizer.WithPrefixCache(1<<10)),
		}
		for step := 0; step < 12 && len(data) > 0; step++ {
			n := next() % 10
			contents := make([]string, n)
			named := make([]uint64, n)
			for i := range contents {
				c := pool[(i+next()%2)%len(pool)]
				if next()%5 == 0 { // rendered again: a new id for the same bytes
					newID++
					ids[c] = append(ids[c], newID)
				} else if len(ids[c]) == 0 {
					newID++
					ids[c] = []uint64{newID}
				}
				contents[i] = c
				named[i] = ids[c][len(ids[c])-1]
			}
			text, prov := provText(heads[next()%len(heads)], contents, named, tails[next()%len(tails)])
			add := next()%4 == 0
			want := plain.Encode(text, add)
			for j, tk := range tks {
				if got, _ := tk.AppendEncodeProvenance(nil, text, add, 0, nil, prov); !slices.Equal(got, want) {
					t.Fatalf("step %d, cache %d: %q\n got %v\nwant %v", step, j, text, got, want)
				}
			}
		}
	})
}
