package jinja

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

type filterFunc func(st *state, in Value, args []Value, kwargs []KwArg) (Value, error)

type testFunc func(st *state, in Value, args []Value) (bool, error)

// bind matches call arguments to named parameters with defaults (nil default:
// required), as Python binds them.
func bind(fn string, args []Value, kwargs []KwArg, params []string, defaults []Value) ([]Value, error) {
	if len(args) > len(params) {
		return nil, errorf("%s() takes at most %d arguments (%d given)", fn, len(params), len(args))
	}
	out := make([]Value, len(params))
	set := make([]bool, len(params))
	for i, a := range args {
		out[i], set[i] = a, true
	}
	for _, kw := range kwargs {
		i := -1
		for j, p := range params {
			if p == kw.Name {
				i = j
			}
		}
		if i < 0 {
			return nil, errorf("%s() got an unexpected keyword argument '%s'", fn, kw.Name)
		}
		if set[i] {
			return nil, errorf("%s() got multiple values for argument '%s'", fn, kw.Name)
		}
		out[i], set[i] = kw.Value, true
	}
	for i := range params {
		if !set[i] {
			if i >= len(defaults) || defaults[i].kind == kindRequired {
				return nil, errorf("%s() missing required argument '%s'", fn, params[i])
			}
			out[i] = defaults[i]
		}
	}
	return out, nil
}

// kindRequired marks a required parameter in bind's defaults.
const kindRequired Kind = 255

var required = Value{kind: kindRequired}

func noArgs(fn string, args []Value, kwargs []KwArg) error {
	if len(args)+len(kwargs) > 0 {
		return errorf("%s() takes no arguments", fn)
	}
	return nil
}

// length is Python's len().
func length(v Value) (int, error) {
	switch v.kind {
	case KindString:
		return utf8.RuneCountInString(v.s), nil
	case KindList:
		return len(v.items()), nil
	case KindDict:
		return v.dict().Len(), nil
	case KindUndefined:
		return 0, nil
	case KindNamespace:
		return 0, unsupportedf("len of a namespace")
	}
	return 0, errorf("object of type '%s' has no len()", v.typeName())
}

func softStr(v Value) (string, error) { return toStr(v) }

func strFilter(fn func(string) (string, error)) filterFunc {
	return func(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
		if err := noArgs("filter", args, kwargs); err != nil {
			return Value{}, err
		}
		s, err := softStr(in)
		if err != nil {
			return Value{}, err
		}
		out, err := fn(s)
		return String(out), err
	}
}

var filters map[string]filterFunc

