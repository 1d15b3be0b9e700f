package kvevents_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

// goldenExpect mirrors the .json files written by testdata/gen_golden.py.
type goldenExpect struct {
	TS     float64 `json:"ts"`
	DPRank *int    `json:"dp_rank"`
	Exact  *string `json:"exact"`
	Events []struct {
		Type          string   `json:"type"`
		BlockHashes   []uint64 `json:"block_hashes"`
		Parent        *uint64  `json:"parent"`
		TokenIDs      []uint32 `json:"token_ids"`
		BlockSize     int      `json:"block_size"`
		LoRAID        *int64   `json:"lora_id"`
		Medium        *string  `json:"medium"`
		LoRAName      *string  `json:"lora_name"`
		ExtraKeysHex  *string  `json:"extra_keys_hex"`
		GroupIdx      *int     `json:"group_idx"`
		SpecKind      *string  `json:"spec_kind"`
		SlidingWindow *int     `json:"sliding_window"`
	} `json:"events"`
}

type golden struct {
	name    string
	payload []byte
	want    kvevents.Batch
	exact   *kvevents.Encoding
}

func deref[T any](p *T) (T, bool) {
	var zero T
	if p == nil {
		return zero, false
	}
	return *p, true
}

func loadGolden(tb testing.TB) []golden {
	tb.Helper()
	files, err := filepath.Glob("testdata/golden/*.msgpack")
	if err != nil || len(files) == 0 {
		tb.Fatalf("no golden payloads (run testdata/gen_golden.py): %v", err)
	}
	var out []golden
	for _, f := range files {
		payload, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		raw, err := os.ReadFile(strings.TrimSuffix(f, ".msgpack") + ".json")
		if err != nil {
			tb.Fatal(err)
		}
		var exp goldenExpect
		if err := json.Unmarshal(raw, &exp); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		g := golden{name: strings.TrimSuffix(filepath.Base(f), ".msgpack"), payload: payload}
		g.want.TS = exp.TS
		g.want.DPRank, g.want.HasDPRank = deref(exp.DPRank)
		if exp.Exact != nil {
			e := kvevents.EncodingArray
			if *exp.Exact == "map" {
				e = kvevents.EncodingMap
			}
			g.exact = &e
		}
		for _, e := range exp.Events {
			switch e.Type {
			case "BlockStored":
				s := &kvevents.BlockStored{BlockHashes: e.BlockHashes, TokenIDs: e.TokenIDs,
					BlockSize: e.BlockSize, ExtraKeys: []byte{}}
				s.ParentHash, s.HasParent = deref(e.Parent)
				s.LoRAID, s.HasLoRAID = deref(e.LoRAID)
				s.Medium, _ = deref(e.Medium)
				s.LoRAName, _ = deref(e.LoRAName)
				if e.ExtraKeysHex != nil {
					s.ExtraKeys, _ = hex.DecodeString(*e.ExtraKeysHex)
				}
				s.GroupIdx, s.HasGroupIdx = deref(e.GroupIdx)
				s.KVCacheSpecKind, _ = deref(e.SpecKind)
				s.KVCacheSpecSlidingWindow, s.HasSlidingWindow = deref(e.SlidingWindow)
				g.want.Events = append(g.want.Events, s)
			case "BlockRemoved":
				r := &kvevents.BlockRemoved{BlockHashes: e.BlockHashes}
				r.Medium, _ = deref(e.Medium)
				r.GroupIdx, r.HasGroupIdx = deref(e.GroupIdx)
				g.want.Events = append(g.want.Events, r)
			case "AllBlocksCleared":
				g.want.Events = append(g.want.Events, &kvevents.AllBlocksCleared{})
			default:
				tb.Fatalf("%s: unknown type %q", f, e.Type)
			}
		}
		out = append(out, g)
	}
	return out
}

// normalise makes empty and nil slices compare equal.
func normalise(b *kvevents.Batch) *kvevents.Batch {
	c := *b
	c.Events = nil
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *kvevents.BlockStored:
			s := *ev
			if len(s.ExtraKeys) == 0 {
				s.ExtraKeys = nil
			}
			if len(s.TokenIDs) == 0 {
				s.TokenIDs = nil
			}
			if len(s.BlockHashes) == 0 {
				s.BlockHashes = nil
			}
			c.Events = append(c.Events, &s)
		case *kvevents.BlockRemoved:
			r := *ev
			if len(r.BlockHashes) == 0 {
				r.BlockHashes = nil
			}
			c.Events = append(c.Events, &r)
		default:
			c.Events = append(c.Events, ev)
		}
	}
	return &c
}

func TestDecodeGolden(t *testing.T) {
	for _, g := range loadGolden(t) {
		t.Run(g.name, func(t *testing.T) {
			var got kvevents.Batch
			if err := kvevents.Decode(g.payload, &got); err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(normalise(&got), normalise(&g.want)) {
				t.Fatalf("Decode mismatch\n got %s\nwant %s", dump(&got), dump(&g.want))
			}
		})
	}
}

func TestEncodeGoldenExact(t *testing.T) {
	n := 0
	for _, g := range loadGolden(t) {
		if g.exact == nil {
			continue
		}
		n++
		t.Run(g.name, func(t *testing.T) {
			got := kvevents.Encode(&g.want, *g.exact)
			if !bytes.Equal(got, g.payload) {
				t.Fatalf("Encode(%v) differs from Python's bytes\n got %x\nwant %x", *g.exact, got, g.payload)
			}
		})
	}
	if n < 6 {
		t.Fatalf("only %d exact golden payloads", n)
	}
}

// TestRoundTrip encodes every golden batch in both encodings and decodes it back.
func TestRoundTrip(t *testing.T) {
	for _, g := range loadGolden(t) {
		for _, enc := range []kvevents.Encoding{kvevents.EncodingArray, kvevents.EncodingMap} {
			t.Run(g.name+"/"+enc.String(), func(t *testing.T) {
				var got kvevents.Batch
				if err := kvevents.Decode(kvevents.Encode(&g.want, enc), &got); err != nil {
					t.Fatalf("Decode(Encode): %v", err)
				}
				if !reflect.DeepEqual(normalise(&got), normalise(&g.want)) {
					t.Fatalf("round trip mismatch\n got %s\nwant %s", dump(&got), dump(&g.want))
				}
			})
		}
	}
}

// TestDecodeTruncated: every strict prefix of every golden payload is an error, never a
// panic, and the error says truncated.
func TestDecodeTruncated(t *testing.T) {
	var b kvevents.Batch
	for _, g := range loadGolden(t) {
		t.Run(g.name, func(t *testing.T) {
			for i := range len(g.payload) {
				err := kvevents.Decode(g.payload[:i], &b)
				var de *kvevents.DecodeError
				if !asDecodeError(err, &de) || de.Reason != kvevents.ReasonTruncated {
					t.Fatalf("prefix %d/%d: got %v, want truncated", i, len(g.payload), err)
				}
			}
		})
	}
}

func dump(b *kvevents.Batch) string {
	var sb strings.Builder
	sb.WriteString("{")
	j, _ := json.Marshal(struct {
		TS     float64
		DP     int
		HasDP  bool
		Events []any
	}{b.TS, b.DPRank, b.HasDPRank, toAny(b.Events)})
	sb.Write(j)
	sb.WriteString("}")
	return sb.String()
}

func toAny(evs []kvevents.Event) []any {
	out := make([]any, len(evs))
	for i, e := range evs {
		out[i] = struct {
			T string
			E kvevents.Event
		}{reflect.TypeOf(e).String(), e}
	}
	return out
}
