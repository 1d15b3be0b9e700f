package jinja

import (
	"strings"
	"testing"
)

// FuzzCompileRender: compiling any source and rendering what compiles never panics;
// it renders or returns an error.
func FuzzCompileRender(f *testing.F) {
	for _, s := range []string{
		"{% for m in msgs %}{{ loop.index }}{{ m.role | upper }}{% endfor %}",
		"{%- set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}",
		"{{ (x if y else z)[1:] ~ d | tojson(indent=2) }}",
		"{% macro m(a, b=2) %}{{ a ~ b }}{% endmacro %}{{ m(1) }}{{ m(b=3, a=1) }}",
		"{% if s.startswith('H') %}{{ s.split()[::-1] | join(',') }}{% elif x %}{% else %}{% endif %}",
		"{{ '%s' % x }}{{ '{}'.format(s) }}{# c #}{% raw %}x{% endraw %}",
		"{{ " + strings.Repeat("(", 300) + "1" + strings.Repeat(")", 300) + " }}",
		"{% for a, b in d.items() if a %}{{ a }}{% else %}e{% endfor %}{% generation %}g{% endgeneration %}",
	} {
		f.Add(s)
	}
	vars := MapVars{
		"x": Int(1), "y": Bool(false), "z": String("zz"), "s": String("Hello World"),
		"msgs": ListOf([]Value{DictValue(dictOf("role", String("user"))), DictValue(dictOf("role", None()))}),
		"d":    DictValue(dictOf("a", Float(1.5), "b", ListOf([]Value{None(), Bool(true)}))),
	}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Compile(src, testOptions)
		if err != nil {
			return
		}
		_, _ = tmpl.Render(vars, 0)
	})
}

func dictOf(kvs ...any) *Dict {
	d := NewDict(len(kvs) / 2)
	for i := 0; i+1 < len(kvs); i += 2 {
		d.Set(kvs[i].(string), kvs[i+1].(Value))
	}
	return d
}
