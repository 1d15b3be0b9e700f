package jinja

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Attribute names that are methods on Python's str, list and dict: Jinja2 resolves
// obj.name to the method before any item of that name.
var (
	strMethods = setOf("capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs",
		"find", "format", "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit",
		"isidentifier", "islower", "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join",
		"ljust", "lower", "lstrip", "maketrans", "partition", "removeprefix", "removesuffix", "replace",
		"rfind", "rindex", "rjust", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith",
		"strip", "swapcase", "title", "translate", "upper", "zfill")
	listMethods = setOf("append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove",
		"reverse", "sort")
	dictMethods = setOf("clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem",
		"setdefault", "update", "values")
	mutators = setOf("append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort",
		"popitem", "setdefault", "update")
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

func callMethod(st *state, recv Value, name string, args []Value, kwargs []KwArg) (Value, error) {
	switch recv.kind {
	case KindString:
		return strMethod(recv.s, name, args, kwargs)
	case KindDict:
		return dictMethod(recv.dict(), name, args, kwargs)
	case KindList:
		return listMethod(recv.items(), name, args, kwargs)
	case KindLoop:
		if name == "loop.cycle" {
			if len(args) == 0 {
				return Value{}, errorf("no items for cycling given")
			}
			return args[recv.ref.(*loopState).index0%len(args)], nil
		}
	}
	return Value{}, unsupportedf("method %s of %s", name, recv.typeName())
}

func dictMethod(d *Dict, name string, args []Value, kwargs []KwArg) (Value, error) {
	switch name {
	case "items", "keys", "values":
		if err := noArgs(name, args, kwargs); err != nil {
			return Value{}, err
		}
		out := make([]Value, len(d.pairs))
		for i, p := range d.pairs {
			switch name {
			case "items":
				out[i] = TupleOf(p.Key, p.Value)
			case "keys":
				out[i] = p.Key
			default:
				out[i] = p.Value
			}
		}
		return Value{kind: KindList, ref: &List{Items: out, view: "dict_" + name}}, nil
	case "get":
		if len(kwargs) > 0 || len(args) < 1 || len(args) > 2 {
			return Value{}, errorf("get expected 1 or 2 arguments")
		}
		if !hashable(args[0]) {
			return Value{}, errorf("unhashable type: '%s'", args[0].typeName())
		}
		if v, ok := d.getValue(args[0]); ok {
			return v, nil
		}
		if len(args) == 2 {
			return args[1], nil
		}
		return None(), nil
	}
	if mutators[name] {
		return Value{}, errorf("access to unsafe method %s of an immutable dict", name)
	}
	return Value{}, unsupportedf("dict.%s", name)
}

func listMethod(items []Value, name string, args []Value, kwargs []KwArg) (Value, error) {
	switch name {
	case "index", "count":
		if len(kwargs) > 0 || len(args) != 1 {
			return Value{}, unsupportedf("list.%s with these arguments", name)
		}
		n := 0
		for i, it := range items {
			if equal(it, args[0]) {
				if name == "index" {
					return Int(int64(i)), nil
				}
				n++
			}
		}
		if name == "index" {
			return Value{}, errorf("value is not in list")
		}
		return Int(int64(n)), nil
	}
	if mutators[name] {
		return Value{}, errorf("access to unsafe method %s of an immutable list", name)
	}
	return Value{}, unsupportedf("list.%s", name)
}

func strArg(fn string, v Value) (string, error) {
	if v.kind != KindString {
		return "", errorf("%s: argument must be str, not %s", fn, v.typeName())
	}
	return v.s, nil
}

func strMethod(s, name string, args []Value, kwargs []KwArg) (Value, error) {
	switch name {
	case "startswith", "endswith":
		if len(kwargs) > 0 || len(args) != 1 {
			return Value{}, unsupportedf("str.%s with start/end", name)
		}
		var cands []Value
		switch a := args[0]; a.kind {
		case KindString:
			cands = args[:1]
		case KindList:
			if !a.ref.(*List).Tuple {
				return Value{}, errorf("%s first arg must be str or a tuple of str", name)
			}
			cands = a.items()
		default:
			return Value{}, errorf("%s first arg must be str or a tuple of str, not %s", name, a.typeName())
		}
		for _, c := range cands {
			p, err := strArg(name, c)
			if err != nil {
				return Value{}, err
			}
			if (name == "startswith" && strings.HasPrefix(s, p)) || (name == "endswith" && strings.HasSuffix(s, p)) {
				return Bool(true), nil
			}
		}
		return Bool(false), nil
	case "strip", "lstrip", "rstrip":
		a, err := bind(name, args, kwargs, []string{"chars"}, []Value{None()})
		if err != nil {
			return Value{}, err
		}
		out, err := pyStrip(s, a[0], name != "rstrip", name != "lstrip")
		return String(out), err
	case "split", "rsplit":
		a, err := bind(name, args, kwargs, []string{"sep", "maxsplit"}, []Value{None(), Int(-1)})
		if err != nil {
			return Value{}, err
		}
		if a[1].kind != KindInt && a[1].kind != KindBool {
			return Value{}, errorf("maxsplit must be an int")
		}
		var parts []string
		if a[0].kind == KindNone {
			parts = splitWhitespace(s, int(a[1].n), name == "rsplit")
		} else {
			sep, err := strArg(name, a[0])
			if err != nil {
				return Value{}, err
			}
			if sep == "" {
				return Value{}, errorf("empty separator")
			}
			parts = splitSep(s, sep, int(a[1].n), name == "rsplit")
		}
		out := make([]Value, len(parts))
		for i, p := range parts {
			out[i] = String(p)
		}
		return ListOf(out), nil
	case "replace":
		a, err := bind(name, args, kwargs, []string{"old", "new", "count"}, []Value{required, required, Int(-1)})
		if err != nil {
			return Value{}, err
		}
		old, err := strArg(name, a[0])
		if err != nil {
			return Value{}, err
		}
		nw, err := strArg(name, a[1])
		if err != nil {
			return Value{}, err
		}
		if a[2].kind != KindInt {
			return Value{}, errorf("replace: count must be an int")
		}
		return String(pyReplace(s, old, nw, int(a[2].n))), nil
	case "upper", "lower", "title", "capitalize", "swapcase", "casefold":
		if err := noArgs(name, args, kwargs); err != nil {
			return Value{}, err
		}
		var out string
		var err error
		switch name {
		case "upper":
			out, err = pyUpper(s)
		case "lower":
			out, err = pyLower(s)
		case "title":
			out, err = pyTitle(s)
		case "capitalize":
			out, err = pyCapitalize(s)
		default:
			return Value{}, unsupportedf("str.%s", name)
		}
		return String(out), err
	case "find", "rfind", "index", "rindex", "count":
		if len(kwargs) > 0 || len(args) != 1 {
			return Value{}, unsupportedf("str.%s with start/end", name)
		}
		sub, err := strArg(name, args[0])
		if err != nil {
			return Value{}, err
		}
		var i int
		switch name {
		case "count":
			if sub == "" {
				return Int(int64(utf8.RuneCountInString(s) + 1)), nil
			}
			return Int(int64(strings.Count(s, sub))), nil
		case "find", "index":
			i = strings.Index(s, sub)
		default:
			i = strings.LastIndex(s, sub)
		}
		if i < 0 {
			if name == "index" || name == "rindex" {
				return Value{}, errorf("substring not found")
			}
			return Int(-1), nil
		}
		return Int(int64(utf8.RuneCountInString(s[:i]))), nil
	case "join":
		if len(kwargs) > 0 || len(args) != 1 {
			return Value{}, errorf("join() takes exactly one argument")
		}
		items, err := iterate(args[0])
		if err != nil {
			return Value{}, err
		}
		var b strings.Builder
		for i, it := range items {
			if it.kind != KindString {
				return Value{}, errorf("sequence item %d: expected str instance, %s found", i, it.typeName())
			}
			if i > 0 {
				b.WriteString(s)
			}
			b.WriteString(it.s)
		}
		return String(b.String()), nil
	case "splitlines":
		if len(args)+len(kwargs) > 0 {
			return Value{}, unsupportedf("splitlines(keepends)")
		}
		parts := pySplitlines(s)
		out := make([]Value, len(parts))
		for i, p := range parts {
			out[i] = String(p)
		}
		return ListOf(out), nil
	case "removeprefix", "removesuffix":
		if len(kwargs) > 0 || len(args) != 1 {
			return Value{}, errorf("%s takes one argument", name)
		}
		a, err := strArg(name, args[0])
		if err != nil {
			return Value{}, err
		}
		if name == "removeprefix" {
			return String(strings.TrimPrefix(s, a)), nil
		}
		return String(strings.TrimSuffix(s, a)), nil
	case "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower":
		if err := noArgs(name, args, kwargs); err != nil {
			return Value{}, err
		}
		switch name {
		case "isupper":
			return Bool(pyIsUpper(s)), nil
		case "islower":
			return Bool(pyIsLower(s)), nil
		}
		if s == "" {
			return Bool(false), nil
		}
		for _, r := range s {
			var ok bool
			switch name {
			case "isdigit":
				ok = r >= '0' && r <= '9'
				if r >= utf8.RuneSelf {
					return Value{}, unsupportedf("str.isdigit on non-ASCII text")
				}
			case "isalpha":
				ok = unicode.IsLetter(r)
			case "isalnum":
				ok = unicode.IsLetter(r) || r < utf8.RuneSelf && r >= '0' && r <= '9'
				if r >= utf8.RuneSelf && !ok {
					return Value{}, unsupportedf("str.isalnum on non-ASCII text")
				}
			case "isspace":
				ok = pyIsSpace(r)
			}
			if !ok {
				return Bool(false), nil
			}
		}
		return Bool(true), nil
	case "format":
		return strFormat(s, args, kwargs)
	}
	return Value{}, unsupportedf("str.%s", name)
}

// pyStrip is str.strip/lstrip/rstrip: whitespace, or the characters in chars.
func pyStrip(s string, chars Value, left, right bool) (string, error) {
	cut := pyIsSpace
	switch chars.kind {
	case KindNone:
	case KindString:
		set := chars.s
		cut = func(r rune) bool { return strings.ContainsRune(set, r) }
	default:
		return "", errorf("strip arg must be None or str")
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s, nil
}

func splitWhitespace(s string, maxsplit int, fromRight bool) []string {
	fields := strings.FieldsFunc(s, pyIsSpace)
	if maxsplit < 0 || len(fields) <= maxsplit+1 {
		if fields == nil {
			return []string{}
		}
		return fields
	}
	if !fromRight {
		rest := strings.TrimLeftFunc(s, pyIsSpace)
		var out []string
		for len(out) < maxsplit {
			i := strings.IndexFunc(rest, pyIsSpace)
			out = append(out, rest[:i])
			rest = strings.TrimLeftFunc(rest[i:], pyIsSpace)
		}
		return append(out, strings.TrimRightFunc(rest, func(rune) bool { return false }))
	}
	rest := strings.TrimRightFunc(s, pyIsSpace)
	var rev []string
	for len(rev) < maxsplit {
		i := strings.LastIndexFunc(rest, pyIsSpace)
		_, size := utf8.DecodeRuneInString(rest[i:])
		rev = append(rev, rest[i+size:])
		rest = strings.TrimRightFunc(rest[:i], pyIsSpace)
	}
	out := []string{rest}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

func splitSep(s, sep string, maxsplit int, fromRight bool) []string {
	if maxsplit < 0 {
		return strings.Split(s, sep)
	}
	if !fromRight {
		return strings.SplitN(s, sep, maxsplit+1)
	}
	var rev []string
	for len(rev) < maxsplit {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		rev = append(rev, s[i+len(sep):])
		s = s[:i]
	}
	out := []string{s}
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i])
	}
	return out
}

