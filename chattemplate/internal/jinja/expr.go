package jinja

import (
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// expr is a compiled expression.
type expr interface {
	eval(st *state) (Value, error)
}

// varRef is a variable reference resolved to a frame slot once its scope is parsed.
type varRef struct {
	name  string
	local bool // the macro frame, not the template's
	slot  int
}

func (st *state) slots(local bool) []Value {
	if local {
		return st.local
	}
	return st.top
}

type constExpr struct{ v Value }

func (e *constExpr) eval(*state) (Value, error) { return e.v, nil }

type nameExpr struct{ ref *varRef }

func (e *nameExpr) eval(st *state) (Value, error) { return st.slots(e.ref.local)[e.ref.slot], nil }

type attrExpr struct {
	obj  expr
	name string
	// method: name is a method of dicts, strings or lists, decided once at parse time
	// (a chat template reads message.role and message.content per message).
	method attrMethods
	// loopInt: name is an int attribute of a loop (index, index0, revindex,
	// revindex0, length), decided once at parse time, for intOperand.
	loopInt loopIntAttr
}

// loopIntAttr names the int attributes of a loop; loopNotInt is any other name.
type loopIntAttr uint8

const (
	loopNotInt loopIntAttr = iota
	loopIndex
	loopIndex0
	loopRevindex
	loopRevindex0
	loopLength
)

func loopIntAttrOf(name string) loopIntAttr {
	switch name {
	case "index":
		return loopIndex
	case "index0":
		return loopIndex0
	case "revindex":
		return loopRevindex
	case "revindex0":
		return loopRevindex0
	case "length":
		return loopLength
	}
	return loopNotInt
}

// intAttr is the loop's attribute a as loopState.attr gives it, when a is an int one.
func (l *loopState) intAttr(a loopIntAttr) (int64, bool) {
	n := len(l.items)
	switch a {
	case loopIndex:
		return int64(l.index0 + 1), true
	case loopIndex0:
		return int64(l.index0), true
	case loopRevindex:
		return int64(n - l.index0), true
	case loopRevindex0:
		return int64(n - l.index0 - 1), true
	case loopLength:
		return int64(n), true
	}
	return 0, false
}

// intOperand is x's value when x is an int constant, or an int attribute of a loop
// or of a namespace that a plain name holds (loop.index0, ns.last_query_index), read
// without building Values: a chat template compares such operands once per message
// (Qwen3's `loop.index0 > ns.last_query_index`), and incremental rendering re-checks
// each of those comparisons on every turn of a conversation (memo.go), so a long
// conversation's turn spends most of its replay in them. ok is false for any other
// expression or value, which the caller then evaluates as usual: reading these has no
// effect, so reading one twice costs only the time.
func intOperand(st *state, x expr) (int64, bool) {
	switch x := x.(type) {
	case *constExpr:
		return x.v.n, x.v.kind == KindInt
	case *attrExpr:
		name, ok := x.obj.(*nameExpr)
		if !ok {
			return 0, false
		}
		switch obj := st.slots(name.ref.local)[name.ref.slot]; obj.kind {
		case KindLoop:
			return obj.ref.(*loopState).intAttr(x.loopInt)
		case KindNamespace:
			v, ok := obj.ref.(*Namespace).attrs.Get(x.name)
			return v.n, ok && v.kind == KindInt
		}
	}
	return 0, false
}

// attrMethods says of which kinds an attribute name is a method.
type attrMethods struct{ dict, str, list bool }

func methodsOf(name string) attrMethods {
	return attrMethods{dict: dictMethods[name], str: strMethods[name], list: listMethods[name]}
}

func (e *attrExpr) eval(st *state) (Value, error) {
	obj, err := e.obj.eval(st)
	if err != nil {
		return Value{}, err
	}
	return getAttrOf(obj, e.name, e.method)
}

type itemExpr struct {
	obj, key expr
}

func (e *itemExpr) eval(st *state) (Value, error) {
	obj, err := e.obj.eval(st)
	if err != nil {
		return Value{}, err
	}
	key, err := e.key.eval(st)
	if err != nil {
		return Value{}, err
	}
	return getItem(obj, key)
}

type sliceExpr struct {
	obj, lo, hi, step expr // nil when absent
}

func (e *sliceExpr) eval(st *state) (Value, error) {
	obj, err := e.obj.eval(st)
	if err != nil {
		return Value{}, err
	}
	var bounds [3]Value
	for i, x := range []expr{e.lo, e.hi, e.step} {
		bounds[i] = None()
		if x != nil {
			if bounds[i], err = x.eval(st); err != nil {
				return Value{}, err
			}
		}
	}
	if obj.kind == KindUndefined {
		return Value{}, undefinedError(obj)
	}
	return slice(obj, bounds[0], bounds[1], bounds[2])
}

type kwExpr struct {
	name string
	x    expr
}

func evalArgs(st *state, args []expr, kwargs []kwExpr) ([]Value, []KwArg, error) {
	var av []Value
	if len(args) > 0 {
		av = make([]Value, len(args))
		for i, a := range args {
			v, err := a.eval(st)
			if err != nil {
				return nil, nil, err
			}
			av[i] = v
		}
	}
	var kv []KwArg
	if len(kwargs) > 0 {
		kv = make([]KwArg, len(kwargs))
		for i, k := range kwargs {
			v, err := k.x.eval(st)
			if err != nil {
				return nil, nil, err
			}
			kv[i] = KwArg{k.name, v}
		}
	}
	return av, kv, nil
}

type callExpr struct {
	fn     expr
	args   []expr
	kwargs []kwExpr
}

func (e *callExpr) eval(st *state) (Value, error) {
	fn, err := e.fn.eval(st)
	if err != nil {
		return Value{}, err
	}
	args, kwargs, err := evalArgs(st, e.args, e.kwargs)
	if err != nil {
		return Value{}, err
	}
	return st.call(fn, args, kwargs)
}

func (st *state) call(fn Value, args []Value, kwargs []KwArg) (Value, error) {
	switch fn.kind {
	case KindFunc:
		if st.rec != nil && fn.n != pureFunc {
			st.rec.tainted = true // strftime_now reads the clock
		}
		return fn.ref.(Func)(args, kwargs)
	case KindMacro:
		return st.callMacro(fn.ref.(*macro), args, kwargs)
	case KindMethod:
		return callMethod(st, fn.ref.(Value), fn.s, args, kwargs)
	case KindUndefined:
		return Value{}, undefinedError(fn)
	}
	return Value{}, errorf("'%s' object is not callable", fn.typeName())
}

type filterExpr struct {
	arg    expr // nil in a filter block: the body
	name   string
	fn     filterFunc
	args   []expr
	kwargs []kwExpr
}

func (e *filterExpr) eval(st *state) (Value, error) {
	in, err := e.arg.eval(st)
	if err != nil {
		return Value{}, err
	}
	return e.apply(st, in)
}

func (e *filterExpr) apply(st *state, in Value) (Value, error) {
	args, kwargs, err := evalArgs(st, e.args, e.kwargs)
	if err != nil {
		return Value{}, err
	}
	return e.fn(st, in, args, kwargs)
}

type testExpr struct {
	arg    expr
	name   string
	fn     testFunc
	args   []expr
	kwargs []kwExpr
}

func (e *testExpr) eval(st *state) (Value, error) {
	in, err := e.arg.eval(st)
	if err != nil {
		return Value{}, err
	}
	args, kwargs, err := evalArgs(st, e.args, e.kwargs)
	if err != nil {
		return Value{}, err
	}
	if len(kwargs) > 0 {
		return Value{}, unsupportedf("keyword arguments to test %s", e.name)
	}
	ok, err := e.fn(st, in, args)
	return Bool(ok), err
}

type notExpr struct{ x expr }

func (e *notExpr) eval(st *state) (Value, error) {
	v, err := e.x.eval(st)
	return Bool(!v.Truth()), err
}

type andExpr struct{ l, r expr }

func (e *andExpr) eval(st *state) (Value, error) {
	v, err := e.l.eval(st)
	if err != nil || !v.Truth() {
		return v, err
	}
	return e.r.eval(st)
}

type orExpr struct{ l, r expr }

func (e *orExpr) eval(st *state) (Value, error) {
	v, err := e.l.eval(st)
	if err != nil || v.Truth() {
		return v, err
	}
	return e.r.eval(st)
}

type condExpr struct {
	cond, then, els expr // els nil: undefined
}

func (e *condExpr) eval(st *state) (Value, error) {
	c, err := e.cond.eval(st)
	if err != nil {
		return Value{}, err
	}
	if c.Truth() {
		return e.then.eval(st)
	}
	if e.els == nil {
		return Undefined(""), nil
	}
	return e.els.eval(st)
}

type unaryExpr struct {
	neg bool
	x   expr
}

func (e *unaryExpr) eval(st *state) (Value, error) {
	v, err := e.x.eval(st)
	if err != nil {
		return Value{}, err
	}
	switch v.kind {
	case KindInt, KindBool:
		if !e.neg {
			return Int(v.n), nil
		}
		if v.n == math.MinInt64 {
			return BigInt(new(big.Int).Neg(big.NewInt(v.n))), nil
		}
		return Int(-v.n), nil
	case KindBigInt:
		if !e.neg {
			return v, nil
		}
		return BigInt(new(big.Int).Neg(v.Big())), nil
	case KindFloat:
		if !e.neg {
			return v, nil
		}
		return Float(-v.float()), nil
	case KindUndefined:
		return Value{}, undefinedError(v)
	}
	return Value{}, errorf("bad operand type for unary %s: '%s'", map[bool]string{true: "-", false: "+"}[e.neg], v.typeName())
}

type binExpr struct {
	op   string
	l, r expr
}

func (e *binExpr) eval(st *state) (Value, error) {
	l, err := e.l.eval(st)
	if err != nil {
		return Value{}, err
	}
	r, err := e.r.eval(st)
	if err != nil {
		return Value{}, err
	}
	return binop(e.op, l, r)
}

// addExpr is a chain a + b + c ...; strings are joined with one allocation.
type addExpr struct{ xs []expr }

func (e *addExpr) eval(st *state) (Value, error) {
	var buf [8]Value
	vals := buf[:0]
	allStr := true
	n := 0
	for _, x := range e.xs {
		v, err := x.eval(st)
		if err != nil {
			return Value{}, err
		}
		if v.kind != KindString {
			allStr = false
		}
		n += len(v.s)
		vals = append(vals, v)
	}
	if allStr {
		var b strings.Builder
		b.Grow(n)
		for _, v := range vals {
			b.WriteString(v.s)
		}
		return String(b.String()), nil
	}
	acc := vals[0]
	for _, v := range vals[1:] {
		var err error
		if acc, err = binop("+", acc, v); err != nil {
			return Value{}, err
		}
	}
	return acc, nil
}

// write evaluates the chain straight into the output when it is all strings.
func (e *addExpr) write(st *state) error {
	first, err := e.xs[0].eval(st)
	if err != nil {
		return err
	}
	if first.kind != KindString {
		v, err := e.evalFrom(st, first)
		if err != nil {
			return err
		}
		return st.write(v)
	}
	st.out.WriteString(first.s)
	for _, x := range e.xs[1:] {
		v, err := x.eval(st)
		if err != nil {
			return err
		}
		if v.kind != KindString {
			_, err := binop("+", String(""), v) // the error Python raises
			if err == nil {
				err = errorf("unsupported operand for +")
			}
			return err
		}
		st.out.WriteString(v.s)
	}
	return nil
}

func (e *addExpr) evalFrom(st *state, acc Value) (Value, error) {
	for _, x := range e.xs[1:] {
		v, err := x.eval(st)
		if err != nil {
			return Value{}, err
		}
		if acc, err = binop("+", acc, v); err != nil {
			return Value{}, err
		}
	}
	return acc, nil
}

type concatExpr struct{ xs []expr }

func (e *concatExpr) eval(st *state) (Value, error) {
	var b strings.Builder
	for _, x := range e.xs {
		v, err := x.eval(st)
		if err != nil {
			return Value{}, err
		}
		if err := writeStr(&b, v); err != nil {
			return Value{}, err
		}
	}
	return String(b.String()), nil
}

type cmpOp struct {
	op   string // == != < <= > >= in notin
	x    expr
	ints intCmp // op on two ints, for intOperand's fast path; intCmpNone for in, notin
}

// intCmp is a comparison operator applied to two int64s.
type intCmp uint8

const (
	intCmpNone intCmp = iota
	intCmpEq
	intCmpNe
	intCmpLt
	intCmpLe
	intCmpGt
	intCmpGe
)

func intCmpOf(op string) intCmp {
	switch op {
	case "==":
		return intCmpEq
	case "!=":
		return intCmpNe
	case "<":
		return intCmpLt
	case "<=":
		return intCmpLe
	case ">":
		return intCmpGt
	case ">=":
		return intCmpGe
	}
	return intCmpNone
}

// apply is compareOp's result for two ints (numCompare's for KindInt operands).
func (c intCmp) apply(a, b int64) bool {
	switch c {
	case intCmpEq:
		return a == b
	case intCmpNe:
		return a != b
	case intCmpLt:
		return a < b
	case intCmpLe:
		return a <= b
	case intCmpGt:
		return a > b
	}
	return a >= b
}

type compareExpr struct {
	first expr
	ops   []cmpOp
}

func (e *compareExpr) eval(st *state) (Value, error) {
	if len(e.ops) == 1 && e.ops[0].ints != intCmpNone {
		if a, ok := intOperand(st, e.first); ok {
			if b, ok := intOperand(st, e.ops[0].x); ok {
				return Bool(e.ops[0].ints.apply(a, b)), nil
			}
		}
	}
	l, err := e.first.eval(st)
	if err != nil {
		return Value{}, err
	}
	for _, o := range e.ops {
		r, err := o.x.eval(st)
		if err != nil {
			return Value{}, err
		}
		ok, err := compareOp(o.op, l, r)
		if err != nil || !ok {
			return Bool(false), err
		}
		l = r
	}
	return Bool(true), nil
}

func compareOp(op string, l, r Value) (bool, error) {
	switch op {
	case "==":
		return equal(l, r), nil
	case "!=":
		return !equal(l, r), nil
	case "in":
		return contains(r, l)
	case "notin":
		ok, err := contains(r, l)
		return !ok, err
	}
	if l.kind == KindUndefined {
		return false, undefinedError(l)
	}
	if r.kind == KindUndefined {
		return false, undefinedError(r)
	}
	c, ok := compare(l, r)
	if !ok {
		return false, errorf("'%s' not supported between instances of '%s' and '%s'", op, l.typeName(), r.typeName())
	}
	if c == 2 { // NaN
		return false, nil
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	}
	return c >= 0, nil
}

// contains is Python's `needle in container`.
func contains(container, needle Value) (bool, error) {
	switch container.kind {
	case KindString:
		if needle.kind != KindString {
			if needle.kind == KindUndefined {
				return false, undefinedError(needle)
			}
			return false, errorf("'in <string>' requires string as left operand, not %s", needle.typeName())
		}
		return strings.Contains(container.s, needle.s), nil
	case KindList:
		for _, it := range container.items() {
			if equal(it, needle) {
				return true, nil
			}
		}
		return false, nil
	case KindDict:
		if !hashable(needle) {
			return false, errorf("unhashable type: '%s'", needle.typeName())
		}
		_, ok := container.dict().getValue(needle)
		return ok, nil
	case KindUndefined:
		return false, nil
	}
	return false, errorf("argument of type '%s' is not iterable", container.typeName())
}

func hashable(v Value) bool {
	switch v.kind {
	case KindList:
		if !v.ref.(*List).Tuple {
			return false
		}
		for _, it := range v.items() {
			if !hashable(it) {
				return false
			}
		}
		return true
	case KindDict:
		return false
	}
	return true
}

type listExpr struct {
	xs    []expr
	tuple bool
}

func (e *listExpr) eval(st *state) (Value, error) {
	items := make([]Value, len(e.xs))
	for i, x := range e.xs {
		v, err := x.eval(st)
		if err != nil {
			return Value{}, err
		}
		items[i] = v
	}
	return Value{kind: KindList, ref: &List{Items: items, Tuple: e.tuple}}, nil
}

type dictExpr struct{ keys, values []expr }

func (e *dictExpr) eval(st *state) (Value, error) {
	d := NewDict(len(e.keys))
	for i := range e.keys {
		k, err := e.keys[i].eval(st)
		if err != nil {
			return Value{}, err
		}
		v, err := e.values[i].eval(st)
		if err != nil {
			return Value{}, err
		}
		if !hashable(k) {
			return Value{}, errorf("unhashable type: '%s'", k.typeName())
		}
		d.SetValue(k, v)
	}
	return DictValue(d), nil
}

// binop is a Python binary operator on two values.
func binop(op string, l, r Value) (Value, error) {
	if l.kind == KindUndefined {
		return Value{}, undefinedError(l)
	}
	if r.kind == KindUndefined {
		return Value{}, undefinedError(r)
	}
	switch op {
	case "+":
		switch {
		case l.kind == KindString && r.kind == KindString:
			return String(l.s + r.s), nil
		case l.kind == KindList && r.kind == KindList && l.ref.(*List).Tuple == r.ref.(*List).Tuple:
			la, lb := l.items(), r.items()
			items := make([]Value, 0, len(la)+len(lb))
			items = append(append(items, la...), lb...)
			return Value{kind: KindList, ref: &List{Items: items, Tuple: l.ref.(*List).Tuple}}, nil
		}
	case "*":
		if l.kind == KindString && r.isIntegral() || l.isIntegral() && r.kind == KindString ||
			l.kind == KindList && r.isIntegral() || l.isIntegral() && r.kind == KindList {
			return repeat(l, r)
		}
	case "%":
		if l.kind == KindString {
			return percentFormat(l.s, r)
		}
	}
	if !l.isNumber() || !r.isNumber() {
		return Value{}, errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, l.typeName(), r.typeName())
	}
	if l.kind == KindBigInt || r.kind == KindBigInt {
		if l.kind != KindFloat && r.kind != KindFloat {
			return bigArith(op, toBig(l), toBig(r))
		}
	}
	if l.kind == KindFloat || r.kind == KindFloat || op == "/" {
		return floatArith(op, toFloat(l), toFloat(r))
	}
	return intArith(op, l.n, r.n)
}

