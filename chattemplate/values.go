package chattemplate

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// maxDepth bounds JSON nesting, as Python's json module is bounded by its recursion
// limit; it keeps hostile input from exhausting the stack.
const maxDepth = 512

// The template engines see request JSON as jinja values, built to behave like the
// Python objects json.loads returns:
//
//	object -> ordered dict (keys in request order, a repeated key keeps its first
//	          position and takes the last value, as a Python dict does)
//	array  -> list
//	string -> str
//	number -> int when it has no fraction or exponent (big ints stay exact), float
//	          otherwise (1.0 stays a float)
//	true/false -> bool, null -> None
//
// Building them from the raw bytes, not from encoding/json, keeps key order, integer
// precision and the int/float distinction that Python's json.dumps later prints.

// errJSON is wrapped by every decoding error.
var errJSON = errors.New("invalid JSON")

type jsonDecoder struct {
	data []byte
	pos  int
}

// decodeJSON parses one JSON value (RFC 8259, UTF-8) into template values. It rejects
// invalid UTF-8 and escaped lone surrogates, which vLLM cannot tokenize either.
func decodeJSON(data []byte) (jinja.Value, error) {
	d := &jsonDecoder{data: data}
	d.skipSpace()
	v, err := d.value(0)
	if err != nil {
		return jinja.Value{}, err
	}
	d.skipSpace()
	if d.pos != len(d.data) {
		return jinja.Value{}, d.errorf("trailing data")
	}
	return v, nil
}

func (d *jsonDecoder) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at offset %d: %s", errJSON, d.pos, fmt.Sprintf(format, args...))
}

func (d *jsonDecoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *jsonDecoder) value(depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Value{}, d.errorf("nesting deeper than %d", maxDepth)
	}
	if d.pos >= len(d.data) {
		return jinja.Value{}, d.errorf("unexpected end of input")
	}
	switch c := d.data[d.pos]; {
	case c == '{':
		return d.object(depth)
	case c == '[':
		return d.array(depth)
	case c == '"':
		s, err := d.str()
		return jinja.String(s), err
	case c == 't':
		return jinja.Bool(true), d.literal("true")
	case c == 'f':
		return jinja.Bool(false), d.literal("false")
	case c == 'n':
		return jinja.None(), d.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return d.number()
	default:
		return jinja.Value{}, d.errorf("unexpected character %q", c)
	}
}

func (d *jsonDecoder) literal(word string) error {
	if len(d.data)-d.pos < len(word) || string(d.data[d.pos:d.pos+len(word)]) != word {
		return d.errorf("invalid literal")
	}
	d.pos += len(word)
	return nil
}

func (d *jsonDecoder) object(depth int) (jinja.Value, error) {
	d.pos++ // {
	dict := jinja.NewDict(4)
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		return jinja.DictValue(dict), nil
	}
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return jinja.Value{}, d.errorf("expected object key")
		}
		key, err := d.str()
		if err != nil {
			return jinja.Value{}, err
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return jinja.Value{}, d.errorf("expected ':'")
		}
		d.pos++
		d.skipSpace()
		v, err := d.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		dict.Set(key, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return jinja.Value{}, d.errorf("unexpected end of object")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return jinja.DictValue(dict), nil
		default:
			return jinja.Value{}, d.errorf("expected ',' or '}'")
		}
	}
}

func (d *jsonDecoder) array(depth int) (jinja.Value, error) {
	d.pos++ // [
	list := []jinja.Value{}
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		return jinja.ListOf(list), nil
	}
	for {
		d.skipSpace()
		v, err := d.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		list = append(list, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return jinja.Value{}, d.errorf("unexpected end of array")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return jinja.ListOf(list), nil
		default:
			return jinja.Value{}, d.errorf("expected ',' or ']'")
		}
	}
}

func (d *jsonDecoder) number() (jinja.Value, error) {
	start := d.pos
	isFloat := false
	if d.data[d.pos] == '-' {
		d.pos++
	}
	digits := func() int {
		n := 0
		for d.pos < len(d.data) && d.data[d.pos] >= '0' && d.data[d.pos] <= '9' {
			d.pos++
			n++
		}
		return n
	}
	intStart := d.pos
	if n := digits(); n == 0 {
		return jinja.Value{}, d.errorf("invalid number")
	} else if n > 1 && d.data[intStart] == '0' {
		return jinja.Value{}, d.errorf("leading zero in number")
	}
	if d.pos < len(d.data) && d.data[d.pos] == '.' {
		isFloat = true
		d.pos++
		if digits() == 0 {
			return jinja.Value{}, d.errorf("invalid number")
		}
	}
	if d.pos < len(d.data) && (d.data[d.pos] == 'e' || d.data[d.pos] == 'E') {
		isFloat = true
		d.pos++
		if d.pos < len(d.data) && (d.data[d.pos] == '+' || d.data[d.pos] == '-') {
			d.pos++
		}
		if digits() == 0 {
			return jinja.Value{}, d.errorf("invalid number")
		}
	}
	text := string(d.data[start:d.pos])
	if isFloat {
		// Out-of-range values become ±Inf or 0, as Python's float() makes them.
		f, err := strconv.ParseFloat(text, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return jinja.Value{}, d.errorf("invalid number %q", text)
		}
		return jinja.Float(f), nil
	}
	if i, err := strconv.ParseInt(text, 10, 64); err == nil {
		return jinja.Int(i), nil
	}
	bi, ok := new(big.Int).SetString(text, 10)
	if !ok {
		return jinja.Value{}, d.errorf("invalid number %q", text)
	}
	return jinja.BigInt(bi), nil
}

