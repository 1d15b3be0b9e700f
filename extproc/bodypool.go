package extproc

import (
	"math/bits"
	"sync"
)

// bodyPool recycles the buffers FULL_DUPLEX_STREAMED request bodies are reassembled
// into when they come in several chunks with a content-length: without it a 600 KB
// body (a 128k-token conversation) cost a new zeroed buffer and the collections it
// drives each request, about as much CPU as copying the chunks into it
// (BenchmarkDecisionTurnVsCold). Buffers are sized in powers of two from
// minPooledBody to maxPooledBody, one sync.Pool each (so a 10 KB body never holds a
// 16 MiB buffer); a buffer goes back once its body is passed on. What the pool keeps
// is bounded by the streams that held bodies at once, and the collector empties it.
type bodyPool struct {
	classes [bodyClasses]sync.Pool
}

const (
	minPooledBodyShift = 14 // 16 KiB, Envoy's usual chunk: smaller bodies come whole
	maxPooledBodyShift = 24 // 16 MiB, the default MaxBodyBytes
	bodyClasses        = maxPooledBodyShift - minPooledBodyShift + 1
)

// bodyClass is the class of a buffer of at least n bytes, or -1 past the largest.
func bodyClass(n int) int {
	c := max(bits.Len(uint(n-1)), minPooledBodyShift) - minPooledBodyShift
	if c >= bodyClasses {
		return -1
	}
	return c
}

// get returns an empty buffer of at least n bytes.
func (p *bodyPool) get(n int) *[]byte {
	c := bodyClass(n)
	if c < 0 {
		b := make([]byte, 0, n)
		return &b
	}
	if b, _ := p.classes[c].Get().(*[]byte); b != nil {
		return b
	}
	b := make([]byte, 0, 1<<(c+minPooledBodyShift))
	return &b
}

// put takes back a buffer get returned, once nothing reads it.
func (p *bodyPool) put(b *[]byte) {
	n := cap(*b)
	if c := bodyClass(n); c >= 0 && n == 1<<(c+minPooledBodyShift) {
		*b = (*b)[:0]
		p.classes[c].Put(b)
	}
}
