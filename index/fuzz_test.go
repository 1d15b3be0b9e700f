package index_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/index"
)

// FuzzOps drives the index with arbitrary Store, Remove, Clear, Purge and SetCapacity
// calls decoded from the input (handles, parents, token counts and block sizes all
// hostile), checking that nothing panics, every error is one of the documented ones, and
// the block count always equals the per-rank stats and never exceeds the caps.
func FuzzOps(f *testing.F) {
	f.Add([]byte("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"))
	f.Add([]byte("\x00\x00\x00\x04\x01\x00\x00\x00\x00\x00\x00\x00\x02\x01\x00\x00\x03\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ix, err := index.New(index.Config{DefaultBlocksPerRank: 8, Headroom: 1, MaxBlocksPerRank: 16}, nil)
		if err != nil {
			t.Fatal(err)
		}
		eps := []string{"A", "B", "C"}
		next := func(n int) int {
			if len(data) == 0 {
				return 0
			}
			v := int(data[0]) % n
			data = data[1:]
			return v
		}
		for len(data) > 0 {
			ep, rank := eps[next(3)], next(3)
			switch next(6) {
			case 0, 1:
				nb, bs := next(5), next(6)-1
				ntok := nb*max(bs, 0) + next(3) - 1
				b := index.Blocks{Root: uint64(next(3)), BlockSize: bs, HasParent: next(2) == 1, Parent: uint64(next(8))}
				for i := range nb {
					b.Handles = append(b.Handles, uint64(next(8)+i%2))
				}
				for i := range max(ntok, 0) {
					b.Tokens = append(b.Tokens, uint32(next(4)+i%3))
				}
				_ = ix.Store(ep, rank, b)
			case 2:
				var hs []uint64
				for range next(4) {
					hs = append(hs, uint64(next(9)))
				}
				ix.Remove(ep, rank, hs)
			case 3:
				ix.Clear(ep, rank)
			case 4:
				ix.Purge(ep)
			case 5:
				ix.SetCapacity(ep, next(20)-2)
			}
			total := 0
			for _, es := range ix.Stats() {
				for _, rs := range es.Ranks {
					if rs.Blocks > rs.Capacity {
						t.Fatalf("%s rank %d holds %d blocks over its cap %d", es.Endpoint, rs.Rank, rs.Blocks, rs.Capacity)
					}
					total += rs.Blocks
				}
			}
			if blocks, keys := ix.Len(); blocks != total || keys > blocks {
				t.Fatalf("Len = %d blocks %d keys, stats sum %d", blocks, keys, total)
			}
			keys := index.Keys(0, []uint32{0, 1, 2, 3, 4, 5}, 2, nil)
			for _, n := range ix.LeadingBlocks(keys, eps, nil) {
				if n < 0 || n > len(keys) {
					t.Fatalf("impossible leading count %d", n)
				}
			}
		}
	})
}
