// Package testindex is a fake of the block index for policy tests: per endpoint, the
// block keys a test says it holds, answered as scoring.PrefixIndex's LeadingBlocks. It is
// safe for concurrent use.
package testindex

import "sync"

// Index holds, per endpoint, a set of block keys.
type Index struct {
	mu   sync.Mutex
	held map[string]map[uint64]bool
}

// New returns an empty Index.
func New() *Index { return &Index{held: map[string]map[uint64]bool{}} }

// Hold records that endpoint ep holds keys.
func (f *Index) Hold(ep string, keys []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[ep] == nil {
		f.held[ep] = map[uint64]bool{}
	}
	for _, k := range keys {
		f.held[ep][k] = true
	}
}

// Clear forgets every key of endpoint ep, as the index does when its events restart.
func (f *Index) Clear(ep string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.held, ep)
}

// LeadingBlocks appends to dst, per endpoint of eps, how many leading keys it holds.
func (f *Index) LeadingBlocks(keys []uint64, eps []string, dst []int) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	dst = dst[:0]
	for _, ep := range eps {
		n := 0
		for n < len(keys) && f.held[ep][keys[n]] {
			n++
		}
		dst = append(dst, n)
	}
	return dst
}
