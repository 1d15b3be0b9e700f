package chattemplate

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

func TestPyFloatRepr(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{1, "1.0"}, {0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1e-07, "1e-07"},
		{0.0001, "0.0001"}, {0.00001, "1e-05"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
		{123456789.123456789, "123456789.12345679"}, {1.5e300, "1.5e+300"}, {-2.5e-10, "-2.5e-10"},
		{0.1, "0.1"}, {2.5, "2.5"}, {100000, "100000.0"}, {1e22, "1e+22"}, {5e-324, "5e-324"},
		{math.MaxFloat64, "1.7976931348623157e+308"}, {9999999999999998, "9999999999999998.0"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := pyFloatRepr(tt.in); got != tt.want {
				t.Fatalf("pyFloatRepr(%v) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	for in, want := range map[float64]string{math.Inf(1): "Infinity", math.Inf(-1): "-Infinity"} {
		if got := pyFloatJSON(in); got != want {
			t.Errorf("pyFloatJSON(%v) = %q, want %q", in, got, want)
		}
	}
	if got := pyFloatJSON(math.NaN()); got != "NaN" {
		t.Errorf("NaN: %q", got)
	}
}

func TestWritePyString(t *testing.T) {
	tests := []struct {
		name, in, want, wantASCII string
	}{
		{"plain", "abc", `"abc"`, `"abc"`},
		{"escapes", "q\"b\\n\n\r\t\b\f", `"q\"b\\n\n\r\t\b\f"`, `"q\"b\\n\n\r\t\b\f"`},
		{"controls", "\x00\x01\x1f", `"\u0000\u0001\u001f"`, `"\u0000\u0001\u001f"`},
		{"del and html", "\x7f</script>&'", "\"\x7f</script>&'\"", `"\u007f</script>&'"`},
		{"non-ascii", "é→😀\u2028", "\"é→😀\u2028\"", `"\u00e9\u2192\ud83d\ude00\u2028"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			writePyString(&b, tt.in, false)
			if b.String() != tt.want {
				t.Errorf("ensure_ascii=False: got %s want %s", b.String(), tt.want)
			}
			b.Reset()
			writePyString(&b, tt.in, true)
			if b.String() != tt.wantASCII {
				t.Errorf("ensure_ascii=True: got %s want %s", b.String(), tt.wantASCII)
			}
		})
	}
}

func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string // pyDumps of the value, or "" for an error
	}{
		{"order kept", `{"b":1,"a":2}`, `{"b": 1, "a": 2}`},
		{"duplicate keeps first position, last value", `{"a":1,"b":2,"a":3}`, `{"a": 3, "b": 2}`},
		{"int vs float", `[1, 1.0, -0, -0.0, 1e5, 1E-7, 2.50]`, `[1, 1.0, 0, -0.0, 100000.0, 1e-07, 2.5]`},
		{"big ints", `[12345678901234567890123, -98765432109876543210]`, `[12345678901234567890123, -98765432109876543210]`},
		{"overflowing float is infinite", `1e400`, `Infinity`},
		{"escapes and pairs", `"\u00e9\ud83d\ude00\n\/"`, "\"é😀\\n/\""},
		{"literals", `[true,false,null]`, `[true, false, null]`},
		{"whitespace", " \t\n{ \"a\" : [ ] , \"b\" : { } }\r\n", `{"a": [], "b": {}}`},
		{"lone high surrogate", `"\ud800"`, ""},
		{"lone low surrogate", `"\udc00x"`, ""},
		{"invalid utf-8", "\"\xff\"", ""},
		{"raw control char", "\"a\nb\"", ""},
		{"leading zero", `01`, ""},
		{"trailing comma", `[1,]`, ""},
		{"trailing data", `{} x`, ""},
		{"nan literal", `NaN`, ""},
		{"unterminated", `{"a":`, ""},
		{"too deep", strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := decodeJSON([]byte(tt.in))
			if tt.want == "" {
				if !errors.Is(err, errJSON) {
					t.Fatalf("want a JSON error, got %v (%v)", err, v)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := jinja.Dumps(v, jinja.DefaultDumpOptions())
			if err != nil || got != tt.want {
				t.Fatalf("got %s (%v), want %s", got, err, tt.want)
			}
		})
	}
}

func TestStrftime(t *testing.T) {
	ts := time.Date(2026, 1, 5, 14, 7, 9, 123456000, time.UTC)
	tests := []struct{ format, want string }{
		{"%d %b %Y", "05 Jan 2026"},
		{"%-d %B %Y", "5 January 2026"},
		{"%Y-%m-%d %H:%M:%S", "2026-01-05 14:07:09"},
		{"%a %A %j %I%p %y %e", "Mon Monday 005 02PM 26  5"},
		{"%F %T %f %%", "2026-01-05 14:07:09 123456 %"},
		{"%Q stays", "%Q stays"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			if got := strftime(ts, tt.format); got != tt.want {
				t.Fatalf("got %q want %q", got, tt.want)
			}
		})
	}
}

func TestRewriteConditionals(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"top level untouched", `{{ a if b else c }}`, `{{ a if b else c }}`},
		{"text untouched", `x (a if b else c) y`, `x (a if b else c) y`},
		{"parenthesised", `{{ (a if b else c) }}`, `{{ (((b) and [a] or [c])[0]) }}`},
		{"no else", `{{ (a if b) }}`, `{{ (((b) and [a] or [none])[0]) }}`},
		{"call argument", `{{ f(x, a if b else c) }}`, `{{ f(x, ((b) and [a] or [c])[0]) }}`},
		{"string kept", `{{ ('a if b else c' if x else 'y') }}`, `{{ (((x) and ['a if b else c'] or ['y'])[0]) }}`},
		{"if statement untouched", `{% if a %}{% for m in ms if m %}{% endfor %}{% endif %}`, `{% if a %}{% for m in ms if m %}{% endfor %}{% endif %}`},
		{"comment untouched", `{# (a if b else c) #}`, `{# (a if b else c) #}`},
		{"chained", `{{ (a if b else c if d else e) }}`, `{{ (((b) and [a] or [((d) and [c] or [e])[0]])[0]) }}`},
		{"unterminated tag", `{{ (a if b`, `{{ (a if b`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rewriteConditionals(tt.in); got != tt.want {
				t.Fatalf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// FuzzRewriteConditionals: the rewriter never panics, and leaves text without " if "
// unchanged.
func FuzzRewriteConditionals(f *testing.F) {
	for _, s := range []string{`{{ (a if b else c) }}`, `{% set x = [1 if y, {'k': (z if w else "v")}] %}`, `{{ ('`, `{# {{ #}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		out := rewriteConditionals(src)
		if !strings.Contains(src, " if ") && !strings.Contains(src, "(if") && out != src {
			t.Fatalf("changed a template without conditionals: %q -> %q", src, out)
		}
	})
}
