package jinja

import (
	"strconv"
)

// fnScope is the template or one macro: the variables it reads and assigns.
type fnScope struct {
	macro    bool
	refs     []*varRef
	assigned map[string]bool
	params   []string
}

type parser struct {
	items []item
	ii    int
	toks  []token
	ti    int
	line  int

	fn        *fnScope
	top       *fnScope
	assigns   [][]string // names assigned per open loop/call scope
	loopDepth int
	exprDepth int
}

// maxExprDepth bounds expression nesting so that a hostile template cannot exhaust
// the stack.
const maxExprDepth = 200

func (p *parser) errorf(format string, args ...any) error {
	return &SyntaxError{Line: p.line, Msg: sprintf(format, args...)}
}

// Token helpers within the current tag.

func (p *parser) peek() token {
	if p.ti < len(p.toks) {
		return p.toks[p.ti]
	}
	return token{}
}

func (p *parser) peekAt(n int) token {
	if p.ti+n < len(p.toks) {
		return p.toks[p.ti+n]
	}
	return token{}
}

func (p *parser) atEnd() bool { return p.ti >= len(p.toks) }

func (p *parser) advance() token {
	t := p.peek()
	if p.ti < len(p.toks) {
		p.line = t.line
		p.ti++
	}
	return t
}

func (p *parser) isOp(s string) bool {
	t := p.peek()
	return t.kind == tokOp && t.s == s
}

func (p *parser) isName(s string) bool {
	t := p.peek()
	return t.kind == tokName && t.s == s
}

func (p *parser) skipOp(s string) bool {
	if p.isOp(s) {
		p.advance()
		return true
	}
	return false
}

func (p *parser) skipName(s string) bool {
	if p.isName(s) {
		p.advance()
		return true
	}
	return false
}

func (p *parser) expectOp(s string) error {
	if !p.skipOp(s) {
		return p.errorf("expected '%s', got %s", s, p.describe())
	}
	return nil
}

func (p *parser) expectName() (string, error) {
	t := p.peek()
	if t.kind != tokName {
		return "", p.errorf("expected a name, got %s", p.describe())
	}
	p.advance()
	return t.s, nil
}

func (p *parser) expectEnd() error {
	if !p.atEnd() {
		return p.errorf("expected end of statement, got %s", p.describe())
	}
	return nil
}

func (p *parser) describe() string {
	if p.atEnd() {
		return "end of tag"
	}
	return strconv.Quote(p.peek().s)
}

// Variables.

func (p *parser) ref(name string) *varRef {
	r := &varRef{name: name}
	p.fn.refs = append(p.fn.refs, r)
	return r
}

// assign records an assignment to name in the current function and open scopes.
func (p *parser) assign(name string) *varRef {
	p.fn.assigned[name] = true
	if n := len(p.assigns); n > 0 {
		p.assigns[n-1] = append(p.assigns[n-1], name)
	}
	return p.ref(name)
}

func (p *parser) openScope() { p.assigns = append(p.assigns, nil) }

// closeScope ends a loop or call scope and returns the refs its body assigns.
func (p *parser) closeScope() scope {
	names := p.assigns[len(p.assigns)-1]
	p.assigns = p.assigns[:len(p.assigns)-1]
	if n := len(p.assigns); n > 0 {
		p.assigns[n-1] = append(p.assigns[n-1], names...)
	}
	seen := map[string]bool{}
	sc := scope{local: p.fn.macro}
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			sc.refs = append(sc.refs, p.ref(n))
		}
	}
	return sc
}

// Statements.

// body parses statements until a block tag whose name is in ends; it returns the
// statements and that name, with the tag's remaining tokens current.
func (p *parser) body(ends ...string) ([]stmt, string, error) {
	var out []stmt
	for p.ii < len(p.items) {
		it := p.items[p.ii]
		p.ii++
		p.line = it.line
		switch it.kind {
		case itemText:
			out = append(out, &textStmt{s: it.text})
		case itemVar:
			p.toks, p.ti = it.tokens, 0
			x, err := p.tuple(true, false, nil)
			if err != nil {
				return nil, "", err
			}
			if err := p.expectEnd(); err != nil {
				return nil, "", err
			}
			out = append(out, &outputStmt{x: x})
		case itemBlock:
			p.toks, p.ti = it.tokens, 0
			name, err := p.expectName()
			if err != nil {
				return nil, "", err
			}
			for _, e := range ends {
				if name == e {
					return out, name, nil
				}
			}
			s, err := p.statement(name)
			if err != nil {
				return nil, "", err
			}
			if s != nil {
				out = append(out, s)
			}
		}
	}
	if len(ends) > 0 {
		return nil, "", p.errorf("unexpected end of template, expected '%s'", ends[0])
	}
	return out, "", nil
}