func init() {
	filters = map[string]filterFunc{
		"length":     filterLength,
		"count":      filterLength,
		"tojson":     filterToJSON,
		"trim":       filterTrim,
		"upper":      strFilter(pyUpper),
		"lower":      strFilter(pyLower),
		"capitalize": strFilter(pyCapitalizeJinja),
		"title":      strFilter(jinjaTitle),
		"default":    filterDefault,
		"d":          filterDefault,
		"first":      filterFirst,
		"last":       filterLast,
		"join":       filterJoin,
		"items":      filterItems,
		"dictsort":   filterDictsort,
		"selectattr": func(st *state, in Value, a []Value, k []KwArg) (Value, error) {
			return selectOrReject(st, in, a, k, true, true)
		},
		"rejectattr": func(st *state, in Value, a []Value, k []KwArg) (Value, error) {
			return selectOrReject(st, in, a, k, true, false)
		},
		"select": func(st *state, in Value, a []Value, k []KwArg) (Value, error) {
			return selectOrReject(st, in, a, k, false, true)
		},
		"reject": func(st *state, in Value, a []Value, k []KwArg) (Value, error) {
			return selectOrReject(st, in, a, k, false, false)
		},
		"map":       filterMap,
		"string":    filterString,
		"safe":      filterString,
		"int":       filterInt,
		"float":     filterFloat,
		"list":      filterList,
		"reverse":   filterReverse,
		"replace":   filterReplace,
		"indent":    filterIndent,
		"unique":    filterUnique,
		"abs":       filterAbs,
		"sort":      filterSort,
		"min":       func(st *state, in Value, a []Value, k []KwArg) (Value, error) { return filterMinMax(in, a, k, -1) },
		"max":       func(st *state, in Value, a []Value, k []KwArg) (Value, error) { return filterMinMax(in, a, k, 1) },
		"sum":       filterSum,
		"wordcount": filterWordcount,
		"format":    filterFormat,
	}
	tests = map[string]testFunc{
		"defined":   func(_ *state, v Value, _ []Value) (bool, error) { return v.kind != KindUndefined, nil },
		"undefined": func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindUndefined, nil },
		"none":      func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindNone, nil },
		"string":    func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindString, nil },
		"mapping":   func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindDict, nil },
		"iterable": func(_ *state, v Value, _ []Value) (bool, error) {
			return v.kind == KindString || v.kind == KindList || v.kind == KindDict || v.kind == KindUndefined, nil
		},
		"sequence": func(_ *state, v Value, _ []Value) (bool, error) {
			return v.kind == KindString || v.kind == KindList || v.kind == KindDict || v.kind == KindUndefined, nil
		},
		"number": func(_ *state, v Value, _ []Value) (bool, error) { return v.isNumber(), nil },
		"integer": func(_ *state, v Value, _ []Value) (bool, error) {
			return v.kind == KindInt || v.kind == KindBigInt, nil
		},
		"float":   func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindFloat, nil },
		"boolean": func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindBool, nil },
		"true":    func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindBool && v.n != 0, nil },
		"false":   func(_ *state, v Value, _ []Value) (bool, error) { return v.kind == KindBool && v.n == 0, nil },
		"callable": func(_ *state, v Value, _ []Value) (bool, error) {
			return v.kind == KindMacro || v.kind == KindFunc || v.kind == KindMethod, nil
		},
		"lower": func(_ *state, v Value, _ []Value) (bool, error) {
			s, err := toStr(v)
			return pyIsLower(s), err
		},
		"upper": func(_ *state, v Value, _ []Value) (bool, error) {
			s, err := toStr(v)
			return pyIsUpper(s), err
		},
		"even": func(_ *state, v Value, _ []Value) (bool, error) {
			m, err := binop("%", v, Int(2))
			return err == nil && equal(m, Int(0)), err
		},
		"odd": func(_ *state, v Value, _ []Value) (bool, error) {
			m, err := binop("%", v, Int(2))
			return err == nil && equal(m, Int(1)), err
		},
		"divisibleby": func(_ *state, v Value, a []Value) (bool, error) {
			if len(a) != 1 {
				return false, errorf("divisibleby takes one argument")
			}
			m, err := binop("%", v, a[0])
			return err == nil && equal(m, Int(0)), err
		},
		"in": func(_ *state, v Value, a []Value) (bool, error) {
			if len(a) != 1 {
				return false, errorf("in takes one argument")
			}
			return contains(a[0], v)
		},
		"sameas": func(_ *state, v Value, a []Value) (bool, error) {
			if len(a) != 1 {
				return false, errorf("sameas takes one argument")
			}
			o := a[0]
			switch {
			case v.kind == KindNone || o.kind == KindNone:
				return v.kind == o.kind, nil
			case v.kind == KindBool || o.kind == KindBool:
				return v.kind == o.kind && v.n == o.n, nil
			case v.kind == KindList || v.kind == KindDict || v.kind == KindNamespace:
				return v.kind == o.kind && v.ref == o.ref, nil
			}
			return false, unsupportedf("sameas on %s", v.typeName())
		},
	}
	for _, names := range [][]string{{"==", "eq", "equalto"}, {"!=", "ne"}, {"<", "lt", "lessthan"}, {"<=", "le"}, {">", "gt", "greaterthan"}, {">=", "ge"}} {
		op := names[0]
		for _, n := range names[1:] {
			tests[n] = func(_ *state, v Value, a []Value) (bool, error) {
				if len(a) != 1 {
					return false, errorf("%s takes one argument", n)
				}
				return compareOp(op, v, a[0])
			}
		}
		tests[op] = tests[names[1]]
	}
	builtinGlobals = map[string]Value{
		"range":     pureFuncValue(globalRange),
		"namespace": pureFuncValue(globalNamespace),
		"dict":      pureFuncValue(globalDict),
	}
}

