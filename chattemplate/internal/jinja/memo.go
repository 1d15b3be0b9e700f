package jinja

import (
	"math/big"
	"sync/atomic"
	"unsafe"
)

// Incremental rendering. A chat template renders a conversation with a loop over
// messages, and turn k+1 of a conversation re-sends turn k's messages: most of the
// loop's iterations render exactly what they rendered last turn. An iteration's output
// is a function of the item it visits, the values its scope starts from, and what it
// reads from outside itself (loop.last, namespace attributes, other messages, ...).
//
// At compile time, each top-level for loop (one not inside another loop or a macro)
// whose body the analysis below can follow is marked memoizable: every maximal
// sub-expression of its body that depends on nothing but state outside the iteration
// is wrapped in a recordExpr, and every namespace assignment to a namespace from
// outside the iteration is marked as an outer write. At render time, with an
// IterationCache, each iteration whose item is a dict (a message) is executed while
// recording those reads (expression and value) and writes, in order, and stored with
// its output under (template, loop, index, item). A later render reuses a stored
// iteration only when its scope starts from the same values and every recorded read,
// re-evaluated in order in the new render (replaying the recorded writes between
// them), gives the same value: the interpreter is deterministic, so the iteration
// would then take the same path and write the same output. Otherwise the writes are
// undone and the iteration is executed (and recorded again). Iterations that call a
// macro or an impure global (strftime_now) are never stored.
//
// Qwen3's template shows why the reads are needed: an assistant message after the
// last user query renders its reasoning, so an earlier assistant turn renders
// differently once a new user message moves ns.last_query_index; the recorded read of
// `loop.index0 > ns.last_query_index` then differs and the iteration is rendered again.

// IterationCache stores rendered loop iterations across renders. The item is the dict
// the iteration visited; an implementation keeps an iteration only as long as it
// keeps the item (a message cache entry), so that the item's identity stands for its
// content. Implementations must be safe for concurrent use.
type IterationCache interface {
	Iteration(item *Dict, key IterationKey) *Iteration
	StoreIteration(item *Dict, key IterationKey, it *Iteration)
}

// iterationKeeper is implemented by IterationCaches that can tell before an iteration
// is rendered whether they would keep it: an iteration they would drop is then not
// recorded, which spares a copy of its output (a huge message's, otherwise copied for
// nothing).
type iterationKeeper interface {
	KeepsIteration(item *Dict, key IterationKey) bool
}

func keeps(c IterationCache, item *Dict, key IterationKey) bool {
	k, ok := c.(iterationKeeper)
	return !ok || k.KeepsIteration(item, key)
}

// IterationKey names one iteration of one loop of one template.
type IterationKey struct {
	Template *Template
	Loop     int
	Index    int
}

// Iteration is a rendered loop iteration and what it depended on. It is immutable.
type Iteration struct {
	id     uint64 // unique over the process's life (iterationIDs): names out
	out    string
	brk    bool
	entry  []Value // the scope's values at the start of the iteration
	events []event
	size   int64
}

// Bytes is the memory the iteration holds: its output, its recorded values and a
// fixed overhead (values read from outside that are lists or dicts are counted in
// full, up to maxRecordedBytes each).
func (it *Iteration) Bytes() int64 { return it.size }

// event is one read of an outer expression (read != nil) or one write to an outer
// namespace (write != nil), with the value read or written.
type event struct {
	read  *recordExpr
	write *nsSetStmt
	v     Value
}

const (
	// iterationOverhead is an Iteration's header, its slices' headers and a cache
	// slot.
	iterationOverhead = 128
	// eventBytes is one event (two pointers and a Value).
	eventBytes = 64
	// valueHeader is the size of a Value.
	valueHeader = 48
	// maxRecordedBytes: an iteration that reads (or starts from) a list or dict
	// larger than this from outside is not stored (comparing it would cost what
	// rendering does, and it would be kept alive by the cache).
	maxRecordedBytes = 4096
	// memoWarmup: a loop records its first memoWarmup iterations, and the rest only
	// once one was reused, so a loop whose iterations never repeat (one over
	// messages[::-1], whose indices shift every turn) costs little.
	memoWarmup = 8
)

// iterationIDs numbers Iterations: an id is never given twice, so that it names the
// (immutable) output of one Iteration (see Provenance).
var iterationIDs atomic.Uint64

