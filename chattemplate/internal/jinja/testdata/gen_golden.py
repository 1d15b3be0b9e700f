#!/usr/bin/env python3
"""Regenerate testdata/golden.json: Jinja2 3.1 renders of the engine's test cases.

Jinja2 is set up as transformers sets it up for chat templates
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the
tojson filter as json.dumps(ensure_ascii=False)). Run from the repository root:

    python3 chattemplate/internal/jinja/testdata/gen_golden.py
"""
import json
import os

import jinja2
import jinja2.ext
import jinja2.sandbox

HERE = os.path.dirname(os.path.abspath(__file__))

VARS = {
    "x": 1, "y": 2, "f": 2.5, "s": "Hello World", "u": "héllo wörld", "e": "",
    "items": ["a", "b", "c"], "nums": [3, 1, 2], "d": {"b": 1, "a": 2, "c": None},
    "msgs": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi <tool_response>x</tool_response>"},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": [1.0, None]}}}]},
        {"role": "tool", "content": "res"},
    ],
    "n": None, "t": True, "fl": False, "big": 123456789012345678901234567890,
    "nested": {"a": {"b": {"c": "deep"}}}, "multi": "a\nb\n\nc",
}

CASES = [
    # output and whitespace control
    "a {{ x }} b", "{{ x }}\n", "a\n\n", "  {% if x %}\n  yes\n  {% endif %}\n  end",
    "{%- if x %} a {% endif -%}  b", "a  {{- x -}}  b", "{% if x %}\n{% endif %}x",
    "  {# c #}\nx", "a {#- c -#} b", "{%+ if x %}  y{% endif %}", "line\n   {%- if x %}t{% endif %}",
    "{% if x %}a{% endif %}\r\nb\r\n", "{{ '{{' }}{{ \"}}\" }}", "{{ {'a': {'b': 1}} }}",
    "x  \n  {%- set q = 1 %}  \n  {{ q }}",
    # literals and printing
    "{{ 1 }}{{ -1 }}{{ 1.5 }}{{ 1e3 }}{{ 1_000 }}{{ 'a' 'b' }}{{ \"q'\" }}",
    "{{ [1, 'a', none, true, 1.5, [2]] }}{{ (1,) }}{{ () }}{{ (1, 'b') }}",
    "{{ {'a': 1, 2: 'b'} }}{{ d }}{{ n }}{{ t }}{{ fl }}", "{{ \"it's\" }}|{{ ['it\\'s', 'q\"', 'b\\\\'] }}",
    "{{ ['\\n\\t\\x01é\\u2028'] }}", "{{ big }}{{ big + 1 }}{{ -big }}", "{{ 1, 2 }}",
    "{{ 'a\\nb\\x41\\u00e9\\101\\z' }}",
    # arithmetic
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 1 + 1.0 }} {{ true + 1 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 10 ** 20 }}",
    "{{ 'a' ~ 1 ~ none ~ [1] ~ undefined_thing }}", "{{ x + y * 2 - 1 }}{{ (x + y) * 2 }}{{ -x ** 2 }}",
    "{{ 1 / 0 }}", "{{ 'a' + 1 }}", "{{ undefined_thing + 1 }}", "{{ 'a' - 'b' }}",
    # comparisons and logic
    "{{ 1 == 1.0 }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ none == none }}{{ 1 != 2 }}",
    "{{ x and y }}{{ x and 0 }}{{ 0 or 'z' }}{{ e or n }}{{ not e }}{{ not x }}|{{ n and 1 }}",
    "{{ 'a' in 'cat' }}{{ 'b' in items }}{{ 'a' in d }}{{ 'z' not in d }}{{ 1 in [1.0] }}{{ 'q' in undefined_thing }}",
    "{{ 1 < 'a' }}", "{{ undefined_thing < 1 }}", "{{ undefined_thing == undefined_other }}{{ undefined_thing == none }}",
    # conditional expressions
    "{{ 'a' if x else 'b' }}{{ 'a' if e }}|{{ ('p' if x else 'q') + ('r' if e else 's') }}",
    "{{ 'a' if e else 'b' if x else 'c' }}{{ ['y' if x else 'n', ('m' if e else 'o')] }}",
    "{{ {'k': 'v' if x else 'w'}['k'] }}{{ items | join('-' if x else '+') }}{% set v = 1 if e else 2 %}{{ v }}",
    # attribute and item access
    "{{ d.a }}{{ d['b'] }}{{ d.zz }}|{{ d['zz'] }}|{{ msgs[0].role }}{{ msgs[-1]['content'] }}{{ msgs[9] }}|",
    "{{ nested.a.b.c }}{{ nested['a']['b'].c }}{{ items.0 }}{{ x.foo }}|{{ n.foo }}|{{ s.foo }}|",
    "{{ x.foo.bar }}", "{{ undefined_thing.foo }}", "{{ undefined_thing[0] }}", "{{ d.items is defined }}",
    "{{ s[0] }}{{ s[-1] }}{{ u[1] }}{{ u[::-1] }}{{ u[1:4] }}{{ s[:5] }}{{ s[::2] }}{{ items[1:] }}{{ items[::-1] }}{{ nums[-2:] }}{{ items[5:] }}",
    "{{ s[100] }}|{{ items[:-1] }}{{ s[2:-2:3] }}{{ items[::-2] }}",
    # tests
    "{{ x is defined }}{{ q is defined }}{{ q is undefined }}{{ n is none }}{{ x is none }}{{ n is defined }}",
    "{{ s is string }}{{ x is string }}{{ d is mapping }}{{ items is mapping }}{{ items is iterable }}{{ s is iterable }}{{ x is iterable }}{{ q is iterable }}",
    "{{ items is sequence }}{{ d is sequence }}{{ x is number }}{{ f is number }}{{ t is number }}{{ s is number }}{{ x is integer }}{{ t is integer }}{{ f is float }}",
    "{{ t is true }}{{ 1 is true }}{{ fl is false }}{{ 0 is false }}{{ n is false }}{{ t is boolean }}",
    "{{ x is equalto 1 }}{{ x is eq(2) }}{{ 'b' is in items }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ x is not none }}{{ not x is none }}",
    "{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ x is gt 0 }}{{ x is lt(0) }}{{ x is ne 1 }}{{ range is callable }}{{ n is sameas none }}",
    "{{ msgs | length is even }}",
    # filters
    "{{ items | length }}{{ s | length }}{{ u | length }}{{ d | length }}{{ q | length }}{{ items | count }}",
    "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ s | upper }}{{ s | lower }}{{ 'hELLO wORLD' | capitalize }}{{ 'hello-world foo(bar)' | title }}",
    "{{ q | default('d') }}{{ n | default('d') }}{{ e | default('d') }}{{ e | default('d', true) }}{{ e | d('x', boolean=true) }}",
    "{{ items | first }}{{ items | last }}{{ s | first }}{{ d | first }}{{ [] | first }}|{{ q | first }}|",
    "{{ items | join }}{{ items | join(', ') }}{{ msgs | join('|', attribute='role') }}{{ nums | join('+') }}",
    "{{ d | items | list }}{{ d | dictsort }}{{ d | dictsort(reverse=true) }}{{ {'B': 1, 'a': 2} | dictsort }}{{ {'B': 1, 'a': 2} | dictsort(true) }}{{ {'x': 2, 'y': 1} | dictsort(by='value') }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}{{ msgs | rejectattr('role', 'in', ['user', 'tool']) | map(attribute='role') | join(',') }}",
    "{{ msgs | selectattr('tool_calls') | list | length }}{{ msgs | selectattr('tool_calls', 'defined') | map(attribute='role') | first }}",
    "{{ nums | select('odd') | list }}{{ nums | reject('odd') | list }}{{ [0, 1, '', 'a'] | select | list }}{{ items | map('upper') | list }}{{ msgs | map(attribute='zz', default='D') | list }}",
    "{{ x | string }}{{ n | string }}{{ items | string }}{{ '5' | int + 1 }}{{ '5.7' | int }}{{ 'z' | int }}{{ 'z' | int(7) }}{{ 3.9 | int }}{{ '2.5' | float }}{{ x | float }}",
    "{{ s | list }}{{ d | list }}{{ items | reverse | list }}{{ s | reverse }}{{ 'aXbX' | replace('X', '-') }}{{ 'aaa' | replace('a', 'b', 2) }}{{ s | safe }}",
    "{{ multi | indent }}|{{ multi | indent(2, true) }}|{{ multi | indent('> ', blank=true) }}|{{ 'a\\n' | indent(2) }}",
    "{{ ['a', 'A', 'b', 'a'] | unique | list }}{{ nums | sort }}{{ nums | sort(reverse=true) }}{{ ['b', 'A', 'c'] | sort }}{{ msgs | sort(attribute='role') | map(attribute='role') | join(',') }}",
    "{{ nums | min }}{{ nums | max }}{{ nums | sum }}{{ -3 | abs }}{{ 'a b  c' | wordcount }}{{ '%s=%d' | format('k', 3) }}{{ '%s-%r' % ('a', 'b') }}{{ '%d%%' % 5 }}",
    "{{ d | tojson }}{{ msgs[2] | tojson }}{{ s | tojson }}{{ 'é\"\\n' | tojson }}{{ 'é' | tojson(ensure_ascii=true) }}{{ [1.0, 1e-7, -0.0, 1e16, big] | tojson }}",
    "{{ d | tojson(indent=2) }}{{ d | tojson(indent='\\t', sort_keys=true) }}{{ d | tojson(separators=(',', ':')) }}{{ [] | tojson(indent=2) }}{{ {} | tojson }}",
    "{{ q | tojson }}", "{{ n | tojson }}{{ t | tojson }}",
    # string methods
    "{{ s.startswith('He') }}{{ s.endswith('x') }}{{ s.startswith(('x', 'H')) }}{{ '  x  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ '\\n\\na\\n'.strip('\\n') }}",
    "{{ s.split() }}{{ s.split('o') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ '  a  b '.split() }}{{ ' a b c '.split(none, 1) }}{{ ' a b c '.rsplit(none, 1) }}{{ ''.split() }}{{ ''.split(',') }}",
    "{{ s.replace('o', '0') }}{{ s.replace('o', '0', 1) }}{{ s.upper() }}{{ s.lower() }}{{ 'hello world'.title() }}{{ \"they're 1st\".title() }}{{ 'hELLO'.capitalize() }}",
    "{{ s.find('o') }}{{ s.rfind('o') }}{{ s.find('z') }}{{ u.find('w') }}{{ s.count('o') }}{{ ', '.join(items) }}{{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ '{} and {}'.format('a', 1) }}{{ '{0}{1}{0}'.format('x', 'y') }}{{ '{name}!'.format(name='n') }}{{ 'ab'.removeprefix('a') }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}",
    "{{ s.index('z') }}", "{{ items.append(1) }}", "{{ d.update({}) }}",
    # dict methods
    "{{ d.items() }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 'dflt') }}{{ d.items() | list }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}",
    # loops
    "{% for i in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ i }} {% endfor %}",
    "{% for i in items %}{{ loop.previtem }}-{{ loop.nextitem }}|{% endfor %}{% for i in items %}{{ loop.cycle('o', 'e') }}{% endfor %}",
    # A loop over a list reversed runs backwards over the list, not over a reversed copy.
    "{% for i in items[::-1] %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}-{{ i }}-{{ loop.nextitem }}|{% endfor %}",
    "{% for m in msgs[::-1] %}{% if m.role == 'user' %}{{ loop.index0 }}{% break %}{% endif %}{% endfor %}{% for i in e[::-1] %}x{% else %}empty{% endfor %}{% for i in s[::-1] %}{{ i }}{% endfor %}",
    "{% for i in nums[::-2] %}{{ i }}{{ loop.nextitem }}{% endfor %}{% for i in nums[::x - 2] %}{{ i }}{{ loop.previtem }}{% endfor %}",
    "{% for i in undefined_list[::-1] %}{{ i }}{% endfor %}",
    # slicing what is not a sequence raises (a dict: unhashable slice; the rest: not subscriptable)
    "{{ d[::-1] }}", "{{ d[1:] | length }}", "{{ x[1:] }}", "{{ n[:1] }}", "{{ t[::-1] }}", "{{ f[1:] }}",
    "{% set ns = namespace(a=1) %}{{ ns[1:] }}",
    "{% for i in nums[::y - 2] %}{% endfor %}",
    "{% for i in nums if i > 1 %}{{ loop.index }}:{{ i }}{{ ',' if not loop.last }}{% endfor %}",
    "{% for i in [] %}x{% else %}empty{% endfor %}{% for i in items if i == 'z' %}x{% else %}none{% endfor %}{% for i in q %}x{% else %}undef{% endfor %}",
    "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for a, b in [(1, 2), [3, 4]] %}{{ a }}{{ b }}{% endfor %}{% for (a, b) in [(5, 6)] %}{{ a + b }}{% endfor %}",
    "{% for c in 'héj' %}{{ c }},{% endfor %}{% for i in range(2, 10, 3) %}{{ i }}{% endfor %}{% for i in range(3, 0, -1) %}{{ i }}{% endfor %}",
    "{% for i in items %}{% for j in nums %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for i in items %}{% set outer = loop %}{% for j in [1] %}{{ outer.index }}{% endfor %}{% endfor %}",
    "{% for i in n %}x{% endfor %}", "{% for a, b in items %}{% endfor %}",
    # scoping
    "{% set x = 5 %}{{ x }}{% for i in [1, 2] %}{{ x }}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}{% if i == 2 %}{{ z }}{% endif %}{% set z = i %}{% endfor %}|{{ z }}|{{ i }}|",
    "{% set i = 9 %}{% for i in [1] %}{{ i }}{% endfor %}{{ i }}{% set loop = 'L' %}{% for j in [1] %}{{ loop.index }}{% endfor %}{{ loop }}",
    "{% if x %}{% set w = 'set in if' %}{% endif %}{{ w }}",
    "{{ y }}{% set y = 7 %}{{ y }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c[1] }}",
    "{% set ns = namespace(c=0, l=[], found=false) %}{% for m in msgs %}{% set ns.c = ns.c + 1 %}{% if m.role == 'tool' %}{% set ns.found = true %}{% endif %}{% set ns.l = ns.l + [m.role] %}{% endfor %}{{ ns.c }}{{ ns.found }}{{ ns.l }}{{ ns.zz }}|",
    "{% set ns = namespace(d) %}{{ ns.a }}{{ ns.b }}{% set ns2 = namespace({'k': 1}, j=2) %}{{ ns2.k }}{{ ns2.j }}",
    "{% set x.attr = 1 %}",
    "{% set blk %}inner {{ x }}{% endset %}[{{ blk }}]{% set up | upper %}shout{% endset %}{{ up }}",
    "{% filter upper %}abc {{ s }}{% endfilter %}{% filter trim | upper %}  x  {% endfilter %}",
    # macros
    "{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c }}{{ x }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(a='k') }}",
    "{% macro r(v) %}{% if v is mapping %}{% for k, w in v.items() %}{{ k }}({{ r(w) }}){% endfor %}{% else %}{{ v }}{% endif %}{% endmacro %}{{ r(nested) }}",
    "{% set g = 1 %}{% macro m() %}{{ g }}{% set g = 2 %}{{ g }}{% endmacro %}{{ m() }}{{ g }}",
    "{% macro m() %}{% for i in [1, 2] %}{{ loop.index }}{% endfor %}{% endmacro %}{{ m() }}{{ m() | length }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    # generation and globals
    "{% for m in msgs %}{% generation %}{{ m.role[0] }}{% set inner = 1 %}{% endgeneration %}{% endfor %}{{ inner is defined }}",
    "{{ range(3) | list }}{{ range(1, 4) | list }}{{ dict(a=1, b='x') }}{{ namespace(a=1).a }}",
    "{{ raise_exception('boom ' ~ x) }}",
    # errors Jinja2 raises
    "{{ q() }}", "{{ x() }}", "{{ items['a'] }}|", "{{ n | length }}", "{{ 5 | first }}",
]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


class Generation(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def main():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = []
    for src in CASES:
        rec = {"template": src}
        try:
            rec["rendered"] = env.from_string(src).render(**VARS)
        except Exception as e:  # noqa: BLE001 - the error kind is the golden
            rec["error"] = f"{type(e).__name__}: {e}"
        out.append(rec)
    # GOLDEN_OUT redirects the output (chattemplate's TestGoldensRebuild).
    with open(os.path.join(os.environ.get("GOLDEN_OUT", HERE), "golden.json"), "w") as f:
        json.dump({"vars": VARS, "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
