package jinja

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds nesting when printing and dumping values, as Python's recursion
// limit does.
const maxDepth = 512

// DumpOptions are the arguments of Python's json.dumps that transformers' tojson
// filter exposes: ensure_ascii, indent, separators, sort_keys.
type DumpOptions struct {
	EnsureASCII bool
	Indent      *string // nil: single line
	ItemSep     string
	KeySep      string
	SortKeys    bool
}

// DefaultDumpOptions are json.dumps' defaults with ensure_ascii=False (transformers).
func DefaultDumpOptions() DumpOptions { return DumpOptions{ItemSep: ", ", KeySep: ": "} }

// Dumps renders v as Python's json.dumps does (allow_nan=True).
func Dumps(v Value, o DumpOptions) (string, error) {
	var b strings.Builder
	if err := dumpValue(&b, v, o, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func dumpValue(b *strings.Builder, v Value, o DumpOptions, depth int) error {
	if depth > maxDepth {
		return errorf("tojson: nesting deeper than %d", maxDepth)
	}
	switch v.kind {
	case KindNone:
		b.WriteString("null")
	case KindBool:
		if v.n != 0 {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case KindInt:
		b.WriteString(strconv.FormatInt(v.n, 10))
	case KindBigInt:
		b.WriteString(v.Big().String())
	case KindFloat:
		b.WriteString(pyFloatJSON(v.float()))
	case KindString:
		writeJSONString(b, v.s, o.EnsureASCII)
	case KindList:
		items := v.items()
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(o.ItemSep)
			}
			if o.Indent != nil {
				newline(b, o, depth+1)
			}
			if err := dumpValue(b, it, o, depth+1); err != nil {
				return err
			}
		}
		if o.Indent != nil {
			newline(b, o, depth)
		}
		b.WriteByte(']')
	case KindDict:
		return dumpDict(b, v.dict(), o, depth)
	default:
		return errorf("tojson: Object of type %s is not JSON serializable", v.typeName())
	}
	return nil
}

func newline(b *strings.Builder, o DumpOptions, depth int) {
	b.WriteByte('\n')
	for range depth {
		b.WriteString(*o.Indent)
	}
}

func dumpDict(b *strings.Builder, d *Dict, o DumpOptions, depth int) error {
	if d.Len() == 0 {
		b.WriteString("{}")
		return nil
	}
	type kv struct {
		key   string
		value Value
	}
	pairs := make([]kv, len(d.pairs))
	for i, p := range d.pairs {
		k, err := jsonKey(p.Key)
		if err != nil {
			return err
		}
		pairs[i] = kv{k, p.Value}
	}
	if o.SortKeys {
		sort.SliceStable(pairs, func(i, j int) bool { return pyStringLess(pairs[i].key, pairs[j].key) })
	}
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(o.ItemSep)
		}
		if o.Indent != nil {
			newline(b, o, depth+1)
		}
		writeJSONString(b, p.key, o.EnsureASCII)
		b.WriteString(o.KeySep)
		if err := dumpValue(b, p.value, o, depth+1); err != nil {
			return err
		}
	}
	if o.Indent != nil {
		newline(b, o, depth)
	}
	b.WriteByte('}')
	return nil
}

// jsonKey converts a dict key as json.dumps does.
func jsonKey(k Value) (string, error) {
	switch k.kind {
	case KindString:
		return k.s, nil
	case KindNone:
		return "null", nil
	case KindBool:
		if k.n != 0 {
			return "true", nil
		}
		return "false", nil
	case KindInt:
		return strconv.FormatInt(k.n, 10), nil
	case KindBigInt:
		return k.Big().String(), nil
	case KindFloat:
		return pyFloatJSON(k.float()), nil
	}
	return "", errorf("tojson: keys must be str, int, float, bool or None, not %s", k.typeName())
}

// pyStringLess orders strings by code point, as Python compares str.
func pyStringLess(a, b string) bool { return a < b } // UTF-8 byte order is code point order

const hexDigits = "0123456789abcdef"

// writeJSONString writes s as a JSON string literal the way Python's json module
// does: only '"', '\\' and control characters below U+0020 are escaped (short forms for
// \b \f \n \r \t); with ensureASCII, DEL and every non-ASCII code point become
// \uXXXX, using a surrogate pair above U+FFFF.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
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

// writePyRepr writes Python's repr(str).
func writePyRepr(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			b.WriteString(`\x`)
			b.WriteByte(hexDigits[r>>4])
			b.WriteByte(hexDigits[r&0xf])
		case r < 0x7f || unicode.IsPrint(r):
			b.WriteRune(r)
		case r <= 0xff:
			b.WriteString(`\x`)
			b.WriteByte(hexDigits[r>>4])
			b.WriteByte(hexDigits[r&0xf])
		case r <= 0xffff:
			b.WriteString(`\u`)
			for sh := 12; sh >= 0; sh -= 4 {
				b.WriteByte(hexDigits[(r>>sh)&0xf])
			}
		default:
			b.WriteString(`\U`)
			for sh := 28; sh >= 0; sh -= 4 {
				b.WriteByte(hexDigits[(r>>sh)&0xf])
			}
		}
	}
	b.WriteByte(quote)
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

// pyFloatRepr is Python's repr(float): the shortest digits that round-trip, in
// positional notation when the decimal exponent is in [-4, 16), else in scientific
// notation with a signed exponent of at least two digits (1e-07, 1e+16); nan, inf and
// -inf for the non-finite values.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case f == 0:
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