// Provenance describes where a render's output is made of stored iterations: from
// Start on (an offset into the output the render appended to dst), the output is the
// outputs of the iterations IDs names (replayed from the cache or rendered and stored
// by this render), back to back, the i-th ending at Ends[i]. An Iteration is
// immutable and its id is never given to another, so two renders whose outputs agree
// up to Start and whose IDs agree up to i have the same output up to Ends[i], a fact
// the render proved by writing those outputs and that nothing needs to compare again.
// Only the first run of back-to-back iterations written to the render's own output
// (not to a captured block) is described.
//
// With Deferred set, the render leaves the bytes of the described iterations it
// replays from the cache unwritten (the output has their length, not their bytes):
// a caller that derives what it needs of those bytes from the ids (prompt: the
// tokenizer's cached ids) need not have them copied. Fill writes them.
type Provenance struct {
	Start int
	Ends  []int
	IDs   []uint64
	// Deferred, set by the caller and kept by Reset, defers the replayed
	// iterations' bytes to Fill.
	Deferred bool
	base     int    // len(dst)
	done     bool   // the run ended: later iterations are not described
	holes    []hole // the deferred outputs, in order
}

// hole is a deferred iteration's output, at offset at (as Ends: from base).
type hole struct {
	at  int
	out string
}

// Reset empties p for a render, keeping its memory and Deferred.
func (p *Provenance) Reset() {
	clear(p.holes) // no reference to stored iterations' outputs kept
	*p = Provenance{Ends: p.Ends[:0], IDs: p.IDs[:0], Deferred: p.Deferred, holes: p.holes[:0]}
}

// Fill writes into out, the slice the render returned, the deferred bytes of every
// iteration ending after from (an offset as Ends), so that out[base+from:] then holds
// the render's output; the bytes before from that were deferred stay unwritten. Calls
// with a lower from write what earlier ones left.
func (p *Provenance) Fill(out []byte, from int) {
	i := len(p.holes)
	for i > 0 && p.holes[i-1].at+len(p.holes[i-1].out) > from {
		i--
	}
	for _, h := range p.holes[i:] {
		copy(out[p.base+h.at:], h.out)
	}
	clear(p.holes[i:])
	p.holes = p.holes[:i]
}

// Poison writes b over the deferred bytes of out (the slice the render returned):
// tests make a reader of bytes it never had filled fail.
func (p *Provenance) Poison(out []byte, b byte) {
	for _, h := range p.holes {
		for i := range len(h.out) {
			out[p.base+h.at+i] = b
		}
	}
}

// DeferredBytes returns the number of bytes of the render's output left unwritten.
func (p *Provenance) DeferredBytes() int {
	n := 0
	for _, h := range p.holes {
		n += len(h.out)
	}
	return n
}

// continues reports whether an iteration's output starting at start (in the
// output) would be described: p is on, its run has not ended, and start is where the
// run's last output ends.
func (st *state) continues(start int) bool {
	p := st.prov
	if p == nil || p.done || st.out != st.main {
		return false
	}
	return len(p.IDs) == 0 || p.Ends[len(p.Ends)-1] == start-p.base
}

// replayOut writes a replayed iteration's output, or with a deferred provenance
// leaves room for it when nothing of the render reads it back (no enclosing
// iteration is being recorded) and the provenance describes it.
func (st *state) replayOut(it *Iteration) {
	start := st.out.Len()
	if st.rec == nil && st.prov != nil && st.prov.Deferred && st.continues(start) {
		st.out.skip(len(it.out))
		st.prov.holes = append(st.prov.holes, hole{at: start - st.prov.base, out: it.out})
	} else {
		st.out.WriteString(it.out)
	}
	st.note(start, it)
}

// note records that the output from start to its end is it's output.
func (st *state) note(start int, it *Iteration) {
	p := st.prov
	if p == nil || p.done || st.out != st.main {
		return
	}
	if !st.continues(start) { // output no iteration names came between
		p.done = true
		return
	}
	if len(p.IDs) == 0 {
		p.Start = start - p.base
	}
	p.Ends = append(p.Ends, st.out.Len()-p.base)
	p.IDs = append(p.IDs, it.id)
}

// RenderStats counts the memoizable loop iterations of one render.
type RenderStats struct {
	// Reused iterations came from the IterationCache; Rendered ones were executed.
	Reused, Rendered int
	// Settled iterations of loops without output were skipped after a quiet one
	// (settle.go).
	Settled int
}

