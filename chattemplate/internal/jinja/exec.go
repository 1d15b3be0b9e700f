package jinja

import (
	"slices"
	"strconv"
	"unsafe"
)

type ctl uint8

const (
	ctlNone ctl = iota
	ctlBreak
	ctlContinue
)

// stmt is a compiled statement.
type stmt interface {
	exec(st *state) (ctl, error)
}

// state is one render: the template's slots, the current macro's slots and the output.
type state struct {
	t     *Template
	top   []Value
	local []Value
	out   *output
	depth int

	// Incremental rendering (memo.go): the render's iteration cache (nil: off),
	// the recorder of the iteration being executed, whether a stored iteration is
	// being checked, and the counts.
	cache     IterationCache
	rec       *recorder
	replaying bool
	stats     RenderStats
	// settle observes the iteration of a settled loop being executed (settle.go).
	settle *settleProbe
	// main is the render's own output (out is another while a block is captured);
	// prov, when not nil, is told which of it stored iterations wrote (memo.go).
	main *output
	prov *Provenance
}

const maxMacroDepth = 64

func execBody(st *state, body []stmt) (ctl, error) {
	for _, s := range body {
		if c, err := s.exec(st); err != nil || c != ctlNone {
			return c, err
		}
	}
	return ctlNone, nil
}

func (st *state) write(v Value) error {
	switch v.kind {
	case KindString:
		st.out.WriteString(v.s)
	case KindInt:
		var buf [24]byte
		st.out.Write(strconv.AppendInt(buf[:0], v.n, 10))
	case KindUndefined:
	default:
		s, err := ToStr(v)
		if err != nil {
			return err
		}
		st.out.WriteString(s)
	}
	return nil
}

// output is a render's output: a byte slice, which RenderCached's caller may reuse
// across renders.
type output struct{ b []byte }

func (o *output) WriteString(s string) { o.b = append(o.b, s...) }

func (o *output) Write(p []byte) { o.b = append(o.b, p...) }

func (o *output) Len() int { return len(o.b) }

// skip extends the output by n bytes left unwritten (see Provenance.Deferred).
func (o *output) skip(n int) { o.b = slices.Grow(o.b, n)[:len(o.b)+n] }

// text returns the output as a string sharing its bytes: the output must not be
// written to again.
func (o *output) text() string { return unsafe.String(unsafe.SliceData(o.b), len(o.b)) }

type textStmt struct{ s string }

func (s *textStmt) exec(st *state) (ctl, error) {
	st.out.WriteString(s.s)
	return ctlNone, nil
}

type outputStmt struct{ x expr }

func (s *outputStmt) exec(st *state) (ctl, error) {
	if a, ok := s.x.(*addExpr); ok {
		return ctlNone, a.write(st)
	}
	v, err := s.x.eval(st)
	if err != nil {
		return ctlNone, err
	}
	return ctlNone, st.write(v)
}

type ifStmt struct {
	conds  []expr
	bodies [][]stmt
	els    []stmt
}

func (s *ifStmt) exec(st *state) (ctl, error) {
	for i, c := range s.conds {
		v, err := c.eval(st)
		if err != nil {
			return ctlNone, err
		}
		if v.Truth() {
			return execBody(st, s.bodies[i])
		}
	}
	return execBody(st, s.els)
}

// scope is the set of variables a loop body (or call block) assigns: Jinja2 gives
// each iteration a fresh scope, so they are reset to their outer values before every
// iteration and restored afterwards.
type scope struct {
	refs  []*varRef
	local bool
}

func (sc *scope) save(st *state) []Value {
	if len(sc.refs) == 0 {
		return nil
	}
	slots := st.slots(sc.local)
	saved := make([]Value, len(sc.refs))
	for i, r := range sc.refs {
		saved[i] = slots[r.slot]
	}
	return saved
}

func (sc *scope) restore(st *state, saved []Value) {
	slots := st.slots(sc.local)
	for i, r := range sc.refs {
		slots[r.slot] = saved[i]
	}
}

// target is an assignment target: one name, or names to unpack a sequence into.
type target struct {
	names []*varRef
	tuple bool
}