func repeat(l, r Value) (Value, error) {
	seq, n := l, r
	if l.isIntegral() {
		seq, n = r, l
	}
	if n.kind == KindBigInt {
		return Value{}, unsupportedf("repetition by a huge int")
	}
	count := int(max(n.n, 0))
	if seq.kind == KindString {
		if count > 0 && len(seq.s)*count/count != len(seq.s) || len(seq.s)*count > 1<<26 {
			return Value{}, errorf("repeated string too large")
		}
		return String(strings.Repeat(seq.s, count)), nil
	}
	items := seq.items()
	if len(items)*count > 1<<22 {
		return Value{}, errorf("repeated list too large")
	}
	out := make([]Value, 0, len(items)*count)
	for range count {
		out = append(out, items...)
	}
	return Value{kind: KindList, ref: &List{Items: out, Tuple: seq.ref.(*List).Tuple}}, nil
}

func intArith(op string, a, b int64) (Value, error) {
	switch op {
	case "+":
		if s := a + b; (s > a) == (b > 0) {
			return Int(s), nil
		}
	case "-":
		if s := a - b; (s < a) == (b > 0) {
			return Int(s), nil
		}
	case "*":
		if a == 0 || b == 0 {
			return Int(0), nil
		}
		if p := a * b; p/b == a && !(a == -1 && b == math.MinInt64) && !(b == -1 && a == math.MinInt64) {
			return Int(p), nil
		}
	case "//", "%":
		if b == 0 {
			return Value{}, errorf("integer division or modulo by zero")
		}
		if a == math.MinInt64 && b == -1 {
			break
		}
		q, m := a/b, a%b
		if m != 0 && (m < 0) != (b < 0) {
			q--
			m += b
		}
		if op == "//" {
			return Int(q), nil
		}
		return Int(m), nil
	case "**":
		if b < 0 {
			return floatArith(op, float64(a), float64(b))
		}
		return bigArith(op, big.NewInt(a), big.NewInt(b))
	}
	return bigArith(op, big.NewInt(a), big.NewInt(b))
}

