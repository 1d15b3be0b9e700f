package chattemplate

import (
	"fmt"
	"math/big"
	"sort"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// dumpOptions mirrors the arguments of Python's json.dumps that transformers' tojson
// filter exposes: ensure_ascii, indent, separators, sort_keys.
type dumpOptions struct {
	ensureASCII bool
	indent      *string // nil: single line
	itemSep     string
	keySep      string
	sortKeys    bool
}

func defaultDumpOptions() dumpOptions {
	return dumpOptions{itemSep: ", ", keySep: ": "}
}

// pyDumps renders v the way Python's json.dumps does (allow_nan=True).
func pyDumps(v *exec.Value, o dumpOptions) (string, error) {
	var b strings.Builder
	if err := dumpValue(&b, v, o, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func dumpValue(b *strings.Builder, v *exec.Value, o dumpOptions, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("tojson: nesting deeper than %d", maxDepth)
	}
	if isNone(v) {
		b.WriteString("null")
		return nil
	}
	if v.IsError() {
		return fmt.Errorf("tojson: %s", v.Error())
	}
	if bi, ok := v.Interface().(*big.Int); ok {
		b.WriteString(bi.String())
		return nil
	}
	switch {
	case v.IsBool():
		if v.Bool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInteger():
		b.WriteString(v.String())
	case v.IsFloat():
		b.WriteString(pyFloatJSON(v.Float()))
	case v.IsString():
		writePyString(b, v.String(), o.ensureASCII)
	case v.IsDict():
		return dumpDict(b, v, o, depth)
	case v.IsList():
		return dumpList(b, v, o, depth)
	default:
		return fmt.Errorf("tojson: object of type %s is not JSON serializable", v.Val.Type())
	}
	return nil
}

func newline(b *strings.Builder, o dumpOptions, depth int) {
	b.WriteByte('\n')
	for range depth {
		b.WriteString(*o.indent)
	}
}

func dumpList(b *strings.Builder, v *exec.Value, o dumpOptions, depth int) error {
	n := v.Len()
	if n == 0 {
		b.WriteString("[]")
		return nil
	}
	b.WriteByte('[')
	var err error
	first := true
	v.Iterate(func(_, _ int, item, _ *exec.Value) bool {
		if !first {
			b.WriteString(o.itemSep)
		}
		first = false
		if o.indent != nil {
			newline(b, o, depth+1)
		}
		err = dumpValue(b, item, o, depth+1)
		return err == nil
	}, func() {})
	if err != nil {
		return err
	}
	if o.indent != nil {
		newline(b, o, depth)
	}
	b.WriteByte(']')
	return nil
}

type kv struct {
	key   string
	value *exec.Value
}

func dumpDict(b *strings.Builder, v *exec.Value, o dumpOptions, depth int) error {
	var pairs []kv
	var err error
	v.Iterate(func(_, _ int, key, value *exec.Value) bool {
		var k string
		k, err = pyJSONKey(key)
		pairs = append(pairs, kv{k, value})
		return err == nil
	}, func() {})
	if err != nil {
		return err
	}
	if len(pairs) == 0 {
		b.WriteString("{}")
		return nil
	}
	if o.sortKeys {
		sort.SliceStable(pairs, func(i, j int) bool { return pyStringLess(pairs[i].key, pairs[j].key) })
	}
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		if o.indent != nil {
			newline(b, o, depth+1)
		}
		writePyString(b, p.key, o.ensureASCII)
		b.WriteString(o.keySep)
		if err := dumpValue(b, p.value, o, depth+1); err != nil {
			return err
		}
	}
	if o.indent != nil {
		newline(b, o, depth)
	}
	b.WriteByte('}')
	return nil
}

// pyJSONKey converts a dict key as json.dumps does: strings as is, numbers, booleans
// and None to their JSON spelling.
func pyJSONKey(k *exec.Value) (string, error) {
	switch {
	case isNone(k):
		return "null", nil
	case k.IsString():
		return k.String(), nil
	case k.IsBool():
		if k.Bool() {
			return "true", nil
		}
		return "false", nil
	case k.IsInteger():
		return k.String(), nil
	case k.IsFloat():
		return pyFloatJSON(k.Float()), nil
	}
	return "", fmt.Errorf("tojson: keys must be str, int, float, bool or None, not %s", k.Val.Type())
}

// pyStringLess orders strings by code point, as Python compares str.
func pyStringLess(a, b string) bool { return jinja.PyStringLess(a, b) }

// writePyString writes s as Python's json module writes a string literal.
func writePyString(b *strings.Builder, s string, ensureASCII bool) {
	jinja.WriteJSONString(b, s, ensureASCII)
}

// pyFloatJSON is float.__repr__ as json.dumps writes it.
func pyFloatJSON(f float64) string { return jinja.PyFloatJSON(f) }

// pyFloatRepr is Python's repr(float).
func pyFloatRepr(f float64) string { return jinja.PyFloatRepr(f) }
