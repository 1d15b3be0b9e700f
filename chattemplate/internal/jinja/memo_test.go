package jinja

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// mapIterations is an IterationCache over a map, keeping every iteration.
type mapIterations struct {
	mu sync.Mutex
	m  map[iterKey]*Iteration
}

type iterKey struct {
	item *Dict
	key  IterationKey
}

func (c *mapIterations) Iteration(item *Dict, key IterationKey) *Iteration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[iterKey{item, key}]
}

func (c *mapIterations) StoreIteration(item *Dict, key IterationKey, it *Iteration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[iterKey{item, key}] = it
}

// messages is a pool of message dicts by name ("u1" is {"role": "user", "content":
// "u1"}; the role comes from the first letter: u user, a assistant, t tool, s
// system), each built once so that a message has one identity across renders, as the
// message cache gives it.
type messages map[string]Value

func (ms messages) list(names ...string) Value {
	items := make([]Value, len(names))
	for i, n := range names {
		v, ok := ms[n]
		if !ok {
			role := map[byte]string{'u': "user", 'a': "assistant", 't': "tool", 's': "system"}[n[0]]
			d := NewDict(2)
			d.Set("role", String(role))
			d.Set("content", String(n))
			v = DictValue(d)
			ms[n] = v
		}
		items[i] = v
	}
	return ListOf(items)
}