func bigArith(op string, a, b *big.Int) (Value, error) {
	z := new(big.Int)
	switch op {
	case "+":
		z.Add(a, b)
	case "-":
		z.Sub(a, b)
	case "*":
		if a.BitLen()+b.BitLen() > 1<<16 {
			return Value{}, unsupportedf("huge integer arithmetic")
		}
		z.Mul(a, b)
	case "//", "%":
		if b.Sign() == 0 {
			return Value{}, errorf("integer division or modulo by zero")
		}
		q, m := new(big.Int), new(big.Int)
		q.DivMod(a, b, m) // Euclidean: m >= 0
		if m.Sign() != 0 && b.Sign() < 0 {
			q.Add(q, big.NewInt(1))
			m.Add(m, b)
		}
		if op == "//" {
			return BigInt(q), nil
		}
		return BigInt(m), nil
	case "**":
		if b.Sign() < 0 {
			fa, _ := new(big.Float).SetInt(a).Float64()
			fb, _ := new(big.Float).SetInt(b).Float64()
			return floatArith(op, fa, fb)
		}
		if !b.IsInt64() || int64(a.BitLen())*b.Int64() > 1<<16 {
			return Value{}, unsupportedf("huge integer power")
		}
		z.Exp(a, b, nil)
	default:
		return floatArith(op, toFloat(BigInt(a)), toFloat(BigInt(b)))
	}
	return BigInt(z), nil
}