// RenderCached appends to dst what Render renders, reusing the iterations of
// memoizable loops that cache holds and storing the ones it renders. dst may be a
// buffer the caller reuses: nothing of the render keeps a reference to it.
func (t *Template) RenderCached(dst []byte, vars Vars, cache IterationCache) ([]byte, RenderStats, error) {
	return t.RenderTraced(dst, vars, cache, nil)
}

// RenderTraced is RenderCached that also fills prov (when not nil, after resetting
// it) with where the output is made of stored iterations.
func (t *Template) RenderTraced(dst []byte, vars Vars, cache IterationCache, prov *Provenance) ([]byte, RenderStats, error) {
	if prov != nil {
		prov.Reset()
		prov.base = len(dst)
	}
	st := &state{t: t, top: make([]Value, len(t.names)), cache: cache, prov: prov}
	for i, name := range t.names {
		if v, ok := vars.Lookup(name); ok {
			st.top[i] = v
		} else {
			st.top[i] = t.defaults[i]
		}
	}
	st.out = &output{b: dst}
	st.main = st.out
	if _, err := execBody(st, t.body); err != nil {
		if prov != nil {
			prov.Reset()
		}
		return nil, st.stats, err
	}
	return st.out.b, st.stats, nil
}

// recorder collects one iteration's reads and writes of outer state.
type recorder struct {
	events  []event
	tainted bool // called a macro or an impure function: not stored
	size    int64
}

// recordExpr is a maximal sub-expression of a memoizable loop's body that depends
// only on state outside the iteration.
type recordExpr struct{ x expr }

func (e *recordExpr) eval(st *state) (Value, error) {
	v, err := e.x.eval(st)
	if st.rec != nil && err == nil {
		st.rec.note(event{read: e, v: v})
	}
	return v, err
}

func (r *recorder) note(ev event) {
	n, ok := recordedSize(ev.v)
	if !ok {
		r.tainted = true
		return
	}
	r.size += eventBytes + n
	r.events = append(r.events, ev)
}

// recordedSize is the memory a recorded value keeps beyond its header, or false when
// it is too large (or of a kind that cannot be compared) to be recorded.
func recordedSize(v Value) (int64, bool) {
	budget := int64(maxRecordedBytes)
	n := deepSize(v, &budget)
	return n, budget >= 0
}

func deepSize(v Value, budget *int64) int64 {
	var n int64
	switch v.kind {
	case KindString, KindUndefined:
		n = int64(len(v.s))
	case KindBigInt:
		n = 32 + int64(len(v.ref.(*big.Int).Bits()))*8
	case KindList:
		items := v.items()
		n = int64(len(items)) * valueHeader
		*budget -= n
		for _, it := range items {
			if *budget < 0 {
				return n
			}
			n += deepSize(it, budget)
		}
		return n
	case KindDict:
		pairs := v.dict().pairs
		n = int64(len(pairs)) * 2 * valueHeader
		*budget -= n
		for _, p := range pairs {
			if *budget < 0 {
				return n
			}
			n += deepSize(p.Key, budget) + deepSize(p.Value, budget)
		}
		return n
	case KindNone, KindBool, KindInt, KindFloat:
	case KindNamespace, KindMacro:
		// compared by identity: a namespace made in this render never matches, a
		// macro is part of the compiled template
	default:
		*budget = -1 // loops, functions and methods are not compared
	}
	*budget -= n
	return n
}

// sameValue reports whether a and b are the same value for the template: equal
// scalars and strings, identical or element-wise same lists and dicts (up to a budget
// of elements), the same macro.
func sameValue(a, b Value, budget *int) bool {
	if a.kind != b.kind {
		return false
	}
	*budget--
	if *budget < 0 {
		return false
	}
	switch a.kind {
	case KindUndefined, KindString:
		return a.s == b.s
	case KindNone:
		return true
	case KindBool, KindInt, KindFloat:
		return a.n == b.n
	case KindBigInt:
		return a.ref.(*big.Int).Cmp(b.ref.(*big.Int)) == 0
	case KindList:
		x, y := a.ref.(*List), b.ref.(*List)
		if x == y {
			return true
		}
		if len(x.Items) != len(y.Items) || x.Tuple != y.Tuple || x.view != y.view {
			return false
		}
		for i := range x.Items {
			if !sameValue(x.Items[i], y.Items[i], budget) {
				return false
			}
		}
		return true
	case KindDict:
		x, y := a.dict(), b.dict()
		if x == y {
			return true
		}
		if len(x.pairs) != len(y.pairs) {
			return false
		}
		for i := range x.pairs {
			if !sameValue(x.pairs[i].Key, y.pairs[i].Key, budget) || !sameValue(x.pairs[i].Value, y.pairs[i].Value, budget) {
				return false
			}
		}
		return true
	case KindMacro:
		return a.ref.(*macro) == b.ref.(*macro)
	}
	// Namespaces are never the same: one read as a value (not through an attribute,
	// which is recorded by its value) could be written through a local alias. Loops,
	// functions and methods are not compared.
	return false
}