var tests map[string]testFunc

var builtinGlobals map[string]Value

func filterLength(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("length", args, kwargs); err != nil {
		return Value{}, err
	}
	n, err := length(in)
	return Int(int64(n)), err
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False).
func filterToJSON(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("tojson", args, kwargs, []string{"ensure_ascii", "indent", "separators", "sort_keys"},
		[]Value{Bool(false), None(), None(), Bool(false)})
	if err != nil {
		return Value{}, err
	}
	o := DefaultDumpOptions()
	o.EnsureASCII = a[0].Truth()
	o.SortKeys = a[3].Truth()
	switch ind := a[1]; ind.kind {
	case KindNone:
	case KindString:
		o.Indent = &ind.s
	case KindInt, KindBool:
		s := strings.Repeat(" ", int(max(0, min(ind.n, 1<<10))))
		o.Indent = &s
	default:
		return Value{}, errorf("tojson: indent must be an int or a string")
	}
	if sep := a[2]; sep.kind != KindNone {
		if sep.kind != KindList || len(sep.items()) != 2 || sep.items()[0].kind != KindString || sep.items()[1].kind != KindString {
			return Value{}, errorf("tojson: separators must be a pair of strings")
		}
		o.ItemSep, o.KeySep = sep.items()[0].s, sep.items()[1].s
	} else if o.Indent != nil {
		o.ItemSep = ","
	}
	if in.kind == KindString && o.Indent == nil && !o.EnsureASCII {
		var b strings.Builder
		b.Grow(len(in.s) + 2)
		writeJSONString(&b, in.s, false)
		return String(b.String()), nil
	}
	s, err := Dumps(in, o)
	return String(s), err
}

func filterTrim(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("trim", args, kwargs, []string{"chars"}, []Value{None()})
	if err != nil {
		return Value{}, err
	}
	s, err := softStr(in)
	if err != nil {
		return Value{}, err
	}
	out, err := pyStrip(s, a[0], true, true)
	return String(out), err
}

func filterDefault(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("default", args, kwargs, []string{"default_value", "boolean"}, []Value{String(""), Bool(false)})
	if err != nil {
		return Value{}, err
	}
	if in.kind == KindUndefined || (a[1].Truth() && !in.Truth()) {
		return a[0], nil
	}
	return in, nil
}

func filterFirst(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("first", args, kwargs); err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	if len(items) == 0 {
		return Undefined("first"), nil
	}
	return items[0], nil
}

func filterLast(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("last", args, kwargs); err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	if len(items) == 0 {
		return Undefined("last"), nil
	}
	return items[len(items)-1], nil
}

// attrGetter is Jinja2's make_attribute_getter: a dotted path of item lookups.
// itemGetter is attrGetter(attr), or the item itself when attr is None (the filter's
// attribute argument was not given).
func itemGetter(attr Value) (func(Value) (Value, error), error) {
	if attr.kind == KindNone {
		return func(v Value) (Value, error) { return v, nil }, nil
	}
	return attrGetter(attr)
}

func attrGetter(attr Value) (func(Value) (Value, error), error) {
	if attr.kind == KindInt {
		return func(v Value) (Value, error) { return getItem(v, attr) }, nil
	}
	if attr.kind != KindString {
		return nil, unsupportedf("attribute of type %s", attr.typeName())
	}
	parts := strings.Split(attr.s, ".")
	return func(v Value) (Value, error) {
		var err error
		for _, p := range parts {
			key := String(p)
			if n, e := strconv.Atoi(p); e == nil {
				key = Int(int64(n))
			}
			if v, err = getItem(v, key); err != nil {
				return Value{}, err
			}
		}
		return v, nil
	}, nil
}