func (p *parser) statement(name string) (stmt, error) {
	switch name {
	case "if":
		return p.ifStmt()
	case "for":
		return p.forStmt()
	case "set":
		return p.setStmt()
	case "macro":
		return p.macroStmt()
	case "filter":
		return p.filterBlock()
	case "generation":
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		p.openScope()
		body, _, err := p.body("endgeneration")
		if err != nil {
			return nil, err
		}
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		return &scopeStmt{body: body, scope: p.closeScope()}, nil
	case "break", "continue":
		if p.loopDepth == 0 {
			return nil, p.errorf("'%s' outside of a loop", name)
		}
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		if name == "break" {
			return &breakStmt{c: ctlBreak}, nil
		}
		return &breakStmt{c: ctlContinue}, nil
	case "elif", "else", "endif", "endfor", "endset", "endmacro", "endfilter", "endgeneration":
		return nil, p.errorf("unexpected '%s'", name)
	}
	return nil, unsupportedf("tag '%s'", name)
}

func (p *parser) ifStmt() (stmt, error) {
	s := &ifStmt{}
	for {
		cond, err := p.tuple(false, false, nil)
		if err != nil {
			return nil, err
		}
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.body("elif", "else", "endif")
		if err != nil {
			return nil, err
		}
		s.conds = append(s.conds, cond)
		s.bodies = append(s.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.expectEnd(); err != nil {
				return nil, err
			}
			els, _, err := p.body("endif")
			if err != nil {
				return nil, err
			}
			s.els = els
		}
		return s, p.expectEnd()
	}
}

// assignTarget parses a name or a tuple of names to assign to.
func (p *parser) assignTarget(stop string) (target, error) {
	paren := p.skipOp("(")
	var t target
	for {
		name, err := p.expectName()
		if err != nil {
			return t, err
		}
		t.names = append(t.names, p.assign(name))
		if !p.skipOp(",") {
			break
		}
		t.tuple = true
		if (paren && p.isOp(")")) || (!paren && (p.isName(stop) || p.isOp(stop))) {
			break
		}
	}
	if paren {
		if err := p.expectOp(")"); err != nil {
			return t, err
		}
		if len(t.names) > 1 {
			t.tuple = true
		}
	}
	return t, nil
}

