package app

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"time"
)

// memLimitInterval is how often the soft memory limit follows the live heap: a second
// is many collections at load and costs a few microseconds (runtime/metrics, no
// stop-the-world).
const memLimitInterval = time.Second

// memLimitWindow is how many updates the live heap is the least of: a minute. The live
// heap of a collection that ran while bodies were held for parsing counts them, which
// the budget already covers; the least live heap of the last minute is the router's own
// (index, caches, tokenizers), which grows over minutes, not seconds. A heap that grows
// by more than the budget at once (a model loaded) is taken at once, less the budget.
const memLimitWindow = 60

// memLimiter keeps the Go runtime's soft memory limit at what Go's default GOGC=100
// would let the heap reach over the live heap of the last collection, plus the body
// budget: min(GOMEMLIMIT, 2 x live heap + runtime overhead + limits.body_budget_bytes).
//
// Why: the Helm chart runs kvrouter with GOGC=400 (a collection every ~5x the live heap,
// so a fifth of the collections of small requests; extproc/README.md, Performance) and
// GOMEMLIMIT at the container's limit. With those alone, garbage piles up to 5x the
// live heap whatever the body budget says: 24 parallel 15 MB bodies streamed through
// leave 360 MB of gRPC chunks behind, and the peak RSS passed 2x the idle RSS + the
// budget (issue 12). The limit lets GOGC=400 keep its fewer collections while the heap
// stays under it (a heap of ~24 MiB with the default 112 MiB budget: 5x is well under
// 2x + 112 MiB) and makes the collector run sooner only when garbage would pass what
// the budget allows. It follows the live heap (the index and caches grow after start):
// with own the router's live heap (below), the live heap is at most own + budget, so
// the limit, 2 x own + budget, never sits under it and the collector never thrashes.
type memLimiter struct {
	budget int64                         // limits.body_budget_bytes
	env    int64                         // the limit at start: GOMEMLIMIT, or math.MaxInt64 when unset
	read   func() (live, overhead int64) // runtimeHeap
	set    func(int64) int64             // debug.SetMemoryLimit
	lives  []int64                       // the live heap of the last memLimitWindow updates
}

// Metric names read by the limiter.
const (
	metricHeapLive  = "/gc/heap/live:bytes"
	metricTotal     = "/memory/classes/total:bytes"
	metricHeapObj   = "/memory/classes/heap/objects:bytes"
	metricHeapUnuse = "/memory/classes/heap/unused:bytes"
	metricHeapFree  = "/memory/classes/heap/free:bytes"
	metricHeapRel   = "/memory/classes/heap/released:bytes"
)

func newMemLimiter(budget int64) *memLimiter {
	return &memLimiter{budget: budget, env: debug.SetMemoryLimit(-1), read: runtimeHeap, set: debug.SetMemoryLimit}
}

// softLimit is the limit for a live heap of live bytes and overhead bytes of runtime
// memory outside the heap (stacks, metadata), never above env.
func softLimit(env, live, overhead, budget int64) int64 {
	if live <= 0 {
		return env
	}
	l := 2*live + overhead + budget
	if l < 0 || l > env { // overflow, or above GOMEMLIMIT
		return env
	}
	return l
}

// runtimeHeap reads the live heap as of the last collection and the runtime's memory
// outside the heap (stacks, GC metadata, other runtime structures).
func runtimeHeap() (live, overhead int64) {
	s := []metrics.Sample{{Name: metricHeapLive}, {Name: metricTotal}, {Name: metricHeapObj},
		{Name: metricHeapUnuse}, {Name: metricHeapFree}, {Name: metricHeapRel}}
	metrics.Read(s)
	v := func(i int) int64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(min(s[i].Value.Uint64(), math.MaxInt64))
	}
	return v(0), max(v(1)-v(2)-v(3)-v(4)-v(5), 0)
}

// update sets the limit once from the runtime's current figures and returns it.
func (m *memLimiter) update() int64 {
	live, overhead := m.read()
	if len(m.lives) == memLimitWindow {
		m.lives = append(m.lives[:0], m.lives[1:]...)
	}
	m.lives = append(m.lives, live)
	// The router's own live heap: the least of the window, or the latest less what
	// bodies can hold, when the heap has grown by more than that (a model loaded).
	own := max(slices.Min(m.lives), live-m.budget)
	l := softLimit(m.env, own, overhead, m.budget)
	m.set(l)
	return l
}

// run updates the limit every memLimitInterval until ctx ends, then restores the limit
// it found. It collects once first, so that the first live heap is the router's
// after start-up, not one counting the garbage of loading the tokenizers.
func (m *memLimiter) run(ctx context.Context) {
	defer m.set(m.env)
	runtime.GC()
	t := time.NewTicker(memLimitInterval)
	defer t.Stop()
	for {
		m.update()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
