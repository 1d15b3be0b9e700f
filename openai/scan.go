package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// A small strict JSON scanner: Parse needs only the spans of the top-level members, so it
// validates the whole body in one pass (RFC 8259 grammar; UTF-8 is checked before) and
// decodes just the few scalar fields routing reads. encoding/json would decode the body
// twice over and copy every raw member.

const maxDepth = 10000 // as encoding/json

var errSyntax = errors.New("invalid JSON")

func syntaxErr(i int, what string) error {
	return fmt.Errorf("%w at offset %d: %s", errSyntax, i, what)
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(d []byte, i int) int {
	for i < len(d) && isWS(d[i]) {
		i++
	}
	return i
}

// member is one top-level "key": value pair; raw is the value's exact bytes.
type member struct {
	key []byte // decoded; a slice of the input unless the key has escapes
	raw []byte
	// start is raw's offset in the object's bytes.
	start int
	// delimited: raw is a list that was only delimited (ValueEnd), not validated.
	delimited bool
}

// objectMembers validates d as one JSON object (surrounding whitespace allowed) and
// appends its members in order to dst. Keys are decoded; values are left raw. A member
// named delimitKey (none when "") whose value is a list is delimited by ValueEnd
// instead of validated: the caller validates it, or leaves that to whoever decodes it
// (see Parse).
func objectMembers(dst []member, d []byte, delimitKey string) ([]member, error) {
	i := skipWS(d, 0)
	if i == len(d) || d[i] != '{' {
		return nil, syntaxErr(i, "body is not a JSON object")
	}
	members := dst
	i = skipWS(d, i+1)
	if i < len(d) && d[i] == '}' {
		i++
	} else {
		for {
			if i == len(d) || d[i] != '"' {
				return nil, syntaxErr(i, "want a key")
			}
			ke, err := skipString(d, i)
			if err != nil {
				return nil, err
			}
			key, err := decodeKey(d[i:ke])
			if err != nil {
				return nil, err
			}
			i = skipWS(d, ke)
			if i == len(d) || d[i] != ':' {
				return nil, syntaxErr(i, "want ':'")
			}
			i = skipWS(d, i+1)
			delimited := delimitKey != "" && i < len(d) && d[i] == '[' && string(key) == delimitKey
			var ve int
			if delimited {
				end, ok := ValueEnd(d, i)
				if !ok {
					return nil, syntaxErr(i, "unterminated list")
				}
				ve = end
			} else if ve, err = skipValue(d, i, 1); err != nil {
				return nil, err
			}
			members = append(members, member{key: key, raw: d[i:ve], start: i, delimited: delimited})
			i = skipWS(d, ve)
			if i == len(d) {
				return nil, syntaxErr(i, "unterminated object")
			}
			if d[i] == '}' {
				i++
				break
			}
			if d[i] != ',' {
				return nil, syntaxErr(i, "want ',' or '}'")
			}
			i = skipWS(d, i+1)
		}
	}
	if i = skipWS(d, i); i != len(d) {
		return nil, syntaxErr(i, "data after the object")
	}
	return members, nil
}

// skipValue returns the end of the JSON value starting at d[i].
func skipValue(d []byte, i, depth int) (int, error) {
	if i >= len(d) {
		return i, syntaxErr(i, "unexpected end")
	}
	switch c := d[i]; {
	case c == '"':
		return skipString(d, i)
	case c == '{', c == '[':
		if depth >= maxDepth {
			return i, syntaxErr(i, "nested too deeply")
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipWS(d, i+1)
		if i < len(d) && d[i] == closer {
			return i + 1, nil
		}
		for {
			if c == '{' {
				if i >= len(d) || d[i] != '"' {
					return i, syntaxErr(i, "want a key")
				}
				e, err := skipString(d, i)
				if err != nil {
					return e, err
				}
				i = skipWS(d, e)
				if i >= len(d) || d[i] != ':' {
					return i, syntaxErr(i, "want ':'")
				}
				i = skipWS(d, i+1)
			}
			e, err := skipValue(d, i, depth+1)
			if err != nil {
				return e, err
			}
			i = skipWS(d, e)
			if i >= len(d) {
				return i, syntaxErr(i, "unterminated container")
			}
			if d[i] == closer {
				return i + 1, nil
			}
			if d[i] != ',' {
				return i, syntaxErr(i, "want ',' or a closing bracket")
			}
			i = skipWS(d, i+1)
		}
	case c == 't':
		return skipLiteral(d, i, "true")
	case c == 'f':
		return skipLiteral(d, i, "false")
	case c == 'n':
		return skipLiteral(d, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return skipNumber(d, i)
	default:
		return i, syntaxErr(i, "unexpected character")
	}
}

// ValueEnd returns the end of the JSON value starting at b[i], tracking only strings
// and nesting: it does not validate the value (its decoder does, or Parse's scanner).
// ok is false when the value does not end within b. A string's closing quote is found
// with IndexByte, so a long message text costs about a memory scan, several times less
// than validating it (see Request.Messages).
func ValueEnd(b []byte, i int) (end int, ok bool) {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			end, ok := stringEnd(b, i+1)
			if !ok {
				return 0, false
			}
			i = end
			if depth == 0 {
				return i, true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth < 0 {
				return 0, false
			}
			if depth == 0 {
				return i + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, true
			}
		}
		i++
	}
	return i, depth == 0
}

// stringEnd returns the index after the closing quote of a JSON string whose body
// starts at i (not validated).
func stringEnd(b []byte, i int) (int, bool) {
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return 0, false
		}
		q += i
		n := 0 // backslashes before the quote
		for j := q - 1; j >= i && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		i = q + 1
	}
}

