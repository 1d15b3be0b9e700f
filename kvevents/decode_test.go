package kvevents_test

import (
	"errors"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

func asDecodeError(err error, de **kvevents.DecodeError) bool { return errors.As(err, de) }

func TestDecodeErrors(t *testing.T) {
	stored := func(hash []byte) []byte {
		// [ts, [["BlockStored", [hash], nil, [1], 16, nil]]]
		b := []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x96, 0xab}
		b = append(b, "BlockStored"...)
		b = append(b, 0x91)
		b = append(b, hash...)
		return append(b, 0xc0, 0x91, 0x01, 0x10, 0xc0)
	}
	cases := []struct {
		name    string
		payload []byte
		want    kvevents.Reason
	}{
		{"empty", nil, kvevents.ReasonTruncated},
		{"not a container", []byte{0x05}, kvevents.ReasonBadType},
		{"batch of one", []byte{0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}, kvevents.ReasonBadShape},
		{"ts is a string", []byte{0x92, 0xa1, 'x', 0x90}, kvevents.ReasonBadType},
		{"events not an array", []byte{0x92, 0x00, 0x05}, kvevents.ReasonBadType},
		{"trailing bytes", []byte{0x92, 0x00, 0x90, 0x00}, kvevents.ReasonTrailingBytes},
		{"map batch without events", []byte{0x81, 0xa2, 't', 's', 0x00}, kvevents.ReasonMissingField},
		{"event tag not a string", []byte{0x92, 0x00, 0x91, 0x91, 0x05}, kvevents.ReasonBadType},
		{"empty event array", []byte{0x92, 0x00, 0x91, 0x90}, kvevents.ReasonBadShape},
		{"map event without type", []byte{0x92, 0x00, 0x91, 0x81, 0xa1, 'x', 0x01}, kvevents.ReasonMissingField},
		{"short BlockStored", []byte{0x92, 0x00, 0x91, 0x92, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90}, kvevents.ReasonBadShape},
		{"hash bin of 8 bytes", stored([]byte{0xc4, 8, 1, 2, 3, 4, 5, 6, 7, 8}), kvevents.ReasonBadHashSize},
		{"hash is a string", stored([]byte{0xa1, 'x'}), kvevents.ReasonBadType},
		{"hash is a float", stored([]byte{0xca, 0, 0, 0, 0}), kvevents.ReasonBadType},
		{"array claims 2^32-1 elements", []byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}, kvevents.ReasonTruncated},
		{"invalid byte in ignored field", []byte{0x93, 0x00, 0x90, 0xc1}, kvevents.ReasonBadType},
		{"invalid byte in skipped value", []byte{0x94, 0x00, 0x90, 0x00, 0xc1}, kvevents.ReasonInvalidMsgpack},
		{"too deep", append([]byte{0x94, 0x00, 0x90, 0x00}, deep(100)...), kvevents.ReasonTooDeep},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b kvevents.Batch
			err := kvevents.Decode(tc.payload, &b)
			var de *kvevents.DecodeError
			if !asDecodeError(err, &de) {
				t.Fatalf("got %v, want *DecodeError %s", err, tc.want)
			}
			if de.Reason != tc.want {
				t.Fatalf("got reason %s (%v), want %s", de.Reason, err, tc.want)
			}
		})
	}
}

func deep(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 0x91
	}
	return append(b, 0x00)
}

func TestDecodeParentZeroMeansNoParent(t *testing.T) {
	in := &kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockStored{
		BlockHashes: []uint64{7}, TokenIDs: make([]uint32, 16), BlockSize: 16}}}
	payload := kvevents.Encode(in, kvevents.EncodingArray)
	// Replace the nil parent (0xc0 after the hashes) with uint64 0 (0xcf + 8 zero bytes).
	i := indexAfter(payload, []byte{0x91, 0x07}) // [7]
	p := append(append(append([]byte{}, payload[:i]...), 0xcf, 0, 0, 0, 0, 0, 0, 0, 0), payload[i+1:]...)
	var b kvevents.Batch
	if err := kvevents.Decode(p, &b); err != nil {
		t.Fatal(err)
	}
	if s := b.Events[0].(*kvevents.BlockStored); s.HasParent {
		t.Fatalf("parent 0 decoded as a parent: %+v", s)
	}
}

func indexAfter(b, sub []byte) int {
	for i := 0; i+len(sub) <= len(b); i++ {
		if string(b[i:i+len(sub)]) == string(sub) {
			return i + len(sub)
		}
	}
	panic("not found")
}

// TestDecodeReusesBatch: decoding a smaller batch after a larger one leaves no stale
// fields behind.
func TestDecodeReuse(t *testing.T) {
	full := &kvevents.Batch{TS: 1, DPRank: 2, HasDPRank: true, Events: []kvevents.Event{
		&kvevents.BlockStored{BlockHashes: []uint64{1, 2}, ParentHash: 9, HasParent: true,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoRAID: 3, HasLoRAID: true,
			LoRAName: "a", Medium: "GPU", GroupIdx: 1, HasGroupIdx: true, ExtraKeys: []byte{0x90},
			KVCacheSpecKind: "k", KVCacheSpecSlidingWindow: 5, HasSlidingWindow: true},
		&kvevents.BlockRemoved{BlockHashes: []uint64{1}, Medium: "GPU", GroupIdx: 1, HasGroupIdx: true},
	}}
	bare := &kvevents.Batch{TS: 2, Events: []kvevents.Event{
		&kvevents.BlockStored{BlockHashes: []uint64{5}, TokenIDs: []uint32{7, 8}, BlockSize: 2},
		&kvevents.BlockRemoved{BlockHashes: []uint64{5}},
	}}
	for _, enc := range []kvevents.Encoding{kvevents.EncodingArray, kvevents.EncodingMap} {
		t.Run(enc.String(), func(t *testing.T) {
			var b kvevents.Batch
			if err := kvevents.Decode(kvevents.Encode(full, enc), &b); err != nil {
				t.Fatal(err)
			}
			if err := kvevents.Decode(kvevents.Encode(bare, enc), &b); err != nil {
				t.Fatal(err)
			}
			if got, want := dump(normalise(&b)), dump(normalise(bare)); got != want {
				t.Fatalf("stale fields after reuse\n got %s\nwant %s", got, want)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, g := range loadGolden(f) {
		f.Add(g.payload)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var b kvevents.Batch
		err := kvevents.Decode(payload, &b)
		if err != nil {
			var de *kvevents.DecodeError
			if !asDecodeError(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			return
		}
		// Whatever decodes must survive a round trip through both encodings unchanged.
		for _, enc := range []kvevents.Encoding{kvevents.EncodingArray, kvevents.EncodingMap} {
			var again kvevents.Batch
			if err := kvevents.Decode(kvevents.Encode(&b, enc), &again); err != nil {
				t.Fatalf("re-decode (%v): %v", enc, err)
			}
			if got, want := dump(normalise(&again)), dump(normalise(&b)); got != want {
				t.Fatalf("round trip (%v)\n got %s\nwant %s", enc, got, want)
			}
		}
	})
}