func floatArith(op string, a, b float64) (Value, error) {
	switch op {
	case "+":
		return Float(a + b), nil
	case "-":
		return Float(a - b), nil
	case "*":
		return Float(a * b), nil
	case "/":
		if b == 0 {
			return Value{}, errorf("division by zero")
		}
		return Float(a / b), nil
	case "//", "%":
		if b == 0 {
			return Value{}, errorf("float division by zero")
		}
		m := math.Mod(a, b)
		if m != 0 && (m < 0) != (b < 0) {
			m += b
		}
		if op == "%" {
			if m == 0 {
				m = math.Copysign(0, b)
			}
			return Float(m), nil
		}
		return Float(math.Floor((a - m) / b)), nil
	case "**":
		if a == 0 && b < 0 {
			return Value{}, errorf("0.0 cannot be raised to a negative power")
		}
		if a < 0 && b != math.Trunc(b) {
			return Value{}, unsupportedf("complex power")
		}
		return Float(math.Pow(a, b)), nil
	}
	return Value{}, errorf("unknown operator %s", op)
}

// getAttr is Jinja2's sandboxed getattr (obj.name): the attribute, else the item,
// else undefined.
func getAttr(obj Value, name string) (Value, error) {
	return getAttrOf(obj, name, methodsOf(name))
}

