package chattemplate

import (
	"errors"
	"sort"
	"strings"
	"unicode"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// strMethodNames are gonja's str methods, delegated as they are except split.
var strMethodNames = []string{
	"capitalize", "capwords", "casefold", "center", "count", "encode", "endswith",
	"expandtabs", "find", "format", "format_map", "isalnum", "isalpha", "isascii",
	"isdecimal", "isdigit", "islower", "isnumeric", "isprintable", "isspace", "istitle",
	"isupper", "join", "ljust", "lower", "lstrip", "partition", "removeprefix",
	"removesuffix", "replace", "rfind", "rjust", "rpartition", "rsplit", "rstrip",
	"splitlines", "startswith", "strip", "swapcase", "title", "upper", "zfill",
}

// newStrMethods returns gonja's str methods with split replaced by Python's: no
// separator splits on runs of whitespace (gonja's fails without arguments).
func newStrMethods() *exec.MethodSet[string] {
	m := map[string]exec.Method[string]{}
	for _, name := range strMethodNames {
		if fn, ok := builtins.Methods.Str.Get(name); ok {
			m[name] = fn
		}
	}
	m["split"] = pySplit
	return exec.NewMethodSet(m)
}

func pySplit(self string, _ *exec.Value, args *exec.VarArgs) (any, error) {
	sep := args.GetKeywordArgument("sep", nil)
	maxsplit := args.GetKeywordArgument("maxsplit", -1)
	if len(args.Args) > 0 {
		sep = args.Args[0]
	}
	if len(args.Args) > 1 {
		maxsplit = args.Args[1]
	}
	if len(args.Args) > 2 || !maxsplit.IsInteger() {
		return nil, errors.New("split() takes at most 2 arguments: sep, maxsplit")
	}
	n := maxsplit.Integer()
	var parts []string
	switch {
	case sep.IsNil():
		rest := strings.TrimLeftFunc(self, unicode.IsSpace)
		for rest != "" {
			if n >= 0 && len(parts) == n {
				parts = append(parts, rest)
				break
			}
			i := strings.IndexFunc(rest, unicode.IsSpace)
			if i < 0 {
				parts = append(parts, rest)
				break
			}
			parts = append(parts, rest[:i])
			rest = strings.TrimLeftFunc(rest[i:], unicode.IsSpace)
		}
	case !sep.IsString() || sep.String() == "":
		return nil, errors.New("split(): empty or non-string separator")
	case n < 0:
		parts = strings.Split(self, sep.String())
	default:
		parts = strings.SplitN(self, sep.String(), n+1)
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

// filterDictsort is Jinja2's dictsort(case_sensitive=False, by='key', reverse=False)
// over ordered dicts: a list of (key, value) pairs.
func filterDictsort(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if !in.IsDict() {
		return exec.AsValue(errors.New("dictsort: input is not a mapping"))
	}
	caseSensitive := params.GetKeywordArgument("case_sensitive", false)
	by := params.GetKeywordArgument("by", "key")
	reverse := params.GetKeywordArgument("reverse", false)
	for i, a := range params.Args {
		switch i {
		case 0:
			caseSensitive = a
		case 1:
			by = a
		case 2:
			reverse = a
		}
	}
	if by.String() != "key" && by.String() != "value" {
		return exec.AsValue(errors.New("dictsort: by must be 'key' or 'value'"))
	}
	type pair struct{ k, v *exec.Value }
	var pairs []pair
	in.Iterate(func(_, _ int, k, v *exec.Value) bool {
		pairs = append(pairs, pair{k, v})
		return true
	}, func() {})
	sortKey := func(p pair) *exec.Value {
		if by.String() == "value" {
			return p.v
		}
		return p.k
	}
	less := func(a, b *exec.Value) bool {
		if a.IsNumber() && b.IsNumber() {
			return a.Float() < b.Float()
		}
		as, bs := a.String(), b.String()
		if !caseSensitive.IsTrue() {
			as, bs = strings.ToLower(as), strings.ToLower(bs)
		}
		return pyStringLess(as, bs)
	}
	sort.SliceStable(pairs, func(i, j int) bool {
		if reverse.IsTrue() {
			return less(sortKey(pairs[j]), sortKey(pairs[i]))
		}
		return less(sortKey(pairs[i]), sortKey(pairs[j]))
	})
	out := make([]any, len(pairs))
	for i, p := range pairs {
		out[i] = []any{p.k, p.v}
	}
	return exec.AsValue(out)
}

// filterItems is Jinja2's items filter: a mapping's (key, value) pairs in insertion
// order; nothing for undefined or None.
func filterItems(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsNil() {
		return exec.AsValue([]any{})
	}
	if !in.IsDict() {
		return exec.AsValue(errors.New("items: input is not a mapping"))
	}
	out := []any{}
	in.Iterate(func(_, _ int, k, v *exec.Value) bool {
		out = append(out, []any{k, v})
		return true
	}, func() {})
	return exec.AsValue(out)
}
