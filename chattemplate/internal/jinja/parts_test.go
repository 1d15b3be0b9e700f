package jinja

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// These table tests pin the engine's parts one at a time (lexer, parser, expression
// evaluation, filters, methods); jinja_test.go's goldens check them together against
// Python's Jinja2. Expected outputs are Jinja2 3.1's (checked with python3-jinja2 in
// transformers' environment; TestExpressionErrors' refusals are where this engine
// declines what Jinja2 renders).

// lexSummary prints lexer items compactly: text as a quoted string, tags as their
// tokens, e.g. `"a " {{x}} {%if y%}`.
func lexSummary(items []item) string {
	var parts []string
	for _, it := range items {
		switch it.kind {
		case itemText:
			parts = append(parts, fmt.Sprintf("%q", it.text))
		default:
			var toks []string
			for _, tk := range it.tokens {
				s := tk.s
				if tk.kind == tokString {
					s = fmt.Sprintf("%q", s)
				}
				toks = append(toks, s)
			}
			open, end := "{{", "}}"
			if it.kind == itemBlock {
				open, end = "{%", "%}"
			}
			parts = append(parts, open+strings.Join(toks, " ")+end)
		}
	}
	return strings.Join(parts, " ")
}

func TestLexer(t *testing.T) {
	tests := []struct {
		name          string
		src           string
		trim, lstrip  bool
		want, wantErr string
	}{
		{"text only", "hello", false, false, `"hello"`, ""},
		{"variable", "a {{ x }} b", false, false, `"a " {{x}} " b"`, ""},
		{"block tokens", "{% if x == 'y' %}", false, false, `{%if x == "y"%}`, ""},
		{"operators", "{{ a//b**c ~ d != e <= f }}", false, false, `{{a // b ** c ~ d != e <= f}}`, ""},
		{"numbers", "{{ 1 + 2.5 - 1e3 }}", false, false, `{{1 + 2.5 - 1e3}}`, ""},
		{"string escapes", `{{ "a\nb" ~ 'c\'d' }}`, false, false, `{{"a\nb" ~ "c'd"}}`, ""},
		{"comment dropped", "a{# note #}b", false, false, `"a" "b"`, ""},
		{"minus strips both sides", "a \n{{- x -}}\n b", false, false, `"a" {{x}} "b"`, ""},
		{"trim_blocks drops one newline", "{% if x %}\n\nA", true, false, `{%if x%} "\nA"`, ""},
		{"trim_blocks leaves variables", "{{ x }}\nA", true, false, `{{x}} "\nA"`, ""},
		{"lstrip_blocks strips indent", "a\n   {% if x %}", false, true, `"a\n" {%if x%}`, ""},
		{"lstrip_blocks keeps text before tag", "a  {% if x %}", false, true, `"a  " {%if x%}`, ""},
		{"plus disables lstrip", "\n  {%+ if x %}", false, true, `"\n  " {%if x%}`, ""},
		{"crlf normalised, trailing newline dropped", "a\r\nb\n", false, false, `"a\nb"`, ""},
		{"unterminated variable", "{{ x", false, false, "", "line 1"},
		{"unterminated comment", "a\n{# x", false, false, "", "missing end of comment tag"},
		{"unterminated string", "{{ 'abc }}", false, false, "", "line 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			items, err := lex(tt.src, tt.trim, tt.lstrip)
			if tt.wantErr != "" {
				var se *SyntaxError
				if !errors.As(err, &se) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want a SyntaxError containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := lexSummary(items); got != tt.want {
				t.Fatalf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestParser: what the parser accepts, rejects as Jinja2 would (SyntaxError, with the
// line), and refuses as outside the implemented subset (UnsupportedError naming the
// construct).
func TestParser(t *testing.T) {
	tests := []struct {
		name, src string
		syntax    string // substring of the SyntaxError, or ""
		refused   string // substring of the UnsupportedError's construct, or ""
	}{
		{"if elif else", "{% if a %}1{% elif b %}2{% else %}3{% endif %}", "", ""},
		{"for with filter and else", "{% for x in xs if x %}{{ loop.index }}{% else %}none{% endfor %}", "", ""},
		{"tuple target", "{% for k, v in d.items() %}{{ k }}{% endfor %}", "", ""},
		{"set namespace attr", "{% set ns = namespace(a=1) %}{% set ns.a = 2 %}", "", ""},
		{"block set with filter", "{% set x | upper %}a{% endset %}{{ x }}", "", ""},
		{"macro with defaults", "{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ m(1, b=3) }}", "", ""},
		{"filter block", "{% filter upper %}a{% endfilter %}", "", ""},
		{"generation tag", "{% generation %}a{% endgeneration %}", "", ""},
		{"break and continue", "{% for x in xs %}{% if x %}{% break %}{% endif %}{% continue %}{% endfor %}", "", ""},
		{"nested conditional", "{{ (a if b else c) ~ f(x if y else z) }}", "", ""},
		{"unclosed if", "{% if a %}x", "unexpected end of template", ""},
		{"endfor without for", "x\n{% endfor %}", "line 2", ""},
		{"missing expression", "{{ }}", "line 1", ""},
		{"unbalanced paren", "{{ (a }}", "line 1", ""},
		{"include", "{% include 'x' %}", "", "include"},
		{"extends", "{% extends 'x' %}", "", "extends"},
		{"call block", "{% call m() %}x{% endcall %}", "", "call"},
		{"unknown filter", "{{ x | wordwrap }}", "", "filter 'wordwrap'"},
		{"unknown test", "{{ x is escaped }}", "", "escaped"},
		{"recursive loop", "{% for x in xs recursive %}{% endfor %}", "", "recursive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile(tt.src, Options{TrimBlocks: true, LStripBlocks: true})
			var se *SyntaxError
			var ue *UnsupportedError
			switch {
			case tt.syntax != "":
				if !errors.As(err, &se) || !strings.Contains(err.Error(), tt.syntax) {
					t.Fatalf("err = %v, want a SyntaxError containing %q", err, tt.syntax)
				}
			case tt.refused != "":
				if !errors.As(err, &ue) || !strings.Contains(ue.Construct, tt.refused) {
					t.Fatalf("err = %v, want an UnsupportedError naming %q", err, tt.refused)
				}
			case err != nil:
				t.Fatalf("Compile: %v", err)
			}
		})
	}
}

// render compiles src and renders it with vars, for the expression and filter tables.
func render(t *testing.T, src string, vars MapVars) (string, error) {
	t.Helper()
	tmpl, err := Compile(src, Options{TrimBlocks: true, LStripBlocks: true})
	if err != nil {
		return "", err
	}
	return tmpl.Render(vars, 0)
}

func testVars() MapVars {
	d := NewDict(2)
	d.Set("b", Int(1))
	d.Set("a", Int(2))
	return MapVars{
		"i": Int(7), "f": Float(2.5), "s": String("héllo"), "n": None(),
		"xs": ListOf([]Value{Int(3), Int(1), Int(2)}), "d": DictValue(d),
	}
}

// TestExpressions: operators, precedence and Python value semantics.
func TestExpressions(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"1 + 2 * 3", "7"},
		{"(1 + 2) * 3", "9"},
		{"2 ** 3 ** 2", "64"}, // Jinja2's ** is left-associative, unlike Python's
		{"-2 ** 2", "4"},      // and binds looser than unary minus
		{"7 // 2 ~ ' ' ~ -7 // 2", "3 -4"},
		{"7 % 3 ~ ' ' ~ -7 % 3", "1 2"},
		{"1 / 2", "0.5"},
		{"4 / 2", "2.0"},
		{"i * f", "17.5"},
		{"0.1 + 0.2", "0.30000000000000004"},
		{"10 ** 20", "100000000000000000000"},
		{"1 < 2 < 3", "True"},
		{"1 < 3 < 2", "False"},
		{"'a' ~ 1 ~ none", "a1None"},
		{"'ll' in s", "True"},
		{"4 not in xs", "True"},
		{"n is none and not i is none", "True"},
		{"i if n else 'no'", "no"},
		{"0 or '' or 'x'", "x"},
		{"1 and 2", "2"},
		{"s[1]", "é"},
		{"s[::-1]", "olléh"},
		{"s[1:3]", "él"},
		{"xs[-1]", "2"},
		{"xs[10]", ""}, // out of range: Undefined, printed empty
		{"xs[1:]", "[1, 2]"},
		{"d['a'] + d.b", "3"},
		{"d.missing is defined", "False"},
		{"(1, 'a')", "(1, 'a')"},
		{"[1, 'a', none, true]", "[1, 'a', None, True]"},
		{"{'k': 1.0}", "{'k': 1.0}"},
		{"'%s-%d' % ('a', 3)", "a-3"},
		{"'{} {}'.format(1, 'b')", "1 b"},
		{"true == 1", "True"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := render(t, "{{ "+tt.expr+" }}", testVars())
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestExpressionErrors: what Jinja2 raises on, and what the engine refuses at render
// time instead of approximating.
func TestExpressionErrors(t *testing.T) {
	tests := []struct {
		expr      string
		undefined bool // an ErrUndefined error
		refused   bool // an UnsupportedError
	}{
		{"missing.attr", true, false},
		{"missing + 1", true, false},
		{"1 / 0", false, false},
		{"'a' + 1", false, false},
		{"'%5s' % 'a'", false, true},         // Jinja2 renders "    a": refused, not approximated
		{"'{:>5}'.format('a')", false, true}, // idem
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := render(t, "{{ "+tt.expr+" }}", testVars())
			if err == nil {
				t.Fatalf("rendered %q, want an error", got)
			}
			var ue *UnsupportedError
			if errors.Is(err, ErrUndefined) != tt.undefined || errors.As(err, &ue) != tt.refused {
				t.Fatalf("err = %v; want undefined=%v refused=%v", err, tt.undefined, tt.refused)
			}
		})
	}
}

func TestFilters(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"xs | length", "3"},
		{"s | upper", "HÉLLO"},
		{"'  a b  ' | trim", "a b"},
		{"'hello world' | title", "Hello World"},
		{"'hELLO' | capitalize", "Hello"},
		{"missing | default('x')", "x"},
		{"n | default('x')", "None"},
		{"n | default('x', true)", "x"},
		{"xs | first ~ xs | last", "32"},
		{"xs | join(',')", "3,1,2"},
		{"xs | sort | list", "[1, 2, 3]"},
		{"xs | sort(reverse=true) | join", "321"},
		{"xs | reverse | list", "[2, 1, 3]"},
		{"xs | min ~ xs | max ~ xs | sum", "136"},
		{"[1, 1, 2] | unique | list", "[1, 2]"},
		{"xs | map('string') | join('-')", "3-1-2"},
		{"xs | select('odd') | list", "[3, 1]"},
		{"xs | reject('odd') | list", "[2]"},
		{"d | items | list", "[('b', 1), ('a', 2)]"},
		{"d | dictsort | list", "[('a', 2), ('b', 1)]"},
		{"d | tojson", `{"b": 1, "a": 2}`},
		{"d | tojson(indent=2)", "{\n  \"b\": 1,\n  \"a\": 2\n}"},
		{"{'k': 'é'} | tojson(ensure_ascii=true)", `{"k": "\u00e9"}`},
		{"[1.0, -0.0, 1e-7] | tojson", "[1.0, -0.0, 1e-07]"},
		{"'a\nb' | indent(2)", "a\n  b"},
		{"'3' | int + '2.5' | float", "5.5"},
		{"-3 | abs", "3"},
		{"'a b c' | wordcount", "3"},
		{"'aXbX' | replace('X', '-')", "a-b-"},
		{"'%s=%s' | format('k', 1)", "k=1"},
		{"1 | string ~ 2", "12"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := render(t, "{{ "+tt.expr+" }}", testVars())
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestMethods(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"'a,b,,c'.split(',')", "['a', 'b', '', 'c']"},
		{"' a  b '.split()", "['a', 'b']"},
		{"'a,b,c'.rsplit(',', 1)", "['a,b', 'c']"},
		{"'</think>x'.split('</think>')[-1].lstrip('\\n')", "x"},
		{"'xxhixx'.strip('x')", "hi"},
		{"s.startswith('hé') and s.endswith(('lo', 'q'))", "True"},
		{"s.find('l') ~ s.rfind('l') ~ s.find('z')", "23-1"},
		{"'a\\nb\\r\\nc'.splitlines()", "['a', 'b', 'c']"},
		{"'pre-x'.removeprefix('pre-')", "x"},
		{"'12'.isdigit() ~ 'a1'.isalpha()", "TrueFalse"},
		{"d.get('zz', 0) ~ d.keys() | list | join", "0ba"},
		{"xs.index(2) ~ xs.count(3)", "21"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := render(t, "{{ "+tt.expr+" }}", testVars())
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	// The immutable sandbox: mutating methods fail.
	for _, expr := range []string{"xs.append(1)", "d.update({'c': 3})", "d.pop('a')"} {
		if got, err := render(t, "{{ "+expr+" }}", testVars()); err == nil {
			t.Errorf("%s rendered %q, want an error", expr, got)
		}
	}
}