// pySplitlines is str.splitlines() (without keepends).
func pySplitlines(s string) []string {
	out := []string{}
	start := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\n', '\v', '\f', '\x1c', '\x1d', '\x1e', 0x85, 0x2028, 0x2029:
			out = append(out, s[start:i])
			i += size
			start = i
		case '\r':
			out = append(out, s[start:i])
			i += size
			if i < len(s) && s[i] == '\n' {
				i++
			}
			start = i
		default:
			i += size
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// specialCase reports runes whose Python case mapping differs from Go's simple one
// (multi-character mappings, final sigma, dotted I): str.upper/lower refuse them
// rather than differ.
func specialCase(s string) bool {
	for _, r := range s {
		switch {
		case r == 0xDF, r == 0x130, r == 0x149, r == 0x1F0, r == 0x390, r == 0x3B0, r == 0x3A3, r == 0x587,
			r >= 0x1E96 && r <= 0x1E9E, r >= 0x1F50 && r <= 0x1FFF, r >= 0xFB00 && r <= 0xFB17:
			return true
		}
	}
	return false
}

func pyUpper(s string) (string, error) {
	if !isASCII(s) && specialCase(s) {
		return "", unsupportedf("upper() of text with special case mappings")
	}
	return strings.ToUpper(s), nil
}

func pyLower(s string) (string, error) {
	if !isASCII(s) && specialCase(s) {
		return "", unsupportedf("lower() of text with special case mappings")
	}
	return strings.ToLower(s), nil
}

// pyLowerSimple lowers for sort keys (Jinja2's ignore_case uses str.lower).
func pyLowerSimple(s string) string { return strings.ToLower(s) }

func isCased(r rune) bool { return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) }

