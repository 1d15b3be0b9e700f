package jinja

// Settled loops. A loop whose body writes no output still costs a pass over its items
// every render: Qwen3's template scans messages[::-1] for the last user query, and once
// it is found (ns.multi_step_tool false) every later iteration evaluates its condition,
// finds it false and does nothing, hundreds of times in a long conversation.
//
// An iteration is quiet when it wrote no namespace and every read of the iteration's
// own variables (its item, loop, its sets) it made went into a set whose expression is
// a sum of loop counters and values from outside the iteration (an index set, such as
// `set index = (messages|length - 1) - loop.index0`). After a quiet iteration the outer
// state is what it was when the iteration started; every condition it evaluated was
// decided by outer state alone (short-circuiting included: only the operands evaluated
// are read); its other expressions read outer state alone, and its index sets, + and -
// of numbers that succeeded once, succeed for any other counter values. The next
// iteration starts from the same outer state and the same scope (restored before every
// iteration), so it evaluates the same conditions to the same values, takes the same
// path, writes nothing and is quiet too, and so on to the end: the loop stops after
// its first quiet iteration. Its variables go out of scope with the loop, so what the
// skipped iterations would have assigned was never visible.
//
// A loop qualifies when its body is made of sets of one name, namespace sets and ifs
// only (no output, loop, break, macro, block) and its expressions call no macro or
// global (a method of a string, list or dict is pure): expressions then have no effect
// but their value or an error.

// settleProbe observes one iteration of a settled loop.
type settleProbe struct {
	taint int  // reads of the iteration's own variables, outside index sets
	wrote bool // a namespace set ran
}

// localExpr is a read of a variable a settled loop's iteration assigns.
type localExpr struct{ x *nameExpr }

func (e *localExpr) eval(st *state) (Value, error) {
	if st.settle != nil {
		st.settle.taint++
	}
	return e.x.eval(st)
}

// markSettled marks loop s as settled when its body qualifies, wrapping its reads of
// the iteration's variables and marking its index sets.
func markSettled(s *forStmt) {
	if writes(s.body) {
		return
	}
	local := map[string]bool{"loop": s.loopRef != nil}
	for _, r := range s.scope.refs {
		if r.local {
			return // inside a macro
		}
		local[r.name] = true
	}
	if !settleable(s.body, local, false) {
		return
	}
	settleable(s.body, local, true)
	s.settled = true
}

// settleable reports whether body qualifies; with wrap, it wraps the local reads and
// marks the index sets.
func settleable(body []stmt, local map[string]bool, wrap bool) bool {
	for _, s := range body {
		switch s := s.(type) {
		case *setStmt:
			if s.target.tuple || !pureExpr(&s.x, local, wrap) {
				return false
			}
			if wrap {
				s.indexSet = indexExpr(s.x)
			}
		case *nsSetStmt:
			if s.ns.local || !pureExpr(&s.x, local, wrap) {
				return false
			}
		case *ifStmt:
			for i := range s.conds {
				if !pureExpr(&s.conds[i], local, wrap) || !settleable(s.bodies[i], local, wrap) {
					return false
				}
			}
			if !settleable(s.els, local, wrap) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// pureExpr reports whether *p calls no macro or global; with wrap, it wraps its reads
// of local names in localExprs.
func pureExpr(p *expr, local map[string]bool, wrap bool) bool {
	switch e := (*p).(type) {
	case *nameExpr:
		if e.ref.local {
			return false
		}
		if wrap && local[e.ref.name] {
			*p = &localExpr{x: e}
		}
		return true
	case *localExpr:
		return true // wrapped already
	case *callExpr:
		if _, ok := e.fn.(*attrExpr); !ok {
			return false // a macro, a global, loop(...)
		}
	}
	kids, ok := children(*p)
	if !ok {
		return false
	}
	for _, k := range kids {
		if !pureExpr(k, local, wrap) {
			return false
		}
	}
	return true
}

// indexExpr reports whether x (wrapped) is an index set's expression: constants, loop
// counters (index, index0, revindex, revindex0, length, first, last), expressions
// reading no variable of the iteration, and + and - of those. A number plus or minus
// a number cannot fail, whatever the numbers; any other operand fails whatever the
// counters, so success once means success at every index.
func indexExpr(x expr) bool {
	switch e := x.(type) {
	case *attrExpr:
		if l, ok := e.obj.(*localExpr); ok && l.x.ref.name == "loop" {
			switch e.name {
			case "index", "index0", "revindex", "revindex0", "length", "first", "last":
				return true
			}
			return false
		}
	case *binExpr:
		return (e.op == "+" || e.op == "-") && indexExpr(e.l) && indexExpr(e.r)
	case *unaryExpr:
		return indexExpr(e.x)
	}
	return !readsLocal(x)
}

// readsLocal reports whether x (wrapped) reads a variable of the iteration.
func readsLocal(x expr) bool {
	if _, ok := x.(*localExpr); ok {
		return true
	}
	kids, _ := children(x)
	for _, k := range kids {
		if readsLocal(*k) {
			return true
		}
	}
	return false
}

// quiet reports whether the probed iteration was quiet.
func (p *settleProbe) quiet() bool { return p.taint == 0 && !p.wrote }