func filterJoin(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("join", args, kwargs, []string{"d", "attribute"}, []Value{String(""), None()})
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	sep, err := softStr(a[0])
	if err != nil {
		return Value{}, err
	}
	var get func(Value) (Value, error)
	if a[1].kind != KindNone {
		if get, err = attrGetter(a[1]); err != nil {
			return Value{}, err
		}
	}
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString(sep)
		}
		if get != nil {
			if it, err = get(it); err != nil {
				return Value{}, err
			}
		}
		if err := writeStr(&b, it); err != nil {
			return Value{}, err
		}
	}
	return String(b.String()), nil
}

func dictItems(d *Dict) []Value {
	out := make([]Value, len(d.pairs))
	for i, p := range d.pairs {
		out[i] = TupleOf(p.Key, p.Value)
	}
	return out
}

func filterItems(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("items", args, kwargs); err != nil {
		return Value{}, err
	}
	switch in.kind {
	case KindUndefined:
		return ListOf([]Value{}), nil
	case KindDict:
		return ListOf(dictItems(in.dict())), nil
	}
	return Value{}, errorf("items: can only get item pairs from a mapping")
}

// sortKey lowers strings for case-insensitive sorting, as Jinja2's ignore_case.
func sortKey(v Value, caseSensitive bool) Value {
	if !caseSensitive && v.kind == KindString {
		return String(pyLowerSimple(v.s))
	}
	return v
}

func sortValues(items []Value, key func(Value) (Value, error), reverse bool) error {
	keys := make([]Value, len(items))
	for i, it := range items {
		k, err := key(it)
		if err != nil {
			return err
		}
		keys[i] = k
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	var sortErr error
	sort.SliceStable(idx, func(i, j int) bool {
		a, b := keys[idx[i]], keys[idx[j]]
		if reverse {
			a, b = b, a
		}
		c, ok := compare(a, b)
		if !ok && sortErr == nil {
			sortErr = errorf("'<' not supported between instances of '%s' and '%s'", a.typeName(), b.typeName())
		}
		return c == -1
	})
	if sortErr != nil {
		return sortErr
	}
	sorted := make([]Value, len(items))
	for i, j := range idx {
		sorted[i] = items[j]
	}
	copy(items, sorted)
	return nil
}

func filterDictsort(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("dictsort", args, kwargs, []string{"case_sensitive", "by", "reverse"}, []Value{Bool(false), String("key"), Bool(false)})
	if err != nil {
		return Value{}, err
	}
	if in.kind != KindDict {
		return Value{}, errorf("dictsort: input is not a mapping")
	}
	pos := 0
	switch {
	case a[1].kind == KindString && a[1].s == "key":
	case a[1].kind == KindString && a[1].s == "value":
		pos = 1
	default:
		return Value{}, errorf("You can only sort by either 'key' or 'value'")
	}
	items := dictItems(in.dict())
	cs := a[0].Truth()
	err = sortValues(items, func(v Value) (Value, error) { return sortKey(v.items()[pos], cs), nil }, a[2].Truth())
	return ListOf(items), err
}

func lookupTest(name Value) (testFunc, error) {
	if name.kind != KindString {
		return nil, errorf("test name must be a string")
	}
	t, ok := tests[name.s]
	if !ok {
		return nil, unsupportedf("test '%s'", name.s)
	}
	return t, nil
}

func selectOrReject(st *state, in Value, args []Value, kwargs []KwArg, byAttr, keep bool) (Value, error) {
	if len(kwargs) > 0 {
		return Value{}, unsupportedf("keyword arguments to select/reject")
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	get := func(v Value) (Value, error) { return v, nil }
	if byAttr {
		if len(args) == 0 {
			return Value{}, errorf("selectattr/rejectattr need an attribute")
		}
		if get, err = attrGetter(args[0]); err != nil {
			return Value{}, err
		}
		args = args[1:]
	}
	var test testFunc
	if len(args) > 0 {
		if test, err = lookupTest(args[0]); err != nil {
			return Value{}, err
		}
		args = args[1:]
	}
	out := []Value{}
	for _, it := range items {
		v, err := get(it)
		if err != nil {
			return Value{}, err
		}
		var ok bool
		if test == nil {
			ok = v.Truth()
		} else if ok, err = test(st, v, args); err != nil {
			return Value{}, err
		}
		if ok == keep {
			out = append(out, it)
		}
	}
	return ListOf(out), nil
}

func filterMap(st *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	var fn func(Value) (Value, error)
	if len(args) == 0 {
		a, err := bind("map", nil, kwargs, []string{"attribute", "default"}, []Value{required, Undefined("")})
		if err != nil {
			return Value{}, err
		}
		get, err := attrGetter(a[0])
		if err != nil {
			return Value{}, err
		}
		fn = func(v Value) (Value, error) {
			r, err := get(v)
			if err == nil && r.kind == KindUndefined && a[1].kind != KindUndefined {
				r = a[1]
			}
			return r, err
		}
	} else {
		if args[0].kind != KindString {
			return Value{}, errorf("map: filter name must be a string")
		}
		f, ok := filters[args[0].s]
		if !ok {
			return Value{}, unsupportedf("filter '%s'", args[0].s)
		}
		rest := args[1:]
		fn = func(v Value) (Value, error) { return f(st, v, rest, kwargs) }
	}
	out := make([]Value, len(items))
	for i, it := range items {
		if out[i], err = fn(it); err != nil {
			return Value{}, err
		}
	}
	return ListOf(out), nil
}

func filterString(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("string", args, kwargs); err != nil {
		return Value{}, err
	}
	s, err := toStr(in)
	return String(s), err
}

func filterInt(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("int", args, kwargs, []string{"default", "base"}, []Value{Int(0), Int(10)})
	if err != nil {
		return Value{}, err
	}
	switch in.kind {
	case KindInt, KindBigInt:
		return in, nil
	case KindBool:
		return Int(in.n), nil
	case KindFloat:
		f := in.float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return a[0], nil
		}
		if math.Abs(f) < 1<<62 {
			return Int(int64(f)), nil
		}
		return Value{}, unsupportedf("int of a huge float")
	case KindString:
		if a[1].kind != KindInt || a[1].n != 10 {
			return Value{}, unsupportedf("int with a base")
		}
		s := strings.TrimFunc(in.s, pyIsSpace)
		if v, ok := parsePyInt(s); ok {
			return v, nil
		}
		if f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64); err == nil && !strings.ContainsAny(s, "xXnN") {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return a[0], nil
			}
			return Int(int64(f)), nil
		}
	}
	return a[0], nil
}

