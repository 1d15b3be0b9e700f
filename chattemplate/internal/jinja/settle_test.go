package jinja

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// unsettle clears every loop's settled mark: the template then runs every iteration.
func unsettle(body []stmt) {
	for _, s := range body {
		switch s := s.(type) {
		case *forStmt:
			s.settled = false
			unsettle(s.body)
		case *ifStmt:
			for _, b := range s.bodies {
				unsettle(b)
			}
			unsettle(s.els)
		case *setBlockStmt:
			unsettle(s.body)
		case *filterBlockStmt:
			unsettle(s.body)
		case *scopeStmt:
			unsettle(s.body)
		}
	}
}

// TestSettledLoops renders loops without output with and without stopping after their
// first quiet iteration, over conversations where the condition is decided at every
// position, and requires the same output or the same error, and the skip to happen
// only where the loop qualifies.
func TestSettledLoops(t *testing.T) {
	qwen3, err := os.ReadFile(filepath.Join("..", "..", "testdata", "templates", "qwen3.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	const scan = `{%- set ns = namespace(found=false, at=-1, n=0) %}` +
		`{%- for m in messages[::-1] %}%s{%- endfor %}{{ ns.found }} {{ ns.at }} {{ ns.n }}`
	tests := []struct {
		name    string
		src     string
		settles bool // some iterations are skipped on a conversation with a user message
	}{
		{"qwen3", string(qwen3), true},
		{"and-chain decided by the namespace", fmtLoop(scan, `{%- set i = (messages|length - 1) - loop.index0 %}{%- if not ns.found and m.role == "user" %}{%- set ns.found = true %}{%- set ns.at = i %}{%- endif %}`), true},
		{"or-chain decided by the namespace", fmtLoop(scan, `{%- if ns.found or m.role != "user" %}{%- else %}{%- set ns.found = true %}{%- endif %}`), true},
		{"the counter after the namespace decides", fmtLoop(scan, `{%- if not ns.found and loop.index0 > 2 %}{%- set ns.found = true %}{%- endif %}`), true},
		{"a condition on the counter", fmtLoop(scan, `{%- if loop.index0 > 2 and not ns.found %}{%- set ns.found = true %}{%- endif %}`), false},
		{"a condition on a set of the counter", fmtLoop(scan, `{%- set i = loop.index0 + 1 %}{%- if i > 3 and not ns.found %}{%- set ns.found = true %}{%- endif %}`), false},
		{"a set that can fail at another index", fmtLoop(scan, `{%- set x = 10 / (loop.index0 - 3) %}`), false},
		{"a set of the item", fmtLoop(scan, `{%- set r = m.content.upper() %}`), false},
		{"a set of outer values only", fmtLoop(scan, `{%- set r = ns.found ~ "x" %}`), true},
		{"a set that fails everywhere", fmtLoop(scan, `{%- set r = "a" - loop.index0 %}`), false},
		{"a count written every iteration", fmtLoop(scan, `{%- set ns.n = ns.n + 1 %}`), false},
		{"loop.last", fmtLoop(scan, `{%- if loop.last %}{%- set ns.at = loop.index0 %}{%- endif %}`), false},
		{"a macro call", `{%- macro f(x) %}{{ x }}{%- endmacro %}` + fmtLoop(scan, `{%- set r = f(1) %}`), false},
		{"an error after the found message", fmtLoop(scan, `{%- if not ns.found and m.role == "user" %}{%- set ns.found = true %}{%- endif %}{%- if m.content == "u0" %}{{ raise("boom") }}{%- endif %}`), false},
		{"a break", fmtLoop(scan, `{%- if m.role == "user" %}{%- break %}{%- endif %}`), false},
		{"loop.cycle", fmtLoop(scan, `{%- set c = loop.cycle("a", "b") %}`), false},
	}
	convs := [][]string{
		{}, {"u0"}, {"s0", "u0", "a0"}, {"s0", "u0", "a0", "u1", "a1", "u2"}, {"u0", "a0", "t0", "t1", "a1"},
		{"s0", "a0", "a1", "a2"}, {"u0", "u1", "u2", "u3", "u4", "u5", "u6"},
	}
	globals := map[string]Value{"raise": FuncValue(func(args []Value, _ []KwArg) (Value, error) {
		return Value{}, errors.New("raised")
	})}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			settled, err := Compile(tc.src, Options{TrimBlocks: true, LStripBlocks: true, Globals: globals})
			if err != nil {
				t.Fatal(err)
			}
			plain, err := Compile(tc.src, Options{TrimBlocks: true, LStripBlocks: true, Globals: globals})
			if err != nil {
				t.Fatal(err)
			}
			unsettle(plain.body)
			ms := messages{}
			skipped := 0
			for _, c := range convs {
				vars := MapVars{"messages": ms.list(c...), "add_generation_prompt": Bool(true)}
				got, stats, gotErr := settled.RenderCached(nil, vars, nil)
				want, _, wantErr := plain.RenderCached(nil, vars, nil)
				if string(got) != string(want) || (gotErr == nil) != (wantErr == nil) {
					t.Fatalf("%v: settled %q (%v), every iteration %q (%v)", c, got, gotErr, want, wantErr)
				}
				skipped += stats.Settled
			}
			if (skipped > 0) != tc.settles {
				t.Errorf("%d iterations skipped; want skipping: %v", skipped, tc.settles)
			}
		})
	}
}

// fmtLoop puts body in the loop of scan.
func fmtLoop(scan, body string) string {
	for i := 0; i+1 < len(scan); i++ {
		if scan[i] == '%' && scan[i+1] == 's' {
			return scan[:i] + body + scan[i+2:]
		}
	}
	return scan
}