func (t *target) assign(st *state, v Value) error {
	if !t.tuple {
		st.slots(t.names[0].local)[t.names[0].slot] = v
		return nil
	}
	var items []Value
	switch v.kind {
	case KindList:
		items = v.items()
	case KindString:
		for _, r := range v.s {
			items = append(items, String(string(r)))
		}
	case KindDict:
		for _, p := range v.dict().pairs {
			items = append(items, p.Key)
		}
	case KindUndefined:
		return undefinedError(v)
	default:
		return errorf("cannot unpack non-iterable %s object", v.typeName())
	}
	if len(items) != len(t.names) {
		return errorf("cannot unpack %d values into %d names", len(items), len(t.names))
	}
	for i, r := range t.names {
		st.slots(r.local)[r.slot] = items[i]
	}
	return nil
}

type forStmt struct {
	target  target
	loopRef *varRef // nil when the body never reads loop
	iter    expr
	filter  expr
	body    []stmt
	els     []stmt
	scope   scope
	memo    *loopMemo // nil: not memoizable
	settled bool      // stops after its first quiet iteration (settle.go)
}

// iterate returns the items a for loop visits.
func iterate(v Value) ([]Value, error) {
	switch v.kind {
	case KindList:
		return v.items(), nil
	case KindDict:
		d := v.dict()
		keys := make([]Value, len(d.pairs))
		for i, p := range d.pairs {
			keys[i] = p.Key
		}
		return keys, nil
	case KindString:
		out := make([]Value, 0, len(v.s))
		for _, r := range v.s {
			out = append(out, String(string(r)))
		}
		return out, nil
	case KindUndefined:
		return nil, nil
	case KindNamespace:
		return nil, unsupportedf("iterating a namespace")
	}
	return nil, errorf("'%s' object is not iterable", v.typeName())
}

