package jinja

import (
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Kind is the Python type a Value stands for.
type Kind uint8

// The kinds of values a template sees.
const (
	KindUndefined Kind = iota // Jinja2's default Undefined
	KindNone                  // Python None
	KindBool
	KindInt // fits in int64
	KindBigInt
	KindFloat
	KindString
	KindList // list or tuple (List.Tuple)
	KindDict // insertion-ordered dict
	KindNamespace
	KindLoop
	KindMacro
	KindFunc   // a global callable (raise_exception, range, ...)
	KindMethod // a bound method read without calling it
)

// Value is one template value. The zero Value is Undefined. Values are immutable
// except namespaces (which templates assign to with set ns.attr).
type Value struct {
	kind Kind
	n    int64  // int, bool (0/1), float bits
	s    string // string; name of an undefined value; method name
	ref  any    // *List, *Dict, *big.Int, *Namespace, *loopState, *macro, Func, receiver of a method
}

// Func is a global function callable from templates.
type Func func(args []Value, kwargs []KwArg) (Value, error)

// KwArg is one keyword argument of a call.
type KwArg struct {
	Name  string
	Value Value
}

// List is a Python list or tuple. Items must not be changed once the list is
// visible to a template.
type List struct {
	Items []Value
	Tuple bool
	view  string // dict_items, dict_keys, dict_values: repr as Python's views
}

// Dict is an insertion-ordered dict. Keys are usually strings; Set keeps the
// first position of a repeated key and takes the last value, as a Python dict does.
type Dict struct {
	pairs []Pair
	index map[string]int // string keys, built once the dict is large
}

// Pair is one dict entry.
type Pair struct {
	Key, Value Value
}

// Namespace is the mutable object namespace() returns.
type Namespace struct {
	attrs *Dict
}

const dictIndexAt = 24

// NewDict returns an empty dict with room for n pairs.
func NewDict(n int) *Dict { return &Dict{pairs: make([]Pair, 0, n)} }

// Len is the number of pairs.
func (d *Dict) Len() int { return len(d.pairs) }

// Pairs returns the pairs in insertion order; callers must not change them.
func (d *Dict) Pairs() []Pair { return d.pairs }

// Get returns the value stored under a string key.
func (d *Dict) Get(key string) (Value, bool) {
	if d.index != nil {
		if i, ok := d.index[key]; ok {
			return d.pairs[i].Value, true
		}
		return Value{}, false
	}
	for i := range d.pairs {
		if p := &d.pairs[i]; p.Key.kind == KindString && p.Key.s == key {
			return p.Value, true
		}
	}
	return Value{}, false
}

// getValue looks a key of any kind up with Python's equality.
func (d *Dict) getValue(k Value) (Value, bool) {
	if k.kind == KindString {
		return d.Get(k.s)
	}
	for _, p := range d.pairs {
		if equal(p.Key, k) {
			return p.Value, true
		}
	}
	return Value{}, false
}

// Set stores v under a string key, keeping the first position of a repeated key.
func (d *Dict) Set(key string, v Value) { d.SetValue(String(key), v) }

// SetValue stores v under a key of any hashable kind.
func (d *Dict) SetValue(k, v Value) {
	if k.kind == KindString && d.index != nil {
		if i, ok := d.index[k.s]; ok {
			d.pairs[i].Value = v
			return
		}
	} else {
		for i := range d.pairs {
			if equal(d.pairs[i].Key, k) {
				d.pairs[i].Value = v
				return
			}
		}
	}
	d.pairs = append(d.pairs, Pair{k, v})
	if d.index != nil && k.kind == KindString {
		d.index[k.s] = len(d.pairs) - 1
	} else if d.index == nil && len(d.pairs) >= dictIndexAt {
		d.buildIndex()
	}
}

func (d *Dict) buildIndex() {
	for _, p := range d.pairs {
		if p.Key.kind != KindString {
			return // mixed keys: stay linear
		}
	}
	d.index = make(map[string]int, len(d.pairs)*2)
	for i, p := range d.pairs {
		d.index[p.Key.s] = i
	}
}

// Delete removes a string key if present.
func (d *Dict) Delete(key string) {
	for i, p := range d.pairs {
		if p.Key.kind == KindString && p.Key.s == key {
			d.pairs = append(d.pairs[:i:i], d.pairs[i+1:]...)
			if d.index != nil {
				d.index = nil
				d.buildIndex()
			}
			return
		}
	}
}

// Clone returns a shallow copy.
func (d *Dict) Clone() *Dict {
	c := &Dict{pairs: append(make([]Pair, 0, len(d.pairs)+2), d.pairs...)}
	if d.index != nil {
		c.buildIndex()
	}
	return c
}

// Constructors.

// Undefined returns an undefined value named name (for error messages).
func Undefined(name string) Value { return Value{kind: KindUndefined, s: name} }

// None returns Python's None.
func None() Value { return Value{kind: KindNone} }

// Bool returns a bool.
func Bool(b bool) Value {
	if b {
		return Value{kind: KindBool, n: 1}
	}
	return Value{kind: KindBool}
}

// Int returns an int.
func Int(i int64) Value { return Value{kind: KindInt, n: i} }

// BigInt returns an int too large for int64 (smaller ones become Int).
func BigInt(b *big.Int) Value {
	if b.IsInt64() {
		return Int(b.Int64())
	}
	return Value{kind: KindBigInt, ref: b}
}

// Float returns a float.
func Float(f float64) Value { return Value{kind: KindFloat, n: int64(math.Float64bits(f))} }

// String returns a str.
func String(s string) Value { return Value{kind: KindString, s: s} }

// ListOf returns a list holding items (not copied).
func ListOf(items []Value) Value { return Value{kind: KindList, ref: &List{Items: items}} }

// TupleOf returns a tuple holding items (not copied).
func TupleOf(items ...Value) Value {
	return Value{kind: KindList, ref: &List{Items: items, Tuple: true}}
}

// DictValue wraps a dict.
func DictValue(d *Dict) Value { return Value{kind: KindDict, ref: d} }

// FuncValue wraps a global function.
func FuncValue(f Func) Value { return Value{kind: KindFunc, ref: f} }

// pureFunc marks (in Value.n) a builtin global whose result depends only on its
// arguments, which a memoized loop iteration may call (memo.go).
const pureFunc = 1

func pureFuncValue(f Func) Value { return Value{kind: KindFunc, ref: f, n: pureFunc} }

// Accessors.

// Kind returns the value's kind.
func (v Value) Kind() Kind { return v.kind }

// IsUndefined reports whether v is undefined.
func (v Value) IsUndefined() bool { return v.kind == KindUndefined }

// IsNone reports whether v is None.
func (v Value) IsNone() bool { return v.kind == KindNone }

// Str returns a string value's text ("" for other kinds).
func (v Value) Str() string {
	if v.kind == KindString {
		return v.s
	}
	return ""
}

// IntValue returns an int or bool value as int64.
func (v Value) IntValue() int64 { return v.n }

// FloatValue returns a float value.
func (v Value) FloatValue() float64 { return math.Float64frombits(uint64(v.n)) }

// BoolValue returns a bool value.
func (v Value) BoolValue() bool { return v.n != 0 }

// Big returns a big int value (nil for other kinds).
func (v Value) Big() *big.Int {
	b, _ := v.ref.(*big.Int)
	return b
}

// List returns a list value's list (nil for other kinds).
func (v Value) List() *List {
	if v.kind == KindList {
		return v.ref.(*List)
	}
	return nil
}

// Dict returns a dict value's dict (nil for other kinds).
func (v Value) Dict() *Dict {
	if v.kind == KindDict {
		return v.ref.(*Dict)
	}
	return nil
}

func (v Value) float() float64 { return math.Float64frombits(uint64(v.n)) }

func (v Value) items() []Value { return v.ref.(*List).Items }

func (v Value) dict() *Dict { return v.ref.(*Dict) }

func (v Value) isNumber() bool {
	return v.kind == KindInt || v.kind == KindFloat || v.kind == KindBigInt || v.kind == KindBool
}

func (v Value) isIntegral() bool {
	return v.kind == KindInt || v.kind == KindBigInt || v.kind == KindBool
}

// Truth is Python's bool(v).
func (v Value) Truth() bool {
	switch v.kind {
	case KindUndefined, KindNone:
		return false
	case KindBool, KindInt:
		return v.n != 0
	case KindFloat:
		return v.float() != 0
	case KindBigInt:
		return true // never zero: zero is an Int
	case KindString:
		return v.s != ""
	case KindList:
		return len(v.items()) > 0
	case KindDict:
		return v.dict().Len() > 0
	}
	return true
}

// typeName is Python's type name, for error messages.
func (v Value) typeName() string {
	switch v.kind {
	case KindUndefined:
		return "Undefined"
	case KindNone:
		return "NoneType"
	case KindBool:
		return "bool"
	case KindInt, KindBigInt:
		return "int"
	case KindFloat:
		return "float"
	case KindString:
		return "str"
	case KindList:
		if v.ref.(*List).Tuple {
			return "tuple"
		}
		return "list"
	case KindDict:
		return "dict"
	case KindNamespace:
		return "Namespace"
	case KindLoop:
		return "LoopContext"
	case KindMacro:
		return "Macro"
	}
	return "function"
}

// toStr is Python's str(v) as Jinja2 prints it (undefined prints "").
func toStr(v Value) (string, error) {
	switch v.kind {
	case KindString:
		return v.s, nil
	case KindUndefined:
		return "", nil
	case KindInt:
		return strconv.FormatInt(v.n, 10), nil
	}
	var b strings.Builder
	if err := writeStr(&b, v); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeStr(b *strings.Builder, v Value) error {
	switch v.kind {
	case KindString:
		b.WriteString(v.s)
	case KindUndefined:
	case KindNone:
		b.WriteString("None")
	case KindBool:
		if v.n != 0 {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case KindInt:
		b.WriteString(strconv.FormatInt(v.n, 10))
	case KindBigInt:
		b.WriteString(v.Big().String())
	case KindFloat:
		b.WriteString(pyFloatRepr(v.float()))
	default:
		return writeRepr(b, v, 0)
	}
	return nil
}

// writeRepr is Python's repr(v).
func writeRepr(b *strings.Builder, v Value, depth int) error {
	if depth > maxDepth {
		return errorf("value nested deeper than %d", maxDepth)
	}
	switch v.kind {
	case KindString:
		writePyRepr(b, v.s)
	case KindUndefined:
		b.WriteString("Undefined")
	case KindList:
		l := v.ref.(*List)
		if l.view != "" {
			b.WriteString(l.view)
			b.WriteByte('(')
			defer b.WriteByte(')')
		}
		open, closeCh := byte('['), byte(']')
		if l.Tuple {
			open, closeCh = '(', ')'
		}
		b.WriteByte(open)
		for i, it := range l.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := writeRepr(b, it, depth+1); err != nil {
				return err
			}
		}
		if l.Tuple && len(l.Items) == 1 {
			b.WriteByte(',')
		}
		b.WriteByte(closeCh)
	case KindDict:
		b.WriteByte('{')
		for i, p := range v.dict().pairs {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := writeRepr(b, p.Key, depth+1); err != nil {
				return err
			}
			b.WriteString(": ")
			if err := writeRepr(b, p.Value, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case KindNamespace:
		b.WriteString("<Namespace ")
		if err := writeRepr(b, DictValue(v.ref.(*Namespace).attrs), depth+1); err != nil {
			return err
		}
		b.WriteByte('>')
	case KindNone, KindBool, KindInt, KindBigInt, KindFloat:
		return writeStr(b, v)
	default:
		return unsupportedf("printing a %s", v.typeName())
	}
	return nil
}

// equal is Python's ==.
func equal(a, b Value) bool {
	if a.kind == KindString && b.kind == KindString {
		return a.s == b.s
	}
	if a.isNumber() && b.isNumber() {
		return numCompare(a, b) == 0
	}
	if a.kind != b.kind {
		return false
	}
	switch a.kind {
	case KindUndefined, KindNone:
		return true
	case KindList:
		la, lb := a.ref.(*List), b.ref.(*List)
		if la.Tuple != lb.Tuple || len(la.Items) != len(lb.Items) {
			return false
		}
		for i := range la.Items {
			if !equal(la.Items[i], lb.Items[i]) {
				return false
			}
		}
		return true
	case KindDict:
		da, db := a.dict(), b.dict()
		if da.Len() != db.Len() {
			return false
		}
		for _, p := range da.pairs {
			w, ok := db.getValue(p.Key)
			if !ok || !equal(p.Value, w) {
				return false
			}
		}
		return true
	case KindNamespace, KindLoop, KindMacro:
		return a.ref == b.ref
	}
	return false
}

// numCompare compares two numbers (bool, int, big int, float) as Python does.
func numCompare(a, b Value) int {
	if a.kind != KindFloat && a.kind != KindBigInt && b.kind != KindFloat && b.kind != KindBigInt {
		switch {
		case a.n < b.n:
			return -1
		case a.n > b.n:
			return 1
		}
		return 0
	}
	if a.kind == KindFloat || b.kind == KindFloat {
		fa, fb := toFloat(a), toFloat(b)
		switch {
		case fa < fb:
			return -1
		case fa > fb:
			return 1
		case fa == fb:
			return 0
		}
		return 2 // NaN: unordered
	}
	return toBig(a).Cmp(toBig(b))
}

func toFloat(v Value) float64 {
	switch v.kind {
	case KindFloat:
		return v.float()
	case KindBigInt:
		f, _ := new(big.Float).SetInt(v.Big()).Float64()
		return f
	}
	return float64(v.n)
}

func toBig(v Value) *big.Int {
	if v.kind == KindBigInt {
		return v.Big()
	}
	return big.NewInt(v.n)
}

// compare is Python's ordering for <, <=, >, >=: numbers, strings, and lists or tuples
// of the same type element-wise. ok is false when Python raises TypeError.
func compare(a, b Value) (int, bool) {
	switch {
	case a.isNumber() && b.isNumber():
		c := numCompare(a, b)
		return c, true
	case a.kind == KindString && b.kind == KindString:
		return strings.Compare(a.s, b.s), true // UTF-8 byte order is code point order
	case a.kind == KindList && b.kind == KindList && a.ref.(*List).Tuple == b.ref.(*List).Tuple:
		la, lb := a.items(), b.items()
		for i := 0; i < len(la) && i < len(lb); i++ {
			if equal(la[i], lb[i]) {
				continue
			}
			return compare(la[i], lb[i])
		}
		switch {
		case len(la) < len(lb):
			return -1, true
		case len(la) > len(lb):
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// ToStr is Python's str(v) as Jinja2 prints it ("" for undefined).
func ToStr(v Value) (string, error) { return toStr(v) }