func sameValues(a, b []Value) bool {
	if len(a) != len(b) {
		return false
	}
	budget := 1 << 12
	for i := range a {
		if !sameValue(a[i], b[i], &budget) {
			return false
		}
	}
	return true
}

// loopMemo marks a memoizable loop.
type loopMemo struct {
	id int
}

// execMemo runs the loop over items with the render's IterationCache.
func (s *forStmt) execMemo(st *state, items []Value, saved []Value, loop *loopState) error {
	entryOK := true
	var entrySize int64
	for _, v := range saved {
		n, ok := recordedSize(v)
		entryOK = entryOK && ok
		entrySize += valueHeader + n
	}
	reused := 0
	// sameEntry is a stored entry found the same as saved since the last executed
	// iteration: the iterations stored by one render share their entry, and only an
	// executed iteration can change what the comparison reads (a replay writes
	// namespace attributes, which compare as never the same), so a long conversation's
	// replays compare the entry once rather than once each.
	var sameEntry []Value
	for i, it := range items {
		item := it.Dict()
		key := IterationKey{Template: st.t, Loop: s.memo.id, Index: i}
		if item != nil && entryOK {
			if prev := st.cache.Iteration(item, key); prev != nil {
				same := len(sameEntry) > 0 && len(prev.entry) == len(sameEntry) && unsafe.SliceData(prev.entry) == unsafe.SliceData(sameEntry)
				if !same && sameValues(prev.entry, saved) {
					same, sameEntry = true, prev.entry
				}
				// A replay reads outer state only (recorded expressions read no
				// variable the loop assigns but loop), so the iteration's scope is
				// set up only if it has to execute: the next iteration, or the loop's
				// end, restores it anyway.
				if same && loop != nil {
					loop.index0 = i
					// After a replay the slot holds the loop already: writing it again
					// would cost write barriers on every replayed iteration.
					if v := &st.slots(s.loopRef.local)[s.loopRef.slot]; v.kind != KindLoop || v.ref != any(loop) || v.n != 0 || v.s != "" {
						*v = Value{kind: KindLoop, ref: loop}
					}
				}
				if same && s.replay(st, prev) {
					st.replayOut(prev)
					st.stats.Reused++
					reused++
					if prev.brk {
						break
					}
					continue
				}
			}
		}
		sameEntry = nil
		if err := s.enter(st, saved, loop, i, it); err != nil {
			return err
		}
		if item == nil || !entryOK {
			c, err := execBody(st, s.body)
			if err != nil {
				return err
			}
			if c == ctlBreak {
				break
			}
			continue
		}
		st.stats.Rendered++
		record := (reused > 0 || i < memoWarmup) && keeps(st.cache, item, key)
		var rec recorder
		if record {
			st.rec = &rec
		}
		start := st.out.Len()
		c, err := execBody(st, s.body)
		st.rec = nil
		if err != nil {
			return err
		}
		if record && !rec.tainted {
			out := string(st.out.b[start:])
			it := &Iteration{
				id:  iterationIDs.Add(1),
				out: out, brk: c == ctlBreak, entry: saved, events: rec.events,
				size: iterationOverhead + int64(len(out)) + entrySize + rec.size,
			}
			st.note(start, it)
			st.cache.StoreIteration(item, key, it)
		}
		if c == ctlBreak {
			break
		}
	}
	return nil
}

