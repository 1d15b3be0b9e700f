package jinja

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The lexer follows Jinja2's (lexer.py): text, {{ variable }}, {% block %} and
// {# comment #} tags with '-' and '+' whitespace control, trim_blocks (drop the
// first newline after a block or comment tag), lstrip_blocks (drop the spaces before
// a block or comment tag that starts a line), newlines normalised to "\n" and a
// single trailing newline dropped (keep_trailing_newline=False).

type tokKind uint8

const (
	tokName tokKind = iota + 1
	tokString
	tokInt
	tokFloat
	tokOp
)

type token struct {
	kind tokKind
	s    string // name, operator, decoded string, number text
	line int
}

type itemKind uint8

const (
	itemText itemKind = iota + 1
	itemVar
	itemBlock
)

// item is a piece of template: text, or the tokens of one tag.
type item struct {
	kind   itemKind
	text   string
	tokens []token
	line   int
}

type lexer struct {
	src          string
	pos          int
	line         int
	trimBlocks   bool
	lstripBlocks bool
	lineStarting bool
	items        []item
}

// normalizeSource applies Jinja2's newline handling to a template source.
func normalizeSource(src string) string {
	if strings.IndexByte(src, '\r') >= 0 {
		src = strings.ReplaceAll(src, "\r\n", "\n")
		src = strings.ReplaceAll(src, "\r", "\n")
	}
	return strings.TrimSuffix(src, "\n")
}

func lex(src string, trimBlocks, lstripBlocks bool) ([]item, error) {
	l := &lexer{src: normalizeSource(src), line: 1, trimBlocks: trimBlocks, lstripBlocks: lstripBlocks, lineStarting: true}
	for l.pos < len(l.src) {
		if err := l.next(); err != nil {
			return nil, err
		}
	}
	return l.items, nil
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

func (l *lexer) addText(s string) {
	if s != "" {
		l.items = append(l.items, item{kind: itemText, text: s, line: l.line})
	}
	l.line += strings.Count(s, "\n")
}

func (l *lexer) next() error {
	rest := l.src[l.pos:]
	start := -1
	for i := 0; i+1 < len(rest); i++ {
		if rest[i] == '{' && (rest[i+1] == '{' || rest[i+1] == '%' || rest[i+1] == '#') {
			start = i
			break
		}
	}
	if start < 0 {
		l.addText(rest)
		l.pos = len(l.src)
		return nil
	}
	text := rest[:start]
	opener := rest[start+1]
	after := start + 2
	sign := byte(0)
	if after < len(rest) && (rest[after] == '-' || rest[after] == '+') {
		sign = rest[after]
		after++
	}
	switch {
	case sign == '-':
		stripped := strings.TrimRightFunc(text, pyIsSpace)
		l.line += strings.Count(text[len(stripped):], "\n")
		text = stripped
	case sign != '+' && l.lstripBlocks && opener != '{':
		lpos := strings.LastIndexByte(text, '\n') + 1
		if lpos > 0 || l.lineStarting {
			tail := text[lpos:]
			if tail != "" && strings.TrimLeftFunc(tail, pyIsSpace) == "" {
				text = text[:lpos]
			}
		}
	}
	l.addText(text)
	l.pos += after
	switch opener {
	case '#':
		return l.comment()
	case '{':
		return l.tag(itemVar, "}}")
	}
	return l.tag(itemBlock, "%}")
}

func (l *lexer) comment() error {
	rest := l.src[l.pos:]
	i := strings.Index(rest, "#}")
	if i < 0 {
		return l.errorf("missing end of comment tag")
	}
	end := i + 2
	switch {
	case i > 0 && rest[i-1] == '-':
		end = i + 2 + len(rest[i+2:]) - len(strings.TrimLeftFunc(rest[i+2:], pyIsSpace))
	case i > 0 && rest[i-1] == '+':
	case l.trimBlocks && end < len(rest) && rest[end] == '\n':
		end++
	}
	l.line += strings.Count(rest[:end], "\n")
	l.lineStarting = end > 0 && rest[end-1] == '\n'
	l.pos += end
	return nil
}

func (l *lexer) errorf(format string, args ...any) error {
	return &SyntaxError{Line: l.line, Msg: sprintf(format, args...)}
}

// tag reads the tokens of a {{ }} or {% %} tag up to its closer.
func (l *lexer) tag(kind itemKind, closer string) error {
	it := item{kind: kind, line: l.line}
	var balance []byte
	for {
		if l.pos >= len(l.src) {
			return l.errorf("unexpected end of template, expected '%s'", closer)
		}
		rest := l.src[l.pos:]
		if len(balance) == 0 {
			// End rules, tried before any other token.
			n := 0
			switch {
			case strings.HasPrefix(rest, "-"+closer):
				n = 1 + len(closer)
				n += len(rest[n:]) - len(strings.TrimLeftFunc(rest[n:], pyIsSpace))
			case kind == itemBlock && strings.HasPrefix(rest, "+"+closer):
				n = 1 + len(closer)
			case strings.HasPrefix(rest, closer):
				n = len(closer)
				if kind == itemBlock && l.trimBlocks && n < len(rest) && rest[n] == '\n' {
					n++
				}
			}
			if n > 0 {
				l.line += strings.Count(rest[:n], "\n")
				l.lineStarting = rest[n-1] == '\n'
				l.pos += n
				l.items = append(l.items, it)
				return nil
			}
		}
		c := rest[0]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			if c == '\n' {
				l.line++
			}
			l.pos++
		case c >= '0' && c <= '9':
			tok, n, err := lexNumber(rest, l.pos > 0 && l.src[l.pos-1] == '.')
			if err != nil {
				return l.errorf("%v", err)
			}
			tok.line = l.line
			it.tokens = append(it.tokens, tok)
			l.pos += n
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= utf8.RuneSelf:
			n := 0
			for n < len(rest) {
				r, size := utf8.DecodeRuneInString(rest[n:])
				if r == '_' || r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') ||
					r >= utf8.RuneSelf && (unicode.IsLetter(r) || (n > 0 && (unicode.IsDigit(r) || unicode.Is(unicode.Mn, r)))) {
					n += size
					continue
				}
				break
			}
			if n == 0 {
				return l.errorf("unexpected char %q", rest[:1])
			}
			it.tokens = append(it.tokens, token{kind: tokName, s: rest[:n], line: l.line})
			l.pos += n
		case c == '\'' || c == '"':
			s, n, err := lexString(rest)
			if err != nil {
				return l.errorf("%v", err)
			}
			it.tokens = append(it.tokens, token{kind: tokString, s: s, line: l.line})
			l.line += strings.Count(rest[:n], "\n")
			l.pos += n
		default:
			op := ""
			for _, cand := range operators {
				if strings.HasPrefix(rest, cand) {
					op = cand
					break
				}
			}
			if op == "" {
				return l.errorf("unexpected char %q", rest[:1])
			}
			switch op {
			case "{":
				balance = append(balance, '}')
			case "(":
				balance = append(balance, ')')
			case "[":
				balance = append(balance, ']')
			case "}", ")", "]":
				if len(balance) == 0 || balance[len(balance)-1] != op[0] {
					return l.errorf("unexpected '%s'", op)
				}
				balance = balance[:len(balance)-1]
			}
			it.tokens = append(it.tokens, token{kind: tokOp, s: op, line: l.line})
			l.pos += len(op)
		}
	}
}

