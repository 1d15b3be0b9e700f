package index_test

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvrouter/kvrouter/index"
)

// refKey is the documented definition of a block key, written the slow way.
func refKey(prev uint64, block []uint32) uint64 {
	b := binary.LittleEndian.AppendUint64(nil, prev)
	for _, t := range block {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	return xxhash.Sum64(b)
}

func seq(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

func TestKeys(t *testing.T) {
	root := index.Root("m", "", "")
	for _, bs := range []int{1, 16, 32, 33, 256, 300, 1000} {
		tokens := seq(7, 3*bs+bs/2)
		got := index.Keys(root, tokens, bs, nil)
		if len(got) != 3 {
			t.Fatalf("block size %d: %d keys, want 3 (partial block has no key)", bs, len(got))
		}
		prev := root
		for i := range got {
			want := refKey(prev, tokens[i*bs:(i+1)*bs])
			if got[i] != want {
				t.Fatalf("block size %d, block %d: key %#x, want %#x", bs, i, got[i], want)
			}
			prev = want
		}
	}
}

func TestKeysProperties(t *testing.T) {
	root := index.Root("m", "", "")
	tokens := seq(0, 64)
	full := index.Keys(root, tokens, 16, nil)
	tests := []struct {
		name string
		ok   bool
	}{
		{"a prefix's keys are a prefix of the keys", slices.Equal(index.Keys(root, tokens[:32], 16, nil), full[:2])},
		{"keys append to dst", slices.Equal(index.Keys(root, tokens, 16, []uint64{1})[1:], full)},
		{"block size 0 gives no keys", len(index.Keys(root, tokens, 0, nil)) == 0},
		{"fewer tokens than a block give no keys", len(index.Keys(root, tokens[:15], 16, nil)) == 0},
		{"another root changes every key", !slices.ContainsFunc(index.Keys(index.Root("m", "lora", ""), tokens, 16, nil),
			func(k uint64) bool { return slices.Contains(full, k) })},
		{"one changed token changes its block and all later keys", func() bool {
			c := slices.Clone(tokens)
			c[20]++
			k := index.Keys(root, c, 16, nil)
			return k[0] == full[0] && k[1] != full[1] && k[2] != full[2] && k[3] != full[3]
		}()},
		{"roots separate their fields", index.Root("ab", "c", "") != index.Root("a", "bc", "") &&
			index.Root("m", "", "s") != index.Root("m", "s", "") && index.Root("m", "", "") != index.Root("n", "", "")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.ok {
				t.Fail()
			}
		})
	}
}
