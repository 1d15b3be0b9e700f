package chattemplate

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

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