func parsePyInt(s string) (Value, bool) {
	t := strings.TrimLeft(s, "+-")
	if t == "" || len(s)-len(t) > 1 {
		return Value{}, false
	}
	for i := 0; i < len(t); i++ {
		if t[i] < '0' || t[i] > '9' {
			return Value{}, false
		}
	}
	return parseIntLiteral(strings.TrimPrefix(s, "+")), true
}

func filterFloat(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("float", args, kwargs, []string{"default"}, []Value{Float(0)})
	if err != nil {
		return Value{}, err
	}
	switch in.kind {
	case KindFloat:
		return in, nil
	case KindInt, KindBool, KindBigInt:
		return Float(toFloat(in)), nil
	case KindString:
		s := strings.TrimFunc(in.s, pyIsSpace)
		if f, err := strconv.ParseFloat(s, 64); err == nil && !strings.HasPrefix(strings.TrimLeft(s, "+-"), "0x") {
			return Float(f), nil
		}
	}
	return a[0], nil
}

func filterList(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("list", args, kwargs); err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	return ListOf(append([]Value{}, items...)), nil
}

func filterReverse(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("reverse", args, kwargs); err != nil {
		return Value{}, err
	}
	if in.kind == KindString {
		rs := []rune(in.s)
		for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
			rs[i], rs[j] = rs[j], rs[i]
		}
		return String(string(rs)), nil
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	out := make([]Value, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	return ListOf(out), nil
}

func filterReplace(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("replace", args, kwargs, []string{"old", "new", "count"}, []Value{required, required, None()})
	if err != nil {
		return Value{}, err
	}
	s, err := softStr(in)
	if err != nil {
		return Value{}, err
	}
	old, err := softStr(a[0])
	if err != nil {
		return Value{}, err
	}
	nw, err := softStr(a[1])
	if err != nil {
		return Value{}, err
	}
	n := -1
	if a[2].kind == KindInt {
		n = int(a[2].n)
	} else if a[2].kind != KindNone {
		return Value{}, errorf("replace: count must be an int")
	}
	return String(pyReplace(s, old, nw, n)), nil
}

func pyReplace(s, old, nw string, n int) string {
	if n < 0 {
		n = -1
	}
	return strings.Replace(s, old, nw, n)
}

func filterIndent(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("indent", args, kwargs, []string{"width", "first", "blank"}, []Value{Int(4), Bool(false), Bool(false)})
	if err != nil {
		return Value{}, err
	}
	var ind string
	switch a[0].kind {
	case KindString:
		ind = a[0].s
	case KindInt, KindBool:
		ind = strings.Repeat(" ", int(max(0, min(a[0].n, 1<<10))))
	default:
		return Value{}, errorf("indent: width must be an int or a string")
	}
	s, err := softStr(in)
	if err != nil {
		return Value{}, err
	}
	lines := pySplitlines(s + "\n")
	var rv string
	if a[2].Truth() {
		rv = strings.Join(lines, "\n"+ind)
	} else {
		var b strings.Builder
		b.WriteString(lines[0])
		for _, l := range lines[1:] {
			b.WriteByte('\n')
			if l != "" {
				b.WriteString(ind)
			}
			b.WriteString(l)
		}
		rv = b.String()
	}
	if a[1].Truth() {
		rv = ind + rv
	}
	return String(rv), nil
}

func filterUnique(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("unique", args, kwargs, []string{"case_sensitive", "attribute"}, []Value{Bool(false), None()})
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	get, err := itemGetter(a[1])
	if err != nil {
		return Value{}, err
	}
	var seen []Value
	out := []Value{}
	for _, it := range items {
		k, err := get(it)
		if err != nil {
			return Value{}, err
		}
		k = sortKey(k, a[0].Truth())
		if !hashable(k) {
			return Value{}, errorf("unhashable type: '%s'", k.typeName())
		}
		dup := false
		for _, s := range seen {
			if equal(s, k) {
				dup = true
				break
			}
		}
		if !dup {
			seen = append(seen, k)
			out = append(out, it)
		}
	}
	return ListOf(out), nil
}

func filterAbs(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("abs", args, kwargs); err != nil {
		return Value{}, err
	}
	switch in.kind {
	case KindFloat:
		return Float(math.Abs(in.float())), nil
	case KindInt, KindBool, KindBigInt:
		if c, _ := compare(in, Int(0)); c < 0 {
			return binop("-", Int(0), in)
		}
		return binop("+", Int(0), in)
	}
	return Value{}, errorf("bad operand type for abs(): '%s'", in.typeName())
}

func filterSort(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("sort", args, kwargs, []string{"reverse", "case_sensitive", "attribute"}, []Value{Bool(false), Bool(false), None()})
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	items = append([]Value{}, items...)
	get, err := itemGetter(a[2])
	if err != nil {
		return Value{}, err
	}
	cs := a[1].Truth()
	err = sortValues(items, func(v Value) (Value, error) {
		k, err := get(v)
		return sortKey(k, cs), err
	}, a[0].Truth())
	return ListOf(items), err
}

func filterMinMax(in Value, args []Value, kwargs []KwArg, sign int) (Value, error) {
	a, err := bind("min/max", args, kwargs, []string{"case_sensitive", "attribute"}, []Value{Bool(false), None()})
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	if len(items) == 0 {
		return Undefined(""), nil
	}
	get, err := itemGetter(a[1])
	if err != nil {
		return Value{}, err
	}
	best := items[0]
	bk, err := get(best)
	if err != nil {
		return Value{}, err
	}
	bk = sortKey(bk, a[0].Truth())
	for _, it := range items[1:] {
		k, err := get(it)
		if err != nil {
			return Value{}, err
		}
		k = sortKey(k, a[0].Truth())
		c, ok := compare(k, bk)
		if !ok {
			return Value{}, errorf("values not comparable")
		}
		if c == sign {
			best, bk = it, k
		}
	}
	return best, nil
}

func filterSum(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	a, err := bind("sum", args, kwargs, []string{"attribute", "start"}, []Value{None(), Int(0)})
	if err != nil {
		return Value{}, err
	}
	items, err := iterate(in)
	if err != nil {
		return Value{}, err
	}
	get, err := itemGetter(a[0])
	if err != nil {
		return Value{}, err
	}
	acc := a[1]
	for _, it := range items {
		v, err := get(it)
		if err != nil {
			return Value{}, err
		}
		if acc, err = binop("+", acc, v); err != nil {
			return Value{}, err
		}
	}
	return acc, nil
}

func filterWordcount(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if err := noArgs("wordcount", args, kwargs); err != nil {
		return Value{}, err
	}
	s, err := softStr(in)
	if err != nil {
		return Value{}, err
	}
	n := 0
	inWord := false
	for _, r := range s {
		w := r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)
		if w && !inWord {
			n++
		}
		inWord = w
	}
	return Int(int64(n)), nil
}

