package chattemplate

import "strings"

// gonja parses a conditional expression (X if C else Y) only at the top of a tag, not
// inside parentheses, brackets, braces or call arguments, where chat templates use it
// (Gemma 3: '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "")).
// rewriteConditionals rewrites each nested one into an equivalent expression gonja
// parses:
//
//	X if C else Y  ->  ((C) and [X] or [Y])[0]
//	X if C         ->  ((C) and [X] or [none])[0]
//
// Wrapping X in a one-element list makes the `and` operand truthy even when X is
// falsy, so the result is X exactly when C is true, as Jinja2 evaluates it. Text
// outside {{ }} and {% %} tags, string literals and top-level conditionals (which gonja
// handles) are left as they are.
func rewriteConditionals(src string) string {
	if !strings.Contains(src, " if ") && !strings.Contains(src, "(if") {
		return src
	}
	var out strings.Builder
	i := 0
	for i < len(src) {
		start := strings.IndexByte(src[i:], '{')
		if start < 0 || i+start+1 >= len(src) {
			out.WriteString(src[i:])
			break
		}
		start += i
		var closer string
		switch src[start+1] {
		case '{':
			closer = "}}"
		case '%':
			closer = "%}"
		case '#':
			end := strings.Index(src[start+2:], "#}")
			if end < 0 {
				out.WriteString(src[i:])
				return out.String()
			}
			end += start + 4
			out.WriteString(src[i:end])
			i = end
			continue
		default:
			out.WriteString(src[i : start+1])
			i = start + 1
			continue
		}
		end := tagEnd(src, start+2, closer)
		if end < 0 {
			out.WriteString(src[i:])
			break
		}
		out.WriteString(src[i : start+2])
		out.WriteString(rewriteTag(src[start+2 : end]))
		i = end
	}
	return out.String()
}

// tagEnd finds the closer of a tag body starting at i, skipping string literals.
func tagEnd(s string, i int, closer string) int {
	for i < len(s) {
		switch c := s[i]; {
		case c == '\'' || c == '"':
			i = stringEnd(s, i)
		case strings.HasPrefix(s[i:], closer):
			return i
		default:
			i++
		}
	}
	return -1
}

// stringEnd returns the index after the string literal starting at i.
func stringEnd(s string, i int) int {
	q := s[i]
	i++
	for i < len(s) {
		switch s[i] {
		case '\\':
			i += 2
			continue
		case q:
			return i + 1
		}
		i++
	}
	return len(s)
}

// rewriteTag rewrites the nested conditionals of one tag body.
func rewriteTag(body string) string {
	var out strings.Builder
	for i := 0; i < len(body); {
		switch c := body[i]; c {
		case '\'', '"':
			j := stringEnd(body, i)
			out.WriteString(body[i:j])
			i = j
		case '(', '[', '{':
			group, j := rewriteGroup(body, i)
			out.WriteString(group)
			i = j
		default:
			out.WriteByte(c)
			i++
		}
	}
	return out.String()
}

// rewriteGroup rewrites the bracket group opening at i and returns it with the index
// after its closing bracket. Segments (between commas, and colons in [ ] and { }) that
// hold a top-level `if` are rewritten.
func rewriteGroup(s string, i int) (string, int) {
	open := s[i]
	closeCh := map[byte]byte{'(': ')', '[': ']', '{': '}'}[open]
	var out, seg strings.Builder
	out.WriteByte(open)
	flush := func() {
		out.WriteString(rewriteSegment(seg.String()))
		seg.Reset()
	}
	i++
	for i < len(s) {
		c := s[i]
		switch {
		case c == '\'' || c == '"':
			j := stringEnd(s, i)
			seg.WriteString(s[i:j])
			i = j
		case c == '(' || c == '[' || c == '{':
			g, j := rewriteGroup(s, i)
			seg.WriteString(g)
			i = j
		case c == closeCh:
			flush()
			out.WriteByte(c)
			return out.String(), i + 1
		case c == ',' || (c == ':' && open != '('):
			flush()
			out.WriteByte(c)
			i++
		default:
			seg.WriteByte(c)
			i++
		}
	}
	flush() // unbalanced: leave the rest for the parser to report
	return out.String(), i
}

// rewriteSegment rewrites "X if C else Y" (nested groups already rewritten and string
// literals intact) into the list-and-index form; other segments are returned as is.
func rewriteSegment(seg string) string {
	ifAt, elseAt := -1, -1
	for i := 0; i < len(seg); {
		switch c := seg[i]; {
		case c == '\'' || c == '"':
			i = stringEnd(seg, i)
			continue
		case c == '(' || c == '[' || c == '{':
			i = groupEnd(seg, i)
			continue
		case isIdentByte(c):
			j := i
			for j < len(seg) && isIdentByte(seg[j]) {
				j++
			}
			switch word := seg[i:j]; {
			case word == "if" && ifAt < 0 && strings.TrimSpace(seg[:i]) != "":
				ifAt = i
			case word == "else" && ifAt >= 0 && elseAt < 0:
				elseAt = i
			}
			i = j
			continue
		}
		i++
	}
	if ifAt < 0 {
		return seg
	}
	x := strings.TrimSpace(seg[:ifAt])
	cond := seg[ifAt+2:]
	y := "none"
	if elseAt >= 0 {
		cond = seg[ifAt+2 : elseAt]
		y = rewriteSegment(strings.TrimSpace(seg[elseAt+4:])) // chained: a if b else c if d else e
	}
	lead := seg[:len(seg)-len(strings.TrimLeft(seg, " \t\r\n"))]
	trail := seg[len(strings.TrimRight(seg, " \t\r\n")):]
	return lead + "((" + strings.TrimSpace(cond) + ") and [" + x + "] or [" + y + "])[0]" + trail
}

// groupEnd returns the index after the bracket group opening at i.
func groupEnd(s string, i int) int {
	depth := 0
	for i < len(s) {
		switch c := s[i]; c {
		case '\'', '"':
			i = stringEnd(s, i)
			continue
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
		i++
	}
	return len(s)
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