func (p *parser) forStmt() (stmt, error) {
	s := &forStmt{}
	p.openScope()
	tgt, err := p.assignTarget("in")
	if err != nil {
		return nil, err
	}
	s.target = tgt
	if !p.skipName("in") {
		return nil, p.errorf("expected 'in', got %s", p.describe())
	}
	iter, err := p.tuple(false, false, []string{"recursive"})
	if err != nil {
		return nil, err
	}
	s.iter = iter
	if p.skipName("if") {
		if s.filter, err = p.expression(true); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, unsupportedf("recursive loops")
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	refsBefore := len(p.fn.refs)
	p.loopDepth++
	body, end, err := p.body("endfor", "else")
	p.loopDepth--
	if err != nil {
		return nil, err
	}
	s.body = body
	for _, r := range p.fn.refs[refsBefore:] {
		if r.name == "loop" {
			s.loopRef = p.assign("loop")
			break
		}
	}
	if end == "else" {
		if err := p.expectEnd(); err != nil {
			return nil, err
		}
		if s.els, _, err = p.body("endfor"); err != nil {
			return nil, err
		}
	}
	s.scope = p.closeScope()
	return s, p.expectEnd()
}

func (p *parser) setStmt() (stmt, error) {
	if p.peek().kind == tokName && p.peekAt(1).kind == tokOp && p.peekAt(1).s == "." {
		ns := p.advance().s
		p.advance()
		attr, err := p.expectName()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		x, err := p.tuple(true, false, nil)
		if err != nil {
			return nil, err
		}
		return &nsSetStmt{ns: p.ref(ns), attr: attr, x: x}, p.expectEnd()
	}
	tgt, err := p.assignTarget("=")
	if err != nil {
		return nil, err
	}
	if p.skipOp("=") {
		x, err := p.tuple(true, false, nil)
		if err != nil {
			return nil, err
		}
		return &setStmt{target: tgt, x: x}, p.expectEnd()
	}
	var filters []*filterExpr
	for p.skipOp("|") {
		f, err := p.filter(nil)
		if err != nil {
			return nil, err
		}
		filters = append(filters, f)
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.body("endset")
	if err != nil {
		return nil, err
	}
	return &setBlockStmt{target: tgt, body: body, filters: filters}, p.expectEnd()
}

func (p *parser) filterBlock() (stmt, error) {
	var filters []*filterExpr
	for {
		f, err := p.filter(nil)
		if err != nil {
			return nil, err
		}
		filters = append(filters, f)
		if !p.skipOp("|") {
			break
		}
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.body("endfilter")
	if err != nil {
		return nil, err
	}
	return &filterBlockStmt{body: body, filters: filters}, p.expectEnd()
}

func (p *parser) macroStmt() (stmt, error) {
	if p.fn.macro {
		return nil, unsupportedf("macros defined inside macros")
	}
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	ref := p.assign(name)
	m := &macro{name: name}
	outer, outerAssigns, outerLoops := p.fn, p.assigns, p.loopDepth
	fn := &fnScope{macro: true, assigned: map[string]bool{}}
	p.fn, p.assigns, p.loopDepth = fn, nil, 0
	defer func() { p.fn, p.assigns, p.loopDepth = outer, outerAssigns, outerLoops }()
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.isOp(")") {
		if len(m.params) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
			if p.isOp(")") {
				break
			}
		}
		param, err := p.expectName()
		if err != nil {
			return nil, err
		}
		for _, prev := range m.params {
			if prev == param {
				return nil, p.errorf("duplicate argument '%s' in macro %s", param, name)
			}
		}
		var dflt expr
		if p.skipOp("=") {
			if dflt, err = p.expression(true); err != nil {
				return nil, err
			}
		}
		m.params = append(m.params, param)
		m.defaults = append(m.defaults, dflt)
	}
	p.advance()
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	fn.params = m.params
	body, _, err := p.body("endmacro")
	if err != nil {
		return nil, err
	}
	if err := p.expectEnd(); err != nil {
		return nil, err
	}
	m.body = body
	// Resolve: parameters and names the macro assigns live in its frame; other names
	// are read from the template's at call time.
	slots := map[string]int{}
	for i, name := range m.params {
		slots[name] = i
	}
	for _, r := range fn.refs {
		switch r.name {
		case "caller", "varargs", "kwargs":
			if _, isParam := slots[r.name]; !isParam {
				return nil, unsupportedf("macro %s uses %s", name, r.name)
			}
		case "loop":
			if !fn.assigned["loop"] {
				return nil, unsupportedf("macro %s reads loop outside its own loops", name)
			}
		}
		if i, ok := slots[r.name]; ok {
			r.local, r.slot = true, i
			continue
		}
		if fn.assigned[r.name] {
			if _, ok := slots[r.name]; !ok {
				slots[r.name] = len(slots)
				// Jinja2 starts a macro's own variables from the enclosing value.
				outerRef := &varRef{name: r.name}
				outer.refs = append(outer.refs, outerRef)
				m.inherit = append(m.inherit, inherited{local: slots[r.name], outer: outerRef})
			}
			r.local, r.slot = true, slots[r.name]
			continue
		}
		outer.refs = append(outer.refs, r)
	}
	m.nslots = len(slots)
	return &macroStmt{ref: ref, m: m}, nil
}

// Expressions, following Jinja2's parser.py.

// tuple parses a bare tuple or a single expression.
func (p *parser) tuple(condexpr, explicitParens bool, extraEnd []string) (expr, error) {
	var args []expr
	isTuple := false
	for {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.tupleEnd(extraEnd) {
			break
		}
		x, err := p.expression(condexpr)
		if err != nil {
			return nil, err
		}
		args = append(args, x)
		if p.isOp(",") {
			isTuple = true
		} else {
			break
		}
	}
	if !isTuple {
		if len(args) > 0 {
			return args[0], nil
		}
		if !explicitParens {
			return nil, p.errorf("expected an expression, got %s", p.describe())
		}
	}
	return &listExpr{xs: args, tuple: true}, nil
}

func (p *parser) tupleEnd(extraEnd []string) bool {
	if p.atEnd() || p.isOp(")") {
		return true
	}
	for _, e := range extraEnd {
		if p.isName(e) {
			return true
		}
	}
	return false
}

func (p *parser) expression(condexpr bool) (expr, error) {
	if condexpr {
		return p.condexpr()
	}
	return p.or()
}

func (p *parser) condexpr() (expr, error) {
	x, err := p.or()
	if err != nil {
		return nil, err
	}
	for p.skipName("if") {
		cond, err := p.or()
		if err != nil {
			return nil, err
		}
		c := &condExpr{cond: cond, then: x}
		if p.skipName("else") {
			if c.els, err = p.condexpr(); err != nil {
				return nil, err
			}
		}
		x = c
	}
	return x, nil
}

func (p *parser) or() (expr, error) {
	l, err := p.and()
	for err == nil && p.skipName("or") {
		var r expr
		if r, err = p.and(); err == nil {
			l = &orExpr{l: l, r: r}
		}
	}
	return l, err
}

func (p *parser) and() (expr, error) {
	l, err := p.not()
	for err == nil && p.skipName("and") {
		var r expr
		if r, err = p.not(); err == nil {
			l = &andExpr{l: l, r: r}
		}
	}
	return l, err
}

func (p *parser) not() (expr, error) {
	if p.skipName("not") {
		x, err := p.not()
		return &notExpr{x: x}, err
	}
	return p.compare()
}

func (p *parser) compare() (expr, error) {
	first, err := p.math1()
	if err != nil {
		return nil, err
	}
	var ops []cmpOp
	for {
		t := p.peek()
		op := ""
		switch {
		case t.kind == tokOp && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == "<=" || t.s == ">" || t.s == ">="):
			op = t.s
			p.advance()
		case t.kind == tokName && t.s == "in":
			op = "in"
			p.advance()
		case t.kind == tokName && t.s == "not" && p.peekAt(1).kind == tokName && p.peekAt(1).s == "in":
			op = "notin"
			p.advance()
			p.advance()
		}
		if op == "" {
			break
		}
		x, err := p.math1()
		if err != nil {
			return nil, err
		}
		ops = append(ops, cmpOp{op: op, x: x, ints: intCmpOf(op)})
	}
	if len(ops) == 0 {
		return first, nil
	}
	return &compareExpr{first: first, ops: ops}, nil
}

func (p *parser) math1() (expr, error) {
	l, err := p.concat()
	if err != nil {
		return nil, err
	}
	var chain *addExpr
	for p.isOp("+") || p.isOp("-") {
		op := p.advance().s
		r, err := p.concat()
		if err != nil {
			return nil, err
		}
		if op == "+" {
			if chain == nil {
				chain = &addExpr{xs: []expr{l}}
				l = chain
			}
			chain.xs = append(chain.xs, r)
			continue
		}
		l = &binExpr{op: op, l: l, r: r}
		chain = nil
	}
	return l, nil
}

func (p *parser) concat() (expr, error) {
	x, err := p.math2()
	if err != nil || !p.isOp("~") {
		return x, err
	}
	c := &concatExpr{xs: []expr{x}}
	for p.skipOp("~") {
		y, err := p.math2()
		if err != nil {
			return nil, err
		}
		c.xs = append(c.xs, y)
	}
	return c, nil
}

func (p *parser) math2() (expr, error) {
	l, err := p.pow()
	for err == nil && (p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%")) {
		op := p.advance().s
		var r expr
		if r, err = p.pow(); err == nil {
			l = &binExpr{op: op, l: l, r: r}
		}
	}
	return l, err
}

func (p *parser) pow() (expr, error) {
	l, err := p.unary(true)
	for err == nil && p.skipOp("**") {
		var r expr
		if r, err = p.unary(true); err == nil {
			l = &binExpr{op: "**", l: l, r: r}
		}
	}
	return l, err
}

func (p *parser) unary(withFilter bool) (expr, error) {
	p.exprDepth++
	defer func() { p.exprDepth-- }()
	if p.exprDepth > maxExprDepth {
		return nil, p.errorf("expression nested deeper than %d", maxExprDepth)
	}
	var x expr
	var err error
	switch {
	case p.isOp("-") || p.isOp("+"):
		neg := p.advance().s == "-"
		var inner expr
		if inner, err = p.unary(false); err != nil {
			return nil, err
		}
		x = &unaryExpr{neg: neg, x: inner}
	default:
		if x, err = p.primary(); err != nil {
			return nil, err
		}
	}
	if x, err = p.postfix(x); err != nil {
		return nil, err
	}
	if withFilter {
		return p.filterExpr(x)
	}
	return x, nil
}

func (p *parser) primary() (expr, error) {
	t := p.peek()
	switch t.kind {
	case tokName:
		p.advance()
		switch t.s {
		case "true", "True":
			return &constExpr{Bool(true)}, nil
		case "false", "False":
			return &constExpr{Bool(false)}, nil
		case "none", "None":
			return &constExpr{None()}, nil
		}
		return &nameExpr{ref: p.ref(t.s)}, nil
	case tokString:
		s := p.advance().s
		for p.peek().kind == tokString {
			s += p.advance().s
		}
		return &constExpr{String(s)}, nil
	case tokInt:
		p.advance()
		return &constExpr{parseIntLiteral(t.s)}, nil
	case tokFloat:
		p.advance()
		f, err := strconv.ParseFloat(t.s, 64)
		if err != nil && f == 0 {
			return nil, p.errorf("invalid float %s", t.s)
		}
		return &constExpr{Float(f)}, nil
	case tokOp:
		switch t.s {
		case "(":
			p.advance()
			x, err := p.tuple(true, true, nil)
			if err != nil {
				return nil, err
			}
			return x, p.expectOp(")")
		case "[":
			p.advance()
			l := &listExpr{}
			for !p.isOp("]") {
				if len(l.xs) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("]") {
						break
					}
				}
				x, err := p.expression(true)
				if err != nil {
					return nil, err
				}
				l.xs = append(l.xs, x)
			}
			p.advance()
			return l, nil
		case "{":
			p.advance()
			d := &dictExpr{}
			for !p.isOp("}") {
				if len(d.keys) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.isOp("}") {
						break
					}
				}
				k, err := p.expression(true)
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.expression(true)
				if err != nil {
					return nil, err
				}
				d.keys = append(d.keys, k)
				d.values = append(d.values, v)
			}
			p.advance()
			return d, nil
		}
	}
	return nil, p.errorf("unexpected %s", p.describe())
}

