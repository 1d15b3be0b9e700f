package kvevents_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/kvevents"
)

func TestCacheSalt(t *testing.T) {
	str := func(s string) []byte { return append([]byte{0xa0 | byte(len(s))}, s...) }
	arr := func(elems ...[]byte) []byte {
		b := []byte{0x90 | byte(len(elems))}
		for _, e := range elems {
			b = append(b, e...)
		}
		return b
	}
	mm := arr(str("mmhash"), []byte{0x03})                  // ("mmhash", 3): identifier and offset
	digest := append([]byte{0xc4, 32}, make([]byte, 32)...) // prompt-embeds sha256
	cases := []struct {
		name   string
		ev     kvevents.BlockStored
		want   string
		wantOK bool
	}{
		{"salt only", kvevents.BlockStored{ExtraKeys: arr(arr(str("s1")), []byte{0xc0})}, "s1", true},
		{"lora then salt", kvevents.BlockStored{LoRAName: "ad", ExtraKeys: arr(arr(str("ad"), str("s2")))}, "s2", true},
		{"lora, mm, salt, embeds", kvevents.BlockStored{LoRAName: "ad",
			ExtraKeys: arr(arr(str("ad"), mm, str("s3"), digest))}, "s3", true},
		{"lora only", kvevents.BlockStored{LoRAName: "ad", ExtraKeys: arr(arr(str("ad")))}, "", false},
		{"mm only", kvevents.BlockStored{ExtraKeys: arr(arr(mm))}, "", false},
		{"lora named like the salt is still the lora", kvevents.BlockStored{LoRAName: "x",
			ExtraKeys: arr(arr(str("x")))}, "", false},
		{"first block without extra keys", kvevents.BlockStored{ExtraKeys: arr([]byte{0xc0}, arr(str("s")))}, "", false},
		{"not a first block", kvevents.BlockStored{HasParent: true, ParentHash: 1, ExtraKeys: arr(arr(str("s")))}, "", false},
		{"ambiguous bare mm identifiers", kvevents.BlockStored{ExtraKeys: arr(arr(str("m1"), str("s")))}, "", false},
		{"no extra keys", kvevents.BlockStored{}, "", false},
		{"garbage", kvevents.BlockStored{ExtraKeys: []byte{0x91, 0x92, 0xa5}}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.ev.CacheSalt()
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("CacheSalt() = %q, %v; want %q, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestCacheSaltGolden reads the salt from a Python-produced payload.
func TestCacheSaltGolden(t *testing.T) {
	for _, g := range loadGolden(t) {
		if g.name != "array_v9" {
			continue
		}
		var b kvevents.Batch
		if err := kvevents.Decode(g.payload, &b); err != nil {
			t.Fatal(err)
		}
		if salt, ok := b.Events[0].(*kvevents.BlockStored).CacheSalt(); salt != "salt-abc" || !ok {
			t.Fatalf("CacheSalt() = %q, %v; want salt-abc", salt, ok)
		}
		return
	}
	t.Fatal("golden array_v9 missing")
}