// operators, longest first.
var operators = []string{
	"//", "**", "==", "!=", ">=", "<=",
	"+", "-", "/", "*", "%", "~", "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";",
}

// lexNumber reads an integer or float literal (Python syntax with '_' separators).
func lexNumber(s string, afterDot bool) (token, int, error) {
	digits := func(i int) int {
		j := i
		for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '_' && j > i && j+1 < len(s) && s[j+1] >= '0' && s[j+1] <= '9') {
			j++
		}
		return j
	}
	if len(s) > 1 && s[0] == '0' && strings.ContainsRune("xXoObB", rune(s[1])) {
		return token{}, 0, unsupportedf("non-decimal integer literals")
	}
	end := digits(0)
	isFloat := false
	if !afterDot {
		j := end
		if j+1 < len(s) && s[j] == '.' && s[j+1] >= '0' && s[j+1] <= '9' {
			j = digits(j + 1)
			isFloat = true
		}
		if j < len(s) && (s[j] == 'e' || s[j] == 'E') {
			k := j + 1
			if k < len(s) && (s[k] == '+' || s[k] == '-') {
				k++
			}
			if k < len(s) && s[k] >= '0' && s[k] <= '9' {
				j = digits(k)
				isFloat = true
			}
		}
		if isFloat {
			end = j
		}
	}
	text := strings.ReplaceAll(s[:end], "_", "")
	if isFloat {
		return token{kind: tokFloat, s: text}, end, nil
	}
	if len(text) > 1 && strings.TrimLeft(text, "0") != "" && text[0] == '0' {
		return token{}, 0, errorf("leading zeros in decimal integer literals are not permitted")
	}
	return token{kind: tokInt, s: text}, end, nil
}

// lexString reads a quoted string literal and decodes its escapes as Python's
// unicode-escape codec does. It returns the decoded value and the literal's length.
func lexString(s string) (string, int, error) {
	q := s[0]
	i := 1
	for i < len(s) && s[i] != q {
		if s[i] == '\\' {
			i++
		}
		i++
	}
	if i >= len(s) {
		return "", 0, errorf("unexpected end of string")
	}
	raw := s[1:i]
	if strings.IndexByte(raw, '\\') < 0 {
		return raw, i + 1, nil
	}
	var b strings.Builder
	for j := 0; j < len(raw); j++ {
		c := raw[j]
		if c != '\\' || j+1 >= len(raw) {
			b.WriteByte(c)
			continue
		}
		j++
		switch e := raw[j]; e {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'a':
			b.WriteByte(7)
		case 'b':
			b.WriteByte(8)
		case 'f':
			b.WriteByte(12)
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte(11)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			k := j
			for k < len(raw) && k < j+3 && raw[k] >= '0' && raw[k] <= '7' {
				k++
			}
			n, _ := strconv.ParseUint(raw[j:k], 8, 32)
			b.WriteRune(rune(n))
			j = k - 1
		case 'x', 'u', 'U':
			width := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if j+1+width > len(raw) {
				return "", 0, errorf("truncated \\%c escape", e)
			}
			n, err := strconv.ParseUint(raw[j+1:j+1+width], 16, 32)
			if err != nil || n > unicode.MaxRune || (n >= 0xD800 && n < 0xE000) {
				return "", 0, errorf("invalid \\%c escape", e)
			}
			b.WriteRune(rune(n))
			j += width
		case 'N':
			return "", 0, unsupportedf("\\N{...} escapes")
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String(), i + 1, nil
}
