package extproc

import (
	"bytes"
	"testing"
)

// FuzzResponseModel checks that however a response body is cut into chunks, the client
// reads what one edit of the whole body gives, and that no more than a pattern's length
// is ever held back.
func FuzzResponseModel(f *testing.F) {
	f.Add([]byte(`data: {"model":"t","x":1}`+"\n\n"+`data: {"model": "t"}`), []byte{3, 9, 17}, "t", "alias")
	f.Add([]byte(`"model":"t"`), []byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, "t", "")
	f.Add([]byte(`"model":"<a&b>"`), []byte{10}, "<a&b>", "é")
	// A replaced name must never be held and matched again: "model" as the new name.
	f.Add([]byte(`"model":"t":"t"`), []byte{11}, "t", "model")
	f.Fuzz(func(t *testing.T, body, cuts []byte, target, from string) {
		if len(target) > 64 || len(from) > 64 {
			return
		}
		whole := newResponseModel(target, from).edit(body, true)
		r := newResponseModel(target, from)
		limit := max(len(r.pats[0]), len(r.pats[1]))
		var got []byte
		rest := body
		for _, c := range cuts {
			n := min(int(c), len(rest))
			got = append(got, r.edit(rest[:n], false)...)
			if len(r.held) >= limit {
				t.Fatalf("held %d bytes, a pattern is %d", len(r.held), limit)
			}
			rest = rest[n:]
		}
		got = append(got, r.edit(rest, true)...)
		if !bytes.Equal(got, whole) {
			t.Fatalf("cut at %v:\n got %q\nwant %q", cuts, got, whole)
		}
	})
}