// plainByte marks the bytes a JSON string holds unescaped (not '"', '\\' or a control
// character).
var plainByte = func() (t [256]bool) {
	for i := 0x20; i < 256; i++ {
		t[i] = i != '"' && i != '\\'
	}
	return t
}()

func (d *jsonDecoder) plainRun() int {
	i := d.pos
	for i < len(d.data) && plainByte[d.data[i]] {
		i++
	}
	return i
}

func (d *jsonDecoder) str() (string, error) {
	d.pos++ // opening quote
	start := d.pos
	d.pos = d.plainRun()
	if d.pos < len(d.data) && d.data[d.pos] == '"' { // no escapes
		s := d.data[start:d.pos]
		if !utf8.Valid(s) {
			return "", d.errorf("invalid UTF-8 in string")
		}
		d.pos++
		return string(s), nil
	}
	// Size the buffer once: the decoded string is no longer than its source. A
	// strings.Builder hands its bytes over as the string without a copy, so a long
	// string (a huge prompt) costs its decoded size once, not twice.
	end := d.pos
	for end < len(d.data) && d.data[end] != '"' {
		if d.data[end] == '\\' {
			end++
		}
		end++
	}
	var buf strings.Builder
	buf.Grow(min(end, len(d.data)) - start)
	buf.Write(d.data[start:d.pos])
	for d.pos < len(d.data) {
		switch c := d.data[d.pos]; {
		case c == '"':
			if !utf8.ValidString(buf.String()) {
				return "", d.errorf("invalid UTF-8 in string")
			}
			d.pos++
			return buf.String(), nil
		case c < 0x20:
			return "", d.errorf("control character in string")
		case c != '\\':
			end := d.plainRun()
			buf.Write(d.data[d.pos:end])
			d.pos = end
			continue
		}
		d.pos++
		if d.pos >= len(d.data) {
			break
		}
		e := d.data[d.pos]
		d.pos++
		switch e {
		case '"', '\\', '/':
			buf.WriteByte(e)
		case 'b':
			buf.WriteByte('\b')
		case 'f':
			buf.WriteByte('\f')
		case 'n':
			buf.WriteByte('\n')
		case 'r':
			buf.WriteByte('\r')
		case 't':
			buf.WriteByte('\t')
		case 'u':
			r, err := d.hex4()
			if err != nil {
				return "", err
			}
			if utf16.IsSurrogate(r) {
				if r >= 0xDC00 || d.pos+6 > len(d.data) || d.data[d.pos] != '\\' || d.data[d.pos+1] != 'u' {
					return "", d.errorf("lone surrogate \\u%04x", r)
				}
				d.pos += 2
				r2, err := d.hex4()
				if err != nil {
					return "", err
				}
				combined := utf16.DecodeRune(r, r2)
				if combined == utf8.RuneError {
					return "", d.errorf("lone surrogate \\u%04x", r)
				}
				r = combined
			}
			buf.WriteRune(r)
		default:
			return "", d.errorf("invalid escape \\%c", e)
		}
	}
	return "", d.errorf("unterminated string")
}

func (d *jsonDecoder) hex4() (rune, error) {
	if d.pos+4 > len(d.data) {
		return 0, d.errorf("short \\u escape")
	}
	var r rune
	for _, c := range d.data[d.pos : d.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			r |= rune(c-'A') + 10
		default:
			return 0, d.errorf("invalid \\u escape")
		}
	}
	d.pos += 4
	return r, nil
}

// dictGet returns the value stored under key and whether the key is present.
func dictGet(d *jinja.Dict, key string) (jinja.Value, bool) { return d.Get(key) }

// newDict builds an ordered dict from alternating string keys and values.
func newDict(kvs ...any) *jinja.Dict {
	d := jinja.NewDict(len(kvs) / 2)
	for i := 0; i+1 < len(kvs); i += 2 {
		d.Set(kvs[i].(string), kvs[i+1].(jinja.Value))
	}
	return d
}

// dictSet sets key, appending it when absent.
func dictSet(d *jinja.Dict, key string, v jinja.Value) { d.Set(key, v) }