// replay checks a stored iteration, whose starting scope is the current one (see
// execMemo), against the current render: the same value for every recorded read,
// with the recorded namespace writes applied in between. On success the writes stay
// applied (as executing the iteration would have left them); otherwise they are
// undone.
func (s *forStmt) replay(st *state, it *Iteration) bool {
	type undo struct {
		ns    *Namespace
		attrs *Dict
	}
	var undos []undo
	rollback := func() bool {
		for i := len(undos) - 1; i >= 0; i-- {
			undos[i].ns.attrs = undos[i].attrs
		}
		return false
	}
	st.replaying = true
	defer func() { st.replaying = false }()
	for _, ev := range it.events {
		if ev.read != nil {
			v, err := ev.read.x.eval(st)
			budget := 1 << 12
			if err != nil || !sameValue(v, ev.v, &budget) {
				return rollback()
			}
			continue
		}
		nsv := st.slots(ev.write.ns.local)[ev.write.ns.slot]
		if nsv.kind != KindNamespace {
			return rollback()
		}
		ns := nsv.ref.(*Namespace)
		saved := true
		for _, u := range undos {
			if u.ns == ns {
				saved = false
				break
			}
		}
		if saved {
			undos = append(undos, undo{ns, ns.attrs})
			ns.attrs = ns.attrs.Clone()
		}
		ns.attrs.Set(ev.write.attr, ev.v)
	}
	return true
}

// Analysis of a loop body: which expressions depend only on outer state.
type exprClass uint8

const (
	classConst exprClass = iota // constants and values fixed by the iteration's index
	classOuter                  // depends on state outside the iteration
	classLocal                  // depends on the iteration's item or its own variables
)

type memoAnalysis struct {
	local map[string]bool // names the loop's scope assigns (target, loop, set)
	wrap  bool            // second pass: wrap outer expressions
	ok    bool
}

// markMemoLoops marks the template's top-level loops that can be memoized.
func (t *Template) markMemoLoops(body []stmt, next *int) {
	for _, s := range body {
		switch s := s.(type) {
		case *forStmt:
			if analyseLoop(s) {
				s.memo = &loopMemo{id: *next}
				*next++
			} else {
				markSettled(s)
			}
		case *ifStmt:
			for _, b := range s.bodies {
				t.markMemoLoops(b, next)
			}
			t.markMemoLoops(s.els, next)
		case *setBlockStmt:
			t.markMemoLoops(s.body, next)
		case *filterBlockStmt:
			t.markMemoLoops(s.body, next)
		case *scopeStmt:
			t.markMemoLoops(s.body, next)
		}
	}
}

func analyseLoop(s *forStmt) bool {
	if !writes(s.body) {
		return false // nothing to reuse: executing it costs what checking it would
	}
	a := &memoAnalysis{local: map[string]bool{}, ok: true}
	for _, r := range s.scope.refs {
		if r.local {
			return false // inside a macro
		}
		a.local[r.name] = true
	}
	a.stmts(s.body, false)
	if !a.ok {
		return false
	}
	a.wrap = true
	a.stmts(s.body, false)
	return true
}

// writes reports whether body can write output (outside a captured block).
func writes(body []stmt) bool {
	for _, s := range body {
		switch s := s.(type) {
		case *textStmt, *outputStmt, *filterBlockStmt:
			return true
		case *ifStmt:
			for _, b := range s.bodies {
				if writes(b) {
					return true
				}
			}
			if writes(s.els) {
				return true
			}
		case *forStmt:
			if writes(s.body) || writes(s.els) {
				return true
			}
		case *scopeStmt:
			if writes(s.body) {
				return true
			}
		}
	}
	return false
}

// stmts analyses a body; nested is true inside a nested loop's body, where `loop` is
// that loop's.
func (a *memoAnalysis) stmts(body []stmt, nested bool) {
	for _, s := range body {
		switch s := s.(type) {
		case *textStmt, *breakStmt:
		case *outputStmt:
			a.top(&s.x, nested)
		case *ifStmt:
			for i := range s.conds {
				a.top(&s.conds[i], nested)
				a.stmts(s.bodies[i], nested)
			}
			a.stmts(s.els, nested)
		case *forStmt:
			a.top(&s.iter, nested)
			if s.filter != nil {
				a.top(&s.filter, nested)
			}
			a.stmts(s.body, true)
			a.stmts(s.els, nested)
		case *setStmt:
			a.top(&s.x, nested)
		case *nsSetStmt:
			a.top(&s.x, nested)
			if s.ns.local {
				a.ok = false
			}
			if a.wrap {
				s.outer = !a.local[s.ns.name]
			}
		case *setBlockStmt:
			a.stmts(s.body, nested)
			a.filters(s.filters, nested)
		case *filterBlockStmt:
			a.stmts(s.body, nested)
			a.filters(s.filters, nested)
		case *scopeStmt:
			a.stmts(s.body, nested)
		default: // macros defined in the loop, anything new
			a.ok = false
		}
	}
}