// getAttrOf is getAttr with the name's method kinds already looked up.
func getAttrOf(obj Value, name string, m attrMethods) (Value, error) {
	switch obj.kind {
	case KindUndefined:
		return Value{}, undefinedError(obj)
	case KindDict:
		if m.dict {
			return Value{kind: KindMethod, s: name, ref: obj}, nil
		}
		if v, ok := obj.dict().Get(name); ok {
			return v, nil
		}
	case KindString:
		if m.str {
			return Value{kind: KindMethod, s: name, ref: obj}, nil
		}
	case KindList:
		if m.list {
			return Value{kind: KindMethod, s: name, ref: obj}, nil
		}
	case KindNamespace:
		if v, ok := obj.ref.(*Namespace).attrs.Get(name); ok {
			return v, nil
		}
	case KindLoop:
		return obj.ref.(*loopState).attr(obj, name)
	case KindInt, KindFloat, KindBool, KindBigInt:
		switch name {
		case "real", "imag", "numerator", "denominator", "conjugate", "bit_length", "is_integer", "hex":
			return Value{}, unsupportedf("number attribute %s", name)
		}
	case KindMacro, KindFunc, KindMethod:
		return Value{}, unsupportedf("attributes of a %s", obj.typeName())
	}
	return Undefined(""), nil
}