func filterFormat(_ *state, in Value, args []Value, kwargs []KwArg) (Value, error) {
	if len(kwargs) > 0 {
		return Value{}, unsupportedf("format filter with keyword arguments")
	}
	s, err := softStr(in)
	if err != nil {
		return Value{}, err
	}
	return percentFormat(s, TupleOf(args...))
}

// Globals.

const maxRange = 100000 // Jinja2's sandbox limit

func globalRange(args []Value, kwargs []KwArg) (Value, error) {
	if len(kwargs) > 0 || len(args) == 0 || len(args) > 3 {
		return Value{}, errorf("range expects 1 to 3 integer arguments")
	}
	for _, a := range args {
		if a.kind != KindInt && a.kind != KindBool {
			return Value{}, errorf("'%s' object cannot be interpreted as an integer", a.typeName())
		}
	}
	start, stop, step := int64(0), args[0].n, int64(1)
	if len(args) > 1 {
		start, stop = args[0].n, args[1].n
	}
	if len(args) > 2 {
		step = args[2].n
	}
	if step == 0 {
		return Value{}, errorf("range() arg 3 must not be zero")
	}
	n := int64(0)
	if step > 0 && stop > start {
		n = (stop - start + step - 1) / step
	} else if step < 0 && stop < start {
		n = (start - stop - step - 1) / -step
	}
	if n > maxRange {
		return Value{}, errorf("range too big, maximum size for range is %d", maxRange)
	}
	out := make([]Value, n)
	for i := range out {
		out[i] = Int(start + int64(i)*step)
	}
	return ListOf(out), nil
}

