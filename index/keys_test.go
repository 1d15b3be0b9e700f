package index_test

import (
	"encoding/binary"
	"fmt"
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

// fakePrefix is a PrefixKeys over fixed segment ends, storing keys in a map.
type fakePrefix struct {
	ends   []int
	stored map[[3]uint64][]uint64
	stores int
}

func (p *fakePrefix) Ends() []int { return p.ends }

func (p *fakePrefix) SegmentKeys(i int, root uint64, bs int) []uint64 {
	return p.stored[[3]uint64{uint64(i), root, uint64(bs)}]
}

func (p *fakePrefix) StoreSegmentKeys(i int, root uint64, bs int, keys []uint64) {
	p.stores++
	p.stored[[3]uint64{uint64(i), root, uint64(bs)}] = slices.Clone(keys)
}

func TestPrefixedKeys(t *testing.T) {
	root := index.Root("m", "", "")
	tokens := seq(3, 200)
	tests := []struct {
		name string
		ends []int
	}{
		{"no segments", nil},
		{"segments on block boundaries", []int{32, 64, 160}},
		{"segments inside blocks", []int{5, 17, 18, 40, 111, 199}},
		{"a segment shorter than a block", []int{3, 7, 9, 100}},
		{"segments past the tokens are ignored", []int{50, 120, 260, 300}},
		{"a segment ending with the tokens", []int{100, 200}},
		{"decreasing ends stop the prefix", []int{40, 20, 90}},
	}
	for _, tc := range tests {
		for _, bs := range []int{1, 16, 33} {
			t.Run(fmt.Sprintf("%s/bs=%d", tc.name, bs), func(t *testing.T) {
				want := index.Keys(root, tokens, bs, nil)
				p := &fakePrefix{ends: tc.ends, stored: map[[3]uint64][]uint64{}}
				if got := index.PrefixedKeys(root, tokens, bs, p, []uint64{7}); !slices.Equal(got[1:], want) || got[0] != 7 {
					t.Fatalf("first call: %d keys differ from Keys' %d", len(got)-1, len(want))
				}
				first := p.stores
				if got := index.PrefixedKeys(root, tokens, bs, p, nil); !slices.Equal(got, want) {
					t.Fatal("keys taken from the stored segments differ from Keys'")
				}
				if p.stores != first {
					t.Errorf("second call stored %d segments again, want none", p.stores-first)
				}
				if got := index.PrefixedKeys(index.Root("other", "", ""), tokens, bs, p, nil); slices.Equal(got, want) && len(want) > 0 {
					t.Error("another root took this root's stored keys")
				}
			})
		}
	}
	t.Run("stored keys of the wrong count are recomputed", func(t *testing.T) {
		p := &fakePrefix{ends: []int{64, 128}, stored: map[[3]uint64][]uint64{{0, root, 16}: {1, 2, 3}}}
		if got, want := index.PrefixedKeys(root, tokens, 16, p, nil), index.Keys(root, tokens, 16, nil); !slices.Equal(got, want) {
			t.Fatal("keys differ")
		}
	})
	t.Run("nil prefix and block size 0", func(t *testing.T) {
		if got := index.PrefixedKeys(root, tokens, 16, nil, nil); !slices.Equal(got, index.Keys(root, tokens, 16, nil)) {
			t.Error("nil prefix: keys differ")
		}
		if got := index.PrefixedKeys(root, tokens, 0, &fakePrefix{ends: []int{10}}, nil); len(got) != 0 {
			t.Error("block size 0 gave keys")
		}
	})
}