func (s *forStmt) exec(st *state) (ctl, error) {
	var seq Value
	var err error
	rev := false // items are visited last first
	if se, ok := s.iter.(*sliceExpr); ok && se.lo == nil && se.hi == nil && se.step != nil && s.filter == nil && !s.memoized(st) {
		// for x in seq[::-1] over a list visits it backwards without copying it
		// reversed: Qwen3's scan for the last query copied a long conversation's
		// messages each render to look at its last few.
		var step Value
		if seq, err = se.obj.eval(st); err == nil {
			step, err = se.step.eval(st)
		}
		if err != nil {
			return ctlNone, err
		}
		if rev = seq.kind == KindList && step.kind == KindInt && step.n == -1; !rev {
			if seq.kind == KindUndefined {
				return ctlNone, undefinedError(seq)
			}
			if seq, err = slice(seq, None(), None(), step); err != nil {
				return ctlNone, err
			}
		}
	} else if seq, err = s.iter.eval(st); err != nil {
		return ctlNone, err
	}
	items, err := iterate(seq)
	if err != nil {
		return ctlNone, err
	}
	saved := s.scope.save(st)
	defer s.scope.restore(st, saved)
	if s.filter != nil {
		var kept []Value
		for _, it := range items {
			s.scope.restore(st, saved)
			if err := s.target.assign(st, it); err != nil {
				return ctlNone, err
			}
			ok, err := s.filter.eval(st)
			if err != nil {
				return ctlNone, err
			}
			if ok.Truth() {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	var loop *loopState
	if s.loopRef != nil {
		loop = &loopState{items: items, rev: rev}
	}
	if s.memoized(st) {
		if err := s.execMemo(st, items, saved, loop); err != nil {
			return ctlNone, err
		}
	} else if err := s.execItems(st, items, rev, saved, loop); err != nil {
		return ctlNone, err
	}
	if len(items) == 0 && s.els != nil {
		s.scope.restore(st, saved)
		if _, err := execBody(st, s.els); err != nil {
			return ctlNone, err
		}
	}
	return ctlNone, nil
}

// enter starts iteration i of the loop over item it: the loop's scope as before the
// loop, the target bound to it, and loop.index0 and the loop variable set.
func (s *forStmt) enter(st *state, saved []Value, loop *loopState, i int, it Value) error {
	s.scope.restore(st, saved)
	if err := s.target.assign(st, it); err != nil {
		return err
	}
	if loop != nil {
		loop.index0 = i
		st.slots(s.loopRef.local)[s.loopRef.slot] = Value{kind: KindLoop, ref: loop}
	}
	return nil
}

// memoized reports whether the loop runs with the render's iteration cache
// (execMemo).
func (s *forStmt) memoized(st *state) bool {
	return s.memo != nil && st.cache != nil && st.rec == nil
}

// execItems runs the loop over items, last first when rev.
func (s *forStmt) execItems(st *state, items []Value, rev bool, saved []Value, loop *loopState) error {
	var probe *settleProbe
	if s.settled && st.settle == nil && st.rec == nil {
		probe = new(settleProbe)
		st.settle = probe
		defer func() { st.settle = nil }()
	}
	for i, it := range items {
		if rev {
			it = items[len(items)-1-i]
		}
		if err := s.enter(st, saved, loop, i, it); err != nil {
			return err
		}
		if probe != nil {
			*probe = settleProbe{}
		}
		c, err := execBody(st, s.body)
		if err != nil {
			return err
		}
		if c == ctlBreak {
			break
		}
		if probe != nil && probe.quiet() {
			st.stats.Settled += len(items) - i - 1
			break // every later iteration would be quiet too
		}
	}
	return nil
}

type loopState struct {
	items  []Value
	rev    bool // the loop visits items last first
	index0 int
}

// item returns the i-th item the loop visits.
func (l *loopState) item(i int) Value {
	if l.rev {
		return l.items[len(l.items)-1-i]
	}
	return l.items[i]
}

func (l *loopState) attr(self Value, name string) (Value, error) {
	n := len(l.items)
	switch name {
	case "index":
		return Int(int64(l.index0 + 1)), nil
	case "index0":
		return Int(int64(l.index0)), nil
	case "revindex":
		return Int(int64(n - l.index0)), nil
	case "revindex0":
		return Int(int64(n - l.index0 - 1)), nil
	case "first":
		return Bool(l.index0 == 0), nil
	case "last":
		return Bool(l.index0 == n-1), nil
	case "length":
		return Int(int64(n)), nil
	case "depth":
		return Int(1), nil
	case "depth0":
		return Int(0), nil
	case "previtem":
		if l.index0 > 0 {
			return l.item(l.index0 - 1), nil
		}
		return Undefined("previtem"), nil
	case "nextitem":
		if l.index0+1 < n {
			return l.item(l.index0 + 1), nil
		}
		return Undefined("nextitem"), nil
	case "cycle":
		return Value{kind: KindMethod, s: "loop.cycle", ref: self}, nil
	case "changed":
		return Value{}, unsupportedf("loop.changed")
	}
	return Undefined(""), nil
}

type breakStmt struct{ c ctl }

func (s *breakStmt) exec(*state) (ctl, error) { return s.c, nil }

type setStmt struct {
	target target
	x      expr
	// indexSet: in a settled loop, x is a sum of loop counters and outer values, whose
	// reads of the iteration's variables leave the iteration quiet (settle.go).
	indexSet bool
}

func (s *setStmt) exec(st *state) (ctl, error) {
	if s.indexSet && st.settle != nil {
		taint := st.settle.taint
		defer func() { st.settle.taint = taint }()
	}
	v, err := s.x.eval(st)
	if err != nil {
		return ctlNone, err
	}
	return ctlNone, s.target.assign(st, v)
}

type nsSetStmt struct {
	ns   *varRef
	attr string
	x    expr
	// outer: in a memoizable loop, a namespace from outside the iteration (the write
	// is recorded).
	outer bool
}

func (s *nsSetStmt) exec(st *state) (ctl, error) {
	if st.settle != nil {
		st.settle.wrote = true
	}
	v, err := s.x.eval(st)
	if err != nil {
		return ctlNone, err
	}
	ns := st.slots(s.ns.local)[s.ns.slot]
	if ns.kind != KindNamespace {
		return ctlNone, errorf("cannot assign attribute on non-namespace object")
	}
	ns.ref.(*Namespace).attrs.Set(s.attr, v)
	if s.outer && st.rec != nil {
		st.rec.note(event{write: s, v: v})
	}
	return ctlNone, nil
}

// capture renders body into a string.
func capture(st *state, body []stmt) (string, error) {
	prev := st.out
	var b output
	st.out = &b
	_, err := execBody(st, body)
	st.out = prev
	return b.text(), err
}

type setBlockStmt struct {
	target  target
	body    []stmt
	filters []*filterExpr
}

func (s *setBlockStmt) exec(st *state) (ctl, error) {
	v, err := captureFiltered(st, s.body, s.filters)
	if err != nil {
		return ctlNone, err
	}
	return ctlNone, s.target.assign(st, v)
}

// captureFiltered renders body to a string and passes it through filters, in order:
// the value of a `{% set x | f %}` block and the output of a `{% filter f %}` block.
func captureFiltered(st *state, body []stmt, filters []*filterExpr) (Value, error) {
	text, err := capture(st, body)
	if err != nil {
		return Value{}, err
	}
	v := String(text)
	for _, f := range filters {
		if v, err = f.apply(st, v); err != nil {
			return Value{}, err
		}
	}
	return v, nil
}

type filterBlockStmt struct {
	body    []stmt
	filters []*filterExpr
}

func (s *filterBlockStmt) exec(st *state) (ctl, error) {
	v, err := captureFiltered(st, s.body, s.filters)
	if err != nil {
		return ctlNone, err
	}
	return ctlNone, st.write(v)
}

// scopeStmt is a body rendered in its own scope ({% generation %}, rendered as
// transformers' call block renders it).
type scopeStmt struct {
	body  []stmt
	scope scope
}

func (s *scopeStmt) exec(st *state) (ctl, error) {
	saved := s.scope.save(st)
	defer s.scope.restore(st, saved)
	_, err := execBody(st, s.body)
	return ctlNone, err
}

type macro struct {
	name     string
	params   []string
	defaults []expr // nil entries: required
	nslots   int
	inherit  []inherited
	body     []stmt
}

// inherited is a macro variable that starts from the template's value.
type inherited struct {
	local int
	outer *varRef
}

type macroStmt struct {
	ref *varRef
	m   *macro
}

func (s *macroStmt) exec(st *state) (ctl, error) {
	st.slots(s.ref.local)[s.ref.slot] = Value{kind: KindMacro, ref: s.m}
	return ctlNone, nil
}

func (st *state) callMacro(m *macro, args []Value, kwargs []KwArg) (Value, error) {
	if st.replaying {
		return Value{}, errorf("macro call while checking a stored iteration")
	}
	if st.rec != nil {
		st.rec.tainted = true // a macro reads its own outer variables
	}
	if st.depth >= maxMacroDepth {
		return Value{}, errorf("macro %s: recursion deeper than %d", m.name, maxMacroDepth)
	}
	if len(args) > len(m.params) {
		return Value{}, errorf("macro '%s' takes not more than %d argument(s)", m.name, len(m.params))
	}
	frame := make([]Value, m.nslots)
	for _, in := range m.inherit {
		frame[in.local] = st.top[in.outer.slot]
	}
	set := make([]bool, len(m.params))
	for i, a := range args {
		frame[i] = a
		set[i] = true
	}
	for _, kw := range kwargs {
		found := false
		for i, p := range m.params {
			if p == kw.Name {
				if set[i] {
					return Value{}, errorf("macro '%s' got multiple values for argument '%s'", m.name, p)
				}
				frame[i], set[i], found = kw.Value, true, true
			}
		}
		if !found {
			return Value{}, errorf("macro '%s' takes no keyword argument '%s'", m.name, kw.Name)
		}
	}
	prevLocal := st.local
	st.local = frame
	st.depth++
	defer func() { st.local = prevLocal; st.depth-- }()
	for i := range m.params {
		if set[i] {
			continue
		}
		if m.defaults[i] == nil {
			frame[i] = Undefined(m.params[i])
			continue
		}
		v, err := m.defaults[i].eval(st)
		if err != nil {
			return Value{}, err
		}
		frame[i] = v
	}
	text, err := capture(st, m.body)
	if err != nil {
		return Value{}, err
	}
	return String(text), nil
}