func dictFromArgs(fn string, args []Value, kwargs []KwArg) (*Dict, error) {
	d := NewDict(len(kwargs))
	if len(args) > 1 {
		return nil, errorf("%s expected at most 1 positional argument", fn)
	}
	if len(args) == 1 {
		switch a := args[0]; a.kind {
		case KindDict:
			for _, p := range a.dict().pairs {
				d.SetValue(p.Key, p.Value)
			}
		case KindList:
			for _, it := range a.items() {
				if it.kind != KindList || len(it.items()) != 2 {
					return nil, errorf("%s: sequence elements must be pairs", fn)
				}
				if !hashable(it.items()[0]) {
					return nil, errorf("unhashable type")
				}
				d.SetValue(it.items()[0], it.items()[1])
			}
		default:
			return nil, errorf("%s: '%s' object is not iterable", fn, a.typeName())
		}
	}
	for _, kw := range kwargs {
		d.Set(kw.Name, kw.Value)
	}
	return d, nil
}

func globalNamespace(args []Value, kwargs []KwArg) (Value, error) {
	d, err := dictFromArgs("namespace", args, kwargs)
	if err != nil {
		return Value{}, err
	}
	return Value{kind: KindNamespace, ref: &Namespace{attrs: d}}, nil
}

func globalDict(args []Value, kwargs []KwArg) (Value, error) {
	d, err := dictFromArgs("dict", args, kwargs)
	if err != nil {
		return Value{}, err
	}
	return DictValue(d), nil
}
