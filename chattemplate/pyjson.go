package chattemplate

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
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
func pyStringLess(a, b string) bool {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			return ra < rb
		}
		a, b = a[na:], b[nb:]
	}
	return a == "" && b != ""
}

const hexDigits = "0123456789abcdef"

// writePyString writes s as a JSON string literal the way Python's json module does:
// only '"', '\\' and control characters below U+0020 are escaped (short forms for
// \b \f \n \r \t); with ensureASCII, DEL and every non-ASCII code point become \uXXXX,
// using a surrogate pair above U+FFFF.
func writePyString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (c != 0x7f || !ensureASCII) {
				i++
				continue
			}
			b.WriteString(s[start:i])
			switch c {
			case '"':
				b.WriteString(`\"`)
			case '\\':
				b.WriteString(`\\`)
			case '\n':
				b.WriteString(`\n`)
			case '\r':
				b.WriteString(`\r`)
			case '\t':
				b.WriteString(`\t`)
			case '\b':
				b.WriteString(`\b`)
			case '\f':
				b.WriteString(`\f`)
			default:
				writeU(b, rune(c))
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if !ensureASCII {
			i += size
			continue
		}
		b.WriteString(s[start:i])
		if r >= 0x10000 {
			r1, r2 := utf16.EncodeRune(r)
			writeU(b, r1)
			writeU(b, r2)
		} else {
			writeU(b, r)
		}
		i += size
		start = i
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

func writeU(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	b.WriteByte(hexDigits[(r>>12)&0xf])
	b.WriteByte(hexDigits[(r>>8)&0xf])
	b.WriteByte(hexDigits[(r>>4)&0xf])
	b.WriteByte(hexDigits[r&0xf])
}

// pyFloatJSON is float.__repr__ as json.dumps writes it (NaN, Infinity, -Infinity
// for the non-finite values).
func pyFloatJSON(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloatRepr(f)
}

// pyFloatRepr is Python's repr(float) for finite values: the shortest digits that
// round-trip, in positional notation when the decimal exponent is in [-4, 16), else in
// scientific notation with a signed exponent of at least two digits (1e-07, 1e+16).
func pyFloatRepr(f float64) string {
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // -d.ddde±XX
	neg := false
	if e[0] == '-' {
		neg = true
		e = e[1:]
	}
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	var out strings.Builder
	if neg {
		out.WriteByte('-')
	}
	if exp >= -4 && exp < 16 {
		point := exp + 1 // digits before the decimal point
		switch {
		case point <= 0:
			out.WriteString("0.")
			out.WriteString(strings.Repeat("0", -point))
			out.WriteString(digits)
		case point >= len(digits):
			out.WriteString(digits)
			out.WriteString(strings.Repeat("0", point-len(digits)))
			out.WriteString(".0")
		default:
			out.WriteString(digits[:point])
			out.WriteByte('.')
			out.WriteString(digits[point:])
		}
		return out.String()
	}
	out.WriteString(digits[:1])
	if len(digits) > 1 {
		out.WriteByte('.')
		out.WriteString(digits[1:])
	}
	out.WriteByte('e')
	if exp < 0 {
		out.WriteByte('-')
		exp = -exp
	} else {
		out.WriteByte('+')
	}
	if exp < 10 {
		out.WriteByte('0')
	}
	out.WriteString(strconv.Itoa(exp))
	return out.String()
}