// getItem is Jinja2's sandboxed getitem (obj[key]): the item, else for a string key
// the attribute, else undefined.
func getItem(obj, key Value) (Value, error) {
	switch obj.kind {
	case KindUndefined:
		return Value{}, undefinedError(obj)
	case KindDict:
		if hashable(key) {
			if v, ok := obj.dict().getValue(key); ok {
				return v, nil
			}
		}
	case KindList:
		if key.kind == KindInt || key.kind == KindBool {
			items := obj.items()
			i := key.n
			if i < 0 {
				i += int64(len(items))
			}
			if i >= 0 && i < int64(len(items)) {
				return items[i], nil
			}
			return Undefined(""), nil
		}
	case KindString:
		if key.kind == KindInt || key.kind == KindBool {
			return charAt(obj.s, key.n), nil
		}
	}
	if key.kind == KindString {
		return getAttr(obj, key.s)
	}
	return Undefined(""), nil
}

// charAt is s[i] by code point.
func charAt(s string, i int64) Value {
	if isASCII(s) {
		if i < 0 {
			i += int64(len(s))
		}
		if i >= 0 && i < int64(len(s)) {
			return String(s[i : i+1])
		}
		return Undefined("")
	}
	rs := []rune(s)
	if i < 0 {
		i += int64(len(rs))
	}
	if i >= 0 && i < int64(len(rs)) {
		return String(string(rs[i]))
	}
	return Undefined("")
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// sliceIndices is Python's slice.indices(length).
func sliceIndices(lo, hi, step Value, length int) (start, stop, stp int, err error) {
	stp = 1
	if !step.IsNone() {
		if step.kind != KindInt && step.kind != KindBool {
			return 0, 0, 0, errorf("slice indices must be integers or None")
		}
		if step.n == 0 {
			return 0, 0, 0, errorf("slice step cannot be zero")
		}
		stp = int(max(min(step.n, 1<<40), -(1 << 40)))
	}
	get := func(v Value, dflt int) (int, error) {
		if v.IsNone() {
			return dflt, nil
		}
		if v.kind != KindInt && v.kind != KindBool {
			return 0, errorf("slice indices must be integers or None")
		}
		i := int(max(min(v.n, 1<<40), -(1 << 40)))
		if i < 0 {
			i += length
			if i < 0 {
				if stp < 0 {
					i = -1
				} else {
					i = 0
				}
			}
		} else if i >= length {
			if stp < 0 {
				i = length - 1
			} else {
				i = length
			}
		}
		return i, nil
	}
	if stp > 0 {
		if start, err = get(lo, 0); err == nil {
			stop, err = get(hi, length)
		}
	} else {
		if start, err = get(lo, length-1); err == nil {
			stop, err = get(hi, -1)
		}
	}
	return start, stop, stp, err
}

func sign(n int) int {
	if n < 0 {
		return -1
	}
	return 1
}

func slice(obj, lo, hi, step Value) (Value, error) {
	switch obj.kind {
	case KindList:
		items := obj.items()
		start, stop, stp, err := sliceIndices(lo, hi, step, len(items))
		if err != nil {
			return Value{}, err
		}
		var out []Value
		if stp == 1 {
			if stop > start {
				out = items[start:stop:stop]
			}
		} else {
			// Sized once: messages[::-1] over a long conversation would grow it ~10 times.
			if n := (stop - start + stp - sign(stp)) / stp; n > 0 {
				out = make([]Value, 0, n)
			}
			for i := start; (stp > 0 && i < stop) || (stp < 0 && i > stop); i += stp {
				out = append(out, items[i])
			}
		}
		if out == nil {
			out = []Value{}
		}
		return Value{kind: KindList, ref: &List{Items: out, Tuple: obj.ref.(*List).Tuple}}, nil
	case KindString:
		s := obj.s
		if isASCII(s) {
			start, stop, stp, err := sliceIndices(lo, hi, step, len(s))
			if err != nil {
				return Value{}, err
			}
			if stp == 1 {
				if stop > start {
					return String(s[start:stop]), nil
				}
				return String(""), nil
			}
			var b strings.Builder
			for i := start; (stp > 0 && i < stop) || (stp < 0 && i > stop); i += stp {
				b.WriteByte(s[i])
			}
			return String(b.String()), nil
		}
		rs := []rune(s)
		start, stop, stp, err := sliceIndices(lo, hi, step, len(rs))
		if err != nil {
			return Value{}, err
		}
		var b strings.Builder
		for i := start; (stp > 0 && i < stop) || (stp < 0 && i > stop); i += stp {
			b.WriteRune(rs[i])
		}
		return String(b.String()), nil
	case KindDict:
		// Jinja2 compiles a slice to Python's obj[slice], not its forgiving getitem.
		return Value{}, errorf("unhashable type: 'slice'")
	}
	return Value{}, errorf("'%s' object is not subscriptable", obj.typeName())
}

func parseIntLiteral(s string) Value {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return Int(i)
	}
	b, _ := new(big.Int).SetString(s, 10)
	return BigInt(b)
}