func skipLiteral(d []byte, i int, lit string) (int, error) {
	if len(d)-i < len(lit) || string(d[i:i+len(lit)]) != lit {
		return i, syntaxErr(i, "bad literal")
	}
	return i + len(lit), nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func skipNumber(d []byte, i int) (int, error) {
	start := i
	if d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		return i, syntaxErr(start, "bad number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || !isDigit(d[i]) {
			return i, syntaxErr(start, "bad number")
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			return i, syntaxErr(start, "bad number")
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	return i, nil
}

func isHex(c byte) bool {
	return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// skipString returns the end of the string starting at d[i] == '"'.
func skipString(d []byte, i int) (int, error) {
	start := i
	i++
	for i < len(d) {
		// Fast path: skip 8 plain bytes at a time (no '"', '\\' or control character).
		for i+8 <= len(d) && !specialIn8(binary.LittleEndian.Uint64(d[i:])) {
			i += 8
		}
		if i == len(d) {
			break
		}
		c := d[i]
		switch {
		case c == '"':
			return i + 1, nil
		case c == '\\':
			if i+1 >= len(d) {
				return i, syntaxErr(start, "unterminated string")
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+5 >= len(d) || !isHex(d[i+2]) || !isHex(d[i+3]) || !isHex(d[i+4]) || !isHex(d[i+5]) {
					return i, syntaxErr(i, "bad \\u escape")
				}
				i += 6
			default:
				return i, syntaxErr(i, "bad escape")
			}
		case c < 0x20:
			return i, syntaxErr(i, "control character in string")
		default:
			i++
		}
	}
	return i, syntaxErr(start, "unterminated string")
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// specialIn8 reports whether any of the 8 bytes in w is '"', '\\' or below 0x20, the bytes
// that end the plain run of a JSON string. SWAR: hasZero(x) is non-zero exactly when some
// byte of x is zero, and hasLess(w, 0x20) exactly when some byte is below 0x20 (both may
// flag extra bytes above a true one, which only matters for finding which byte; the
// caller then steps bytewise).
func specialIn8(w uint64) bool {
	hasZero := func(x uint64) uint64 { return (x - ones) & ^x & highs }
	less20 := (w - 0x20*ones) & ^w & highs
	return hasZero(w^('"'*ones))|hasZero(w^('\\'*ones))|less20 != 0
}

// decodeKey decodes a validated JSON string token (quotes included) into bytes: the
// token's own bytes when it has no escapes (no allocation), else a copy.
func decodeKey(tok []byte) ([]byte, error) {
	body := tok[1 : len(tok)-1]
	if bytes.IndexByte(body, '\\') < 0 {
		return body, nil
	}
	s, err := decodeString(tok)
	return []byte(s), err
}

// decodeString decodes a validated JSON string token (quotes included).
func decodeString(tok []byte) (string, error) {
	plain := true
	for _, c := range tok[1 : len(tok)-1] {
		if c == '\\' {
			plain = false
			break
		}
	}
	if plain {
		return string(tok[1 : len(tok)-1]), nil
	}
	var s string
	if err := json.Unmarshal(tok, &s); err != nil {
		return "", err
	}
	return s, nil
}

// asString decodes raw as a JSON string.
func asString(raw []byte) (string, error) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", errors.New("want a string")
	}
	return decodeString(raw)
}

// asBool decodes raw as a JSON boolean.
func asBool(raw []byte) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, errors.New("want a boolean")
}