// pyTitle is str.title().
func pyTitle(s string) (string, error) {
	if !isASCII(s) && specialCase(s) {
		return "", unsupportedf("title() of text with special case mappings")
	}
	var b strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(r))
		} else {
			b.WriteRune(unicode.ToTitle(r))
		}
		prevCased = isCased(r)
	}
	return b.String(), nil
}

// pyCapitalize is str.capitalize(): the first character title-cased, the rest lowered.
func pyCapitalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	if !isASCII(s) && specialCase(s) {
		return "", unsupportedf("capitalize() of text with special case mappings")
	}
	r, size := utf8.DecodeRuneInString(s)
	return string(unicode.ToTitle(r)) + strings.ToLower(s[size:]), nil
}

func pyCapitalizeJinja(s string) (string, error) { return pyCapitalize(s) }

// jinjaTitle is Jinja2's title filter: words split before runs of whitespace and
// -({[< each get an upper-case first character and lower-case rest.
func jinjaTitle(s string) (string, error) {
	if !isASCII(s) && specialCase(s) {
		return "", unsupportedf("title of text with special case mappings")
	}
	var b strings.Builder
	wordStart := true
	for _, r := range s {
		sepChar := pyIsSpace(r) || strings.ContainsRune("-({[<", r)
		switch {
		case sepChar:
			b.WriteRune(r)
			wordStart = true
		case wordStart:
			b.WriteRune(unicode.ToUpper(r))
			wordStart = false
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String(), nil
}

func pyIsUpper(s string) bool {
	cased := false
	for _, r := range s {
		if unicode.IsLower(r) || unicode.IsTitle(r) {
			return false
		}
		if unicode.IsUpper(r) {
			cased = true
		}
	}
	return cased
}

func pyIsLower(s string) bool {
	cased := false
	for _, r := range s {
		if unicode.IsUpper(r) || unicode.IsTitle(r) {
			return false
		}
		if unicode.IsLower(r) {
			cased = true
		}
	}
	return cased
}

// strFormat is str.format for plain replacement fields ({}, {0}, {name}); format
// specs and conversions are refused.
func strFormat(s string, args []Value, kwargs []KwArg) (Value, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '}' {
			if i+1 < len(s) && s[i+1] == '}' {
				b.WriteByte('}')
				i++
				continue
			}
			return Value{}, errorf("Single '}' encountered in format string")
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(s) && s[i+1] == '{' {
			b.WriteByte('{')
			i++
			continue
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return Value{}, errorf("Single '{' encountered in format string")
		}
		field := s[i+1 : i+end]
		i += end
		if strings.ContainsAny(field, ":![.{") {
			return Value{}, unsupportedf("str.format field %q", field)
		}
		var v Value
		switch {
		case field == "":
			if auto >= len(args) {
				return Value{}, errorf("Replacement index %d out of range", auto)
			}
			v = args[auto]
			auto++
		case field[0] >= '0' && field[0] <= '9':
			n, err := strconv.Atoi(field)
			if err != nil || n >= len(args) {
				return Value{}, errorf("Replacement index %s out of range", field)
			}
			v = args[n]
		default:
			found := false
			for _, kw := range kwargs {
				if kw.Name == field {
					v, found = kw.Value, true
				}
			}
			if !found {
				return Value{}, errorf("KeyError: '%s'", field)
			}
		}
		if err := writeStr(&b, v); err != nil {
			return Value{}, err
		}
	}
	return String(b.String()), nil
}

// percentFormat is Python's str % args for %s, %r, %d, %i and %% without flags,
// width or precision; anything else is refused.
func percentFormat(s string, arg Value) (Value, error) {
	var args []Value
	if arg.kind == KindList && arg.ref.(*List).Tuple {
		args = arg.items()
	} else if arg.kind == KindDict {
		return Value{}, unsupportedf("%%-formatting with a mapping")
	} else {
		args = []Value{arg}
	}
	var b strings.Builder
	next := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+1 >= len(s) {
			return Value{}, errorf("incomplete format")
		}
		i++
		verb := s[i]
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if next >= len(args) {
			return Value{}, errorf("not enough arguments for format string")
		}
		v := args[next]
		next++
		switch verb {
		case 's':
			if err := writeStr(&b, v); err != nil {
				return Value{}, err
			}
		case 'r':
			if err := writeRepr(&b, v, 0); err != nil {
				return Value{}, err
			}
		case 'd', 'i':
			switch v.kind {
			case KindInt, KindBool:
				b.WriteString(strconv.FormatInt(v.n, 10))
			case KindBigInt:
				b.WriteString(v.Big().String())
			case KindFloat:
				return Value{}, unsupportedf("%%d of a float")
			default:
				return Value{}, errorf("%%d format: a real number is required, not %s", v.typeName())
			}
		default:
			return Value{}, unsupportedf("%%-format verb %q", verb)
		}
	}
	if next < len(args) {
		return Value{}, errorf("not all arguments converted during string formatting")
	}
	return String(b.String()), nil
}