func (a *memoAnalysis) filters(fs []*filterExpr, nested bool) {
	for _, f := range fs {
		for i := range f.args {
			a.top(&f.args[i], nested)
		}
		for i := range f.kwargs {
			a.top(&f.kwargs[i].x, nested)
		}
	}
}

// top classifies an expression evaluated by a statement and wraps it when it is
// outer.
func (a *memoAnalysis) top(p *expr, nested bool) {
	if a.expr(p, nested) == classOuter && a.wrap {
		*p = &recordExpr{x: *p}
	}
}

// expr classifies *p; for an expression that depends on the iteration, it wraps
// (second pass) each of its outer operands.
func (a *memoAnalysis) expr(p *expr, nested bool) exprClass {
	var kids []*expr
	switch e := (*p).(type) {
	case *constExpr:
		return classConst
	case *nameExpr:
		switch {
		case e.ref.local:
			a.ok = false
			return classLocal
		case e.ref.name == "loop" && !nested:
			a.ok = false // the loop object itself escapes: not followed
			return classLocal
		case a.local[e.ref.name]:
			return classLocal
		}
		return classOuter
	case *attrExpr:
		if n, ok := e.obj.(*nameExpr); ok && n.ref.name == "loop" && !nested && !n.ref.local {
			switch e.name {
			case "index", "index0", "first", "cycle":
				return classConst // fixed by the iteration's index
			}
			return classOuter // length, last, revindex, previtem, nextitem, ...
		}
		kids = []*expr{&e.obj}
	default:
		var ok bool
		if kids, ok = children(*p); !ok {
			a.ok = false
			return classLocal
		}
	}
	classes := make([]exprClass, len(kids))
	c := classConst
	for i, k := range kids {
		classes[i] = a.expr(k, nested)
		c = max(c, classes[i])
	}
	if c == classLocal && a.wrap {
		for i, k := range kids {
			if classes[i] == classOuter {
				*k = &recordExpr{x: *k}
			}
		}
	}
	return c
}

// children returns the addresses of an expression's operands, or false for a kind
// of expression the analyses do not follow.
func children(x expr) (kids []*expr, ok bool) {
	switch e := x.(type) {
	case *constExpr, *nameExpr:
		return nil, true
	case *attrExpr:
		kids = []*expr{&e.obj}
	case *itemExpr:
		kids = []*expr{&e.obj, &e.key}
	case *sliceExpr:
		kids = []*expr{&e.obj}
		for _, x := range []*expr{&e.lo, &e.hi, &e.step} {
			if *x != nil {
				kids = append(kids, x)
			}
		}
	case *callExpr:
		kids = append(kids, &e.fn)
		kids = appendArgs(kids, e.args, e.kwargs)
	case *filterExpr:
		if e.arg != nil {
			kids = append(kids, &e.arg)
		}
		kids = appendArgs(kids, e.args, e.kwargs)
	case *testExpr:
		kids = append(kids, &e.arg)
		kids = appendArgs(kids, e.args, e.kwargs)
	case *notExpr:
		kids = []*expr{&e.x}
	case *andExpr:
		kids = []*expr{&e.l, &e.r}
	case *orExpr:
		kids = []*expr{&e.l, &e.r}
	case *condExpr:
		kids = []*expr{&e.cond, &e.then}
		if e.els != nil {
			kids = append(kids, &e.els)
		}
	case *unaryExpr:
		kids = []*expr{&e.x}
	case *binExpr:
		kids = []*expr{&e.l, &e.r}
	case *addExpr:
		for i := range e.xs {
			kids = append(kids, &e.xs[i])
		}
	case *concatExpr:
		for i := range e.xs {
			kids = append(kids, &e.xs[i])
		}
	case *compareExpr:
		kids = append(kids, &e.first)
		for i := range e.ops {
			kids = append(kids, &e.ops[i].x)
		}
	case *listExpr:
		for i := range e.xs {
			kids = append(kids, &e.xs[i])
		}
	case *dictExpr:
		for i := range e.keys {
			kids = append(kids, &e.keys[i], &e.values[i])
		}
	default:
		return nil, false
	}
	return kids, true
}

// appendArgs appends the addresses of a call's, filter's or test's arguments.
func appendArgs(kids []*expr, args []expr, kwargs []kwExpr) []*expr {
	for i := range args {
		kids = append(kids, &args[i])
	}
	for i := range kwargs {
		kids = append(kids, &kwargs[i].x)
	}
	return kids
}