func (p *parser) postfix(x expr) (expr, error) {
	for {
		var err error
		switch {
		case p.isOp(".") || p.isOp("["):
			x, err = p.subscript(x)
		case p.isOp("("):
			x, err = p.call(x)
		default:
			return x, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *parser) filterExpr(x expr) (expr, error) {
	for {
		var err error
		switch {
		case p.skipOp("|"):
			x, err = p.filter(x)
		case p.isName("is"):
			x, err = p.test(x)
		case p.isOp("("):
			x, err = p.call(x)
		default:
			return x, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *parser) subscript(x expr) (expr, error) {
	if p.skipOp(".") {
		t := p.advance()
		switch t.kind {
		case tokName:
			return &attrExpr{obj: x, name: t.s, method: methodsOf(t.s), loopInt: loopIntAttrOf(t.s)}, nil
		case tokInt:
			return &itemExpr{obj: x, key: &constExpr{parseIntLiteral(t.s)}}, nil
		}
		return nil, p.errorf("expected name or number after '.'")
	}
	p.advance() // [
	var args []expr
	for !p.isOp("]") {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		a, err := p.subscribed(x)
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	p.advance()
	switch len(args) {
	case 0:
		return nil, p.errorf("expected subscript expression")
	case 1:
		if s, ok := args[0].(*sliceExpr); ok {
			return s, nil
		}
		return &itemExpr{obj: x, key: args[0]}, nil
	}
	for _, a := range args {
		if _, ok := a.(*sliceExpr); ok {
			return nil, unsupportedf("multi-dimensional slices")
		}
	}
	return &itemExpr{obj: x, key: &listExpr{xs: args, tuple: true}}, nil
}

// subscribed parses one subscript: an expression or a slice of obj.
func (p *parser) subscribed(obj expr) (expr, error) {
	var parts [3]expr
	if p.isOp(":") {
		p.advance()
	} else {
		x, err := p.expression(true)
		if err != nil {
			return nil, err
		}
		if !p.isOp(":") {
			return x, nil
		}
		p.advance()
		parts[0] = x
	}
	var err error
	if !p.isOp(":") && !p.isOp("]") && !p.isOp(",") {
		if parts[1], err = p.expression(true); err != nil {
			return nil, err
		}
	}
	if p.skipOp(":") && !p.isOp("]") && !p.isOp(",") {
		if parts[2], err = p.expression(true); err != nil {
			return nil, err
		}
	}
	return &sliceExpr{obj: obj, lo: parts[0], hi: parts[1], step: parts[2]}, nil
}

func (p *parser) callArgs() ([]expr, []kwExpr, error) {
	if err := p.expectOp("("); err != nil {
		return nil, nil, err
	}
	var args []expr
	var kwargs []kwExpr
	for !p.isOp(")") {
		if len(args)+len(kwargs) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, nil, err
			}
			if p.isOp(")") {
				break
			}
		}
		if p.isOp("*") || p.isOp("**") {
			return nil, nil, unsupportedf("*args and **kwargs in calls")
		}
		if p.peek().kind == tokName && p.peekAt(1).kind == tokOp && p.peekAt(1).s == "=" {
			name := p.advance().s
			p.advance()
			x, err := p.expression(true)
			if err != nil {
				return nil, nil, err
			}
			kwargs = append(kwargs, kwExpr{name: name, x: x})
			continue
		}
		if len(kwargs) > 0 {
			return nil, nil, p.errorf("positional argument after keyword argument")
		}
		x, err := p.expression(true)
		if err != nil {
			return nil, nil, err
		}
		args = append(args, x)
	}
	p.advance()
	return args, kwargs, nil
}

func (p *parser) call(fn expr) (expr, error) {
	args, kwargs, err := p.callArgs()
	if err != nil {
		return nil, err
	}
	return &callExpr{fn: fn, args: args, kwargs: kwargs}, nil
}

// filter parses a filter after '|' (arg nil: a filter block's or set block's).
func (p *parser) filter(arg expr) (*filterExpr, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.isOp(".") {
		return nil, unsupportedf("dotted filter names")
	}
	fn, ok := filters[name]
	if !ok {
		return nil, unsupportedf("filter '%s'", name)
	}
	f := &filterExpr{arg: arg, name: name, fn: fn}
	if p.isOp("(") {
		if f.args, f.kwargs, err = p.callArgs(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) test(arg expr) (expr, error) {
	p.advance() // is
	negated := p.skipName("not")
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	if p.isOp(".") {
		return nil, unsupportedf("dotted test names")
	}
	fn, ok := tests[name]
	if !ok {
		return nil, unsupportedf("test '%s'", name)
	}
	t := &testExpr{arg: arg, name: name, fn: fn}
	tk := p.peek()
	switch {
	case p.isOp("("):
		if t.args, t.kwargs, err = p.callArgs(); err != nil {
			return nil, err
		}
	case (tk.kind == tokName || tk.kind == tokString || tk.kind == tokInt || tk.kind == tokFloat ||
		tk.kind == tokOp && (tk.s == "[" || tk.s == "{")) &&
		!(tk.kind == tokName && (tk.s == "else" || tk.s == "or" || tk.s == "and")):
		if tk.kind == tokName && tk.s == "is" {
			return nil, p.errorf("you cannot chain multiple tests with is")
		}
		a, err := p.primary()
		if err != nil {
			return nil, err
		}
		if a, err = p.postfix(a); err != nil {
			return nil, err
		}
		t.args = []expr{a}
	}
	if negated {
		return &notExpr{x: t}, nil
	}
	return t, nil
}
