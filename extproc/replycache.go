package extproc

import (
	"sync"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// maxCachedReplies bounds replyCache; past it replies are built per request. Replies are
// keyed by endpoint address and decision kind (a policy's closed set), so a fleet stays
// far below it unless fallbacks make many distinct destination lists.
const maxCachedReplies = 4096

// replyKey is what a cached reply depends on: a destination or served endpoint, and the
// decision's kind (scoring.Decision.Kind, "" for the served reply).
type replyKey struct{ addr, kind string }

// replyCache memoizes replies that depend only on a short key (the decision reply for a
// destination and decision kind, the response-headers reply for a served endpoint), so the hot path does
// not rebuild the same header mutation and dynamic-metadata Struct (two maps) on every
// request. A cached reply is shared by every stream and never mutated after it is
// stored: gRPC only marshals it, which protobuf-go allows concurrently.
type replyCache struct {
	m sync.Map // replyKey -> *extprocv3.ProcessingResponse
	n atomic.Int64
}

func (c *replyCache) get(key replyKey, build func() *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	if r, ok := c.m.Load(key); ok {
		return r.(*extprocv3.ProcessingResponse)
	}
	r := build()
	if c.n.Load() >= maxCachedReplies {
		return r
	}
	if prev, loaded := c.m.LoadOrStore(key, r); loaded {
		return prev.(*extprocv3.ProcessingResponse)
	}
	c.n.Add(1)
	return r
}
