#!/usr/bin/env python3
"""Writes cases.json: expected chat-template renderings for runtime/chat/chat_template.cpp.

Renders every templates/*.jinja with jinja2 configured exactly like transformers'
`_compile_jinja_template` (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, transformers' tojson override, raise_exception, strftime_now).
Usage: pip install jinja2 gguf; python3 make_golden.py
SmolLM2's template is read from the GGUF (key tokenizer.chat_template) when present. The
other templates/*.jinja are transcriptions of the chat_template in each model's public
tokenizer_config.json (no hub access where this was made); features.jinja and SNIPPETS
exercise the rest of the supported subset.
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "templates")
GGUF = "/root/.cache/troupe/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def refresh_smollm2():
    try:
        from gguf import GGUFReader
    except ImportError:
        return
    if not os.path.exists(GGUF):
        return
    field = GGUFReader(GGUF).fields["tokenizer.chat_template"]
    text = bytes(field.parts[field.data[0]]).decode("utf-8")
    with open(os.path.join(TEMPLATES, "smollm2.jinja"), "w", encoding="utf-8") as f:
        f.write(text)


def msg(role, content):
    return {"role": role, "content": content}


SYS = msg("system", "You are a helpful assistant.")
CONVERSATIONS = {
    "system_user": [SYS, msg("user", "Hello!")],
    "multi_turn": [SYS, msg("user", "Hi"), msg("assistant", "Hello, how can I help?"),
                   msg("user", "Tell me a joke.")],
    "no_system": [msg("user", "What is 2+2?"), msg("assistant", "4"), msg("user", "And 3+3?")],
    "single_user": [msg("user", "One question.")],
    "unicode": [msg("user", "Héllo wörld — 你好 🌍 ∑"), msg("assistant", "Ça va? ✓ ñ"),
                msg("user", "日本語のテキスト")],
    "jinja_like": [msg("user", "{{ x }} {% if y %}z{% endif %} {# c #} '\"\\n"),
                   msg("assistant", "{{- raise_exception('no') -}}")],
    "whitespace": [msg("system", "  padded system \n"), msg("user", "\n\t spaced user  \n")],
    "bad_alternation": [msg("user", "first"), msg("user", "second")],
    "empty": [],
}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
        "return": {"type": "string"},
    },
}]
TOOL_CONVERSATION = [
    msg("system", "You can call tools."),
    msg("user", "Weather in Paris?"),
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call00001", "type": "function",
                     "function": {"name": "get_weather",
                                  "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call00001"},
    msg("assistant", "It is 21°C in Paris."),
    msg("user", "Thanks"),
]


def cases_for(name):
    out = []
    if name == "features":
        for conv_name in ("multi_turn", "unicode", "empty"):
            for flag in (True, False):
                out.append({"name": f"features/{conv_name}/flag={flag}", "uses_render": False,
                            "vars": {"messages": CONVERSATIONS[conv_name], "flag": flag,
                                     "name": "Troupe"}})
        return out
    for conv_name, conv in CONVERSATIONS.items():
        for agp in (True, False):
            out.append({"name": f"{name}/{conv_name}/agp={agp}", "uses_render": True,
                        "vars": {"messages": conv, "add_generation_prompt": agp,
                                 "bos_token": "<s>", "eos_token": "</s>"}})
    if name in ("llama3.1", "qwen2.5", "mistral_v0.3"):
        for agp in (True, False):
            out.append({"name": f"{name}/tools/agp={agp}", "uses_render": False,
                        "vars": {"messages": TOOL_CONVERSATION, "tools": TOOLS,
                                 "add_generation_prompt": agp,
                                 "bos_token": "<s>", "eos_token": "</s>"}})
    if name == "llama3.1":
        out.append({"name": "llama3.1/date_and_builtin_tools", "uses_render": False,
                    "vars": {"messages": [msg("user", "hi")], "date_string": "01 Jan 2025",
                             "builtin_tools": ["brave_search", "code_interpreter"],
                             "tools_in_user_message": False, "tools": TOOLS,
                             "add_generation_prompt": True, "bos_token": "<s>"}})
    return out


# Small inline templates for whitespace control and expression corners.
SNIPPETS = [
    "a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
    "a\n  {%- if true -%}\n  b\n  {%- endif %}  \nc",
    "  {# comment #}\nx\n  {#- c -#}  y",
    "{% for i in range(3) %}\n  {{ i }}\n{% endfor %}\n",
    "{% for i in range(3) -%}\n  {{ i }}\n{%- endfor %}",
    "line1\r\nline2\r{% if true %}\r\nz{% endif %}\n\n",
    "\t{% set x = 1 %}\t{{ x }}\n  {{ x }}  {% if x %}  y{% endif %}",
    "{%+ if true %}  a{% endif %}\n  {%+ if true %}b{%+ endif %}",
    "{{ 'a' }}   {%- if true %} b {% endif -%}   c",
    "{{ '{% not a tag %}' }}",
    "{{ [1, 2, 3][1:] }} {{ [1, 2, 3][-1] }} {{ [1, 2, 3][5] }} {{ 'abc'[::-1] }} {{ 'abc'[10:] }}|",
    "{{ {'a': 1}['a'] }} {{ {'a': 1}.a }} {{ {'a': 1}.b }}|{{ none }}|{{ true }}|{{ 3.0 }}|{{ 1e20 }}|{{ 1.5e-7 }}",
    "{{ 1 if none else 2 }} {{ 'x' if '' }}| {{ [] or 'empty' }} {{ 0 and 1 }} {{ not [] }}",
    "{{ 10 / 4 }} {{ 10 // 4 }} {{ 10.0 // 4 }} {{ -10 % 3 }} {{ 10 % -3 }} {{ 2 ** -1 }} {{ 7.5 % 2 }}",
    "{{ 'a' < 'b' < 'c' }} {{ 3 > 2 > 2 }} {{ [1, 2] < [1, 3] }} {{ 1 != 1.0 }} {{ true == 1 }}",
    "{{ 'x' ~ 2 ~ [1] ~ {'k': \"v'\"} }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}",
    "{{ '  a b  '.split(' ') }} {{ 'a,b,c'.split(',', 1) }} {{ 'x'.join(['1', '2']) }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('bc') }}",
    "{{ 'xxhixx'.strip('x') }} {{ 'hello'.replace('l', 'L') }} {{ 'ab' | replace('', '-') }} {{ 'HeLLo wOrld' | capitalize }}",
    "{{ \"they're bill's friends\" | title }} {{ \"they're bill's friends\".title() }} {{ 'a-b(c' | title }}",
    "{{ [3, 1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ -5 | abs }} {{ '3.7' | float }} {{ ' 12 ' | int }} {{ '0x1A' | int }}",
    "{{ {'b': 2, 'a': 1} | tojson(sort_keys=true) }} {{ [1, [2, {}], []] | tojson(indent=2) }} {{ {'a': 'x'} | tojson(separators=[',', ':']) }}",
    "{{ 'tab\\there' | tojson }} {{ '\\u0001\\u001f' | tojson }} {{ 1.0 | tojson }} {{ none | tojson }}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{% for k in {'x': 1, 'y': 2} %}{{ k }}{{ loop.index }}{% endfor %} {% for c in 'hé' %}[{{ c }}]{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %} {% for x in [1, 2, 3] if x > 1 %}{{ x }}/{{ loop.length }}{% endfor %}",
    "{% for x in [1, 2] %}{% for y in [3, 4] %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = (1,) %}{{ t }} {% set e = () %}{{ e }} {{ (1, 'a') }}",
    "{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.items }}",
    "{{ x | default('d') }} {{ x is defined }} {{ none is defined }} {{ x | length }} {{ x | list }}|{% for i in x %}no{% endfor %}",
    "{{ 'abc' is iterable }} {{ 1 is iterable }} {{ {} is mapping }} {{ [] is sequence }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is number }}",
    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }} {{ 5 is divisibleby(5) }} {{ 2 is in([1, 2]) }} {{ 1 is ne 2 }} {{ 3 is gt 2 }}",
    "{{ [{'n': 'a', 'v': 1}, {'n': 'b'}] | selectattr('v') | map(attribute='n') | list }} {{ [{'n': 'a'}, {'m': 1}] | map(attribute='n', default='z') | join(',') }}",
    "{{ [{'a': {'b': 1}}, {'a': {'b': 2}}] | map(attribute='a.b') | list }} {{ ['a', 'b'] | map('upper') | join }} {{ [1, 2] | join(', ') }}",
    "{{ {'a': 1, 'b': 2} | items | list }} {{ {'a': 1}.items() | list }} {{ {} | first }}|{{ [] | last }}|",
    "{% if true %}yes{% elif false %}no{% else %}never{% endif %} {% if false %}{% elif 1 %}elif{% endif %}",
    "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %} {% for i in range(5) %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
    "{% set x %}  block {{ 1 + 1 }}\n{% endset %}[{{ x }}]",
    "{{ \"a\" \"b\" 'c' }} {{ 'a' in ['a'] }} {{ 'a' not in {'a': 1} }} {{ '' in 'x' }} {{ 1_000 }} {{ 0.5e1 }}",
    "{{- '  lead' }}   \n  {{- 'trail  ' -}}  \n  end",
    "{% if x is not none and x is not defined %}ok{% endif %} {{ y.z if y is defined else 'nodef' }}",
    "{{ messages | length }}{% for m in messages %}{{ m.role[0] | upper }}{{ m['content'][:3] }};{% endfor %}",
]


def main():
    refresh_smollm2()
    env = make_env()
    cases = []
    for fname in sorted(os.listdir(TEMPLATES)):
        if not fname.endswith(".jinja"):
            continue
        name = fname[: -len(".jinja")]
        with open(os.path.join(TEMPLATES, fname), encoding="utf-8") as f:
            template = env.from_string(f.read())
        for case in cases_for(name):
            case["template"] = fname
            try:
                case["expected"] = template.render(**case["vars"])
            except jinja2.exceptions.TemplateError as e:
                # raise_exception raises a plain TemplateError; anything else (undefined
                # access, type errors) only needs to fail.
                plain = type(e) is jinja2.exceptions.TemplateError
                case["error"] = str(e) if plain else ""
            except (TypeError, ValueError, KeyError, IndexError) as e:
                case["error"] = ""
            cases.append(case)
    for idx, source in enumerate(SNIPPETS):
        case = {"name": f"snippet/{idx}", "uses_render": False, "source": source,
                "vars": {"messages": CONVERSATIONS["unicode"]}}
        try:
            case["expected"] = env.from_string(source).render(**case["vars"])
        except Exception as e:  # noqa: BLE001 - any failure is an expected error
            case["error"] = ""
            print(f"snippet {idx} fails in jinja2: {e!r}")
        cases.append(case)
    with open(os.path.join(HERE, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