// TestRenderCached renders sequences of conversations with an iteration cache and
// requires every render to equal the uncached render, and the iterations reused to
// be those whose inputs did not change.
func TestRenderCached(t *testing.T) {
	type render struct {
		msgs   []string
		vars   MapVars // besides messages
		reused int
	}
	tests := []struct {
		name    string
		src     string
		renders []render
	}{
		{"earlier messages reused", `{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}},
			{msgs: []string{"u1", "a1", "u2"}, reused: 2},
			{msgs: []string{"u1", "a1", "u2", "a2", "u3"}, reused: 3},
		}},
		{"loop.last read: the former last message renders again", `{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}},
			{msgs: []string{"u1", "a1", "u2"}, reused: 1},
		}},
		{"a message at another index renders again", `{% for m in messages %}{{ loop.index }}{{ m.content }}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}},
			{msgs: []string{"s1", "u1", "a1"}},
		}},
		{"last query moved (Qwen3): the assistant turn after it renders again", `{% set ns = namespace(last=-1) %}` +
			`{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}` +
			`{% for m in messages %}{% if loop.index0 > ns.last %}<think>{{ m.content }}{% else %}{{ m.content }}{% endif %}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}},
			{msgs: []string{"u1", "a1", "u2"}, reused: 1},
			{msgs: []string{"u1", "a1", "u2", "a2", "u3"}, reused: 3},
		}},
		{"namespace writes replayed", `{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{{ m.content }}{% endfor %}={{ ns.n }}`, []render{
			{msgs: []string{"u1", "a1"}},
			{msgs: []string{"u1", "a1", "u2"}, reused: 2},
		}},
		{"writes undone when a later read differs", `{% set ns = namespace(n=0, flag=flag) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% if ns.flag %}F{% endif %}{{ ns.n }}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}, vars: MapVars{"flag": Bool(false)}},
			{msgs: []string{"u1", "a1"}, vars: MapVars{"flag": Bool(true)}},
			{msgs: []string{"u1", "a1"}, vars: MapVars{"flag": Bool(true)}, reused: 2},
		}},
		{"outer variable changed", `{% for m in messages %}{{ prefix }}{{ m.content }}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}, vars: MapVars{"prefix": String("p")}},
			{msgs: []string{"u1", "a1"}, vars: MapVars{"prefix": String("q")}},
			{msgs: []string{"u1", "a1", "u2"}, vars: MapVars{"prefix": String("q")}, reused: 2},
		}},
		{"scope starts from another value", `{% set c = start %}{% for m in messages %}{{ c }}{% set c = m.content %}{{ c }}{% endfor %}`, []render{
			{msgs: []string{"u1"}, vars: MapVars{"start": String("x")}},
			{msgs: []string{"u1"}, vars: MapVars{"start": String("y")}},
			{msgs: []string{"u1", "a1"}, vars: MapVars{"start": String("y")}, reused: 1},
		}},
		{"neighbour read", `{% for m in messages %}{% if not loop.first and messages[loop.index0 - 1].role == 'tool' %}T{% endif %}{{ m.content }}{% endfor %}`, []render{
			{msgs: []string{"u1", "u2"}},
			{msgs: []string{"t1", "u2"}},
			{msgs: []string{"t1", "u2", "a1"}, reused: 2},
		}},
		{"macro calls are not stored", `{% macro r(m) %}{{ m.content }}{{ suffix }}{% endmacro %}{% for m in messages %}{{ r(m) }}{% endfor %}`, []render{
			{msgs: []string{"u1"}, vars: MapVars{"suffix": String("x")}},
			{msgs: []string{"u1"}, vars: MapVars{"suffix": String("y")}},
		}},
		{"impure globals are not stored", `{% for m in messages %}{{ m.content }}{{ clock() }}{% endfor %}`, []render{
			{msgs: []string{"u1"}},
			{msgs: []string{"u1"}},
		}},
		{"the loop object itself is not followed", `{% for m in messages %}{% set l = loop %}{{ l.index }}{{ m.content }}{% endfor %}`, []render{
			{msgs: []string{"u1"}},
			{msgs: []string{"u1"}},
		}},
		{"nested loop's own loop variable", `{% for m in messages %}{% for c in m.content %}{{ c }}{% if loop.last %}.{% endif %}{% endfor %}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}},
			{msgs: []string{"u1", "a1", "u2"}, reused: 2},
		}},
		{"break replayed", `{% for m in messages %}{% if m.content == 'a9' %}{% break %}{% endif %}{{ m.content }}{% endfor %}.`, []render{
			{msgs: []string{"u1", "a9", "u2"}},
			{msgs: []string{"u1", "a9", "u2", "a1"}, reused: 2},
		}},
		{"a namespace read as a value is never the same", `{% set ns = namespace(n=n) %}{% for m in messages %}{% set alias = ns %}{{ alias.n }}{% set alias.n = alias.n + 1 %}{{ m.content }}{% endfor %}`, []render{
			{msgs: []string{"u1", "a1"}, vars: MapVars{"n": Int(0)}},
			{msgs: []string{"u1", "a1"}, vars: MapVars{"n": Int(5)}},
		}},
		{"loop without output is not memoized", `{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}`, []render{
			{msgs: []string{"u1"}},
			{msgs: []string{"u1"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			tmpl, err := Compile(tt.src, Options{Globals: map[string]Value{
				"clock": FuncValue(func([]Value, []KwArg) (Value, error) { calls++; return Int(int64(calls)), nil }),
			}})
			if err != nil {
				t.Fatal(err)
			}
			pool := messages{}
			cache := &mapIterations{m: map[iterKey]*Iteration{}}
			for i, r := range tt.renders {
				vars := MapVars{"messages": pool.list(r.msgs...)}
				for k, v := range r.vars {
					vars[k] = v
				}
				calls = 0
				out, stats, err := tmpl.RenderCached(nil, vars, cache)
				got := string(out)
				if err != nil {
					t.Fatalf("render %d: %v", i, err)
				}
				calls = 0
				want, err := tmpl.Render(vars, 0)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Fatalf("render %d: cached %q, full %q", i, got, want)
				}
				if stats.Reused != r.reused {
					t.Fatalf("render %d: %d iterations reused, want %d (%q)", i, stats.Reused, r.reused, got)
				}
			}
		})
	}
}

// TestRenderCachedNamespaceAlias: a namespace that keeps its identity across renders
// (a render variable) written through a name the loop body also assigns is not
// traced as an outer write, so such an iteration must never be reused.
func TestRenderCachedNamespaceAlias(t *testing.T) {
	tmpl, err := Compile(`{% for m in messages %}{% if m.content == 'x' %}{% set g = namespace(n=0) %}{% endif %}{% set g.n = g.n + 1 %}{{ g.n }}{% endfor %}={{ g.n }}`, Options{})
	if err != nil {
		t.Fatal(err)
	}
	shared := &Namespace{attrs: NewDict(1)}
	vars := MapVars{"messages": messages{}.list("u1", "a1"), "g": {kind: KindNamespace, ref: shared}}
	cache := &mapIterations{m: map[iterKey]*Iteration{}}
	for i := range 3 {
		shared.attrs.Set("n", Int(0))
		out, stats, err := tmpl.RenderCached(nil, vars, cache)
		if err != nil {
			t.Fatal(err)
		}
		shared.attrs.Set("n", Int(0))
		want, _ := tmpl.Render(vars, 0)
		if string(out) != want || stats.Reused != 0 {
			t.Fatalf("render %d: cached %q (%d reused), full %q", i, out, stats.Reused, want)
		}
	}
}

// TestRenderCachedConcurrent renders conversations sharing their messages from
// several goroutines with one cache (run with -race).
func TestRenderCachedConcurrent(t *testing.T) {
	tmpl, err := Compile(`{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}`, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool := messages{}
	var convs []Value
	names := []string{}
	for i := range 20 {
		names = append(names, []string{"u", "a"}[i%2]+strings.Repeat("x", i))
		convs = append(convs, pool.list(names...))
	}
	cache := &mapIterations{m: map[iterKey]*Iteration{}}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range convs {
				vars := MapVars{"messages": convs[(i+g*5)%len(convs)]}
				got, _, err := tmpl.RenderCached(nil, vars, cache)
				want, _ := tmpl.Render(vars, 0)
				if err != nil || string(got) != want {
					t.Errorf("cached %q (%v), full %q", got, err, want)
				}
			}
		})
	}
	wg.Wait()
}

// FuzzRenderCached compiles any source and renders a growing, changing conversation
// with an iteration cache: every render must equal the uncached render (or both
// fail). The seeds are loops the memo must follow and Qwen3's template.
func FuzzRenderCached(f *testing.F) {
	for _, s := range []string{
		`{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}`,
		`{% set ns = namespace(n=0, last=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% if loop.index0 > ns.last %}<{{ m.content }}>{% else %}{{ m.content }}{% endif %}{{ ns.n }}{% endfor %}`,
		`{% for m in messages %}{% if not loop.first and messages[loop.index0 - 1].role == 'tool' %}T{% endif %}{{ x }}{{ m.content }}{{ loop.revindex }}{% endfor %}`,
		`{% set c = x %}{% for m in messages %}{{ c }}{% set c = m.content %}{% for ch in c %}{{ loop.index }}{% if ch == 'a' %}{% break %}{% endif %}{% endfor %}{% endfor %}`,
		`{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.content }}{{ loop.nextitem.role if loop.nextitem is defined }}{% endfor %}`,
	} {
		f.Add(s, uint8(0))
	}
	if src, err := os.ReadFile(filepath.Join("..", "..", "testdata", "templates", "qwen3.jinja")); err == nil {
		f.Add(string(src), uint8(3))
	}
	f.Fuzz(func(t *testing.T, src string, vary uint8) {
		tmpl, err := Compile(src, testOptions)
		if err != nil {
			return
		}
		pool := messages{}
		cache := &mapIterations{m: map[iterKey]*Iteration{}}
		convs := [][]string{
			{"s1", "u1", "a1"},
			{"s1", "u1", "a1", "t1", "u2"},
			{"s1", "u1", "a1", "t1", "u2", "a2", "u3"},
			{"s2", "u1", "a1", "t1", "u2", "a2", "u3"},
			{"u1", "a1", "t1", "u2", "a2", "u3"},
		}
		for i, names := range convs {
			vars := MapVars{"messages": pool.list(names...), "x": Int(int64(i) * int64(vary&1)), "add_generation_prompt": Bool(vary&2 != 0)}
			got, _, err := tmpl.RenderCached(nil, vars, cache)
			want, wantErr := tmpl.Render(vars, 0)
			if (err == nil) != (wantErr == nil) || (err == nil && string(got) != want) {
				t.Fatalf("render %d: cached %q (%v), full %q (%v)", i, got, err, want, wantErr)
			}
		}
	})
}
