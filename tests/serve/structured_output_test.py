#!/usr/bin/env python3
"""Structured output against a running `troupe serve` (tests/serve/run_with_server.sh starts
one), through the official openai client: response_format json_schema and vLLM's guided_json,
guided_regex, guided_choice and guided_grammar (extra_body).

Checked: every answer that finishes ("stop") is valid -- the `jsonschema` package validates
JSON-schema answers (an implementation independent of ours), Python's re.fullmatch checks
regex answers -- over many prompts and seeds, one at a time and 8 at once, and streamed;
a plain request's greedy answer is the same while constrained ones run beside it; hostile
or unsupported schemas get a 400 naming the field within a time bound; the server is healthy
afterwards. Exit status 0 when all hold."""
import argparse
import concurrent.futures as cf
import json
import re
import sys
import time
import urllib.request

import jsonschema
import openai

PROMPTS = [
    "Describe a famous city.", "Tell me about a dog you know.", "Name a book and its author.",
    "What is the weather like today?", "Give me a recipe idea.", "Describe your favourite planet.",
    "Introduce a fictional person.", "What is a good name for a cat?",
]

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0},
            "email": {"type": ["string", "null"]},
            "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
        },
        "required": ["name", "age", "hobbies"],
        "additionalProperties": False,
    },
    "answer": {
        "type": "object",
        "properties": {
            "verdict": {"enum": ["yes", "no", "unsure"]},
            "confidence": {"type": "number"},
            "reason": {"type": "string", "minLength": 1, "maxLength": 60},
        },
        "required": ["verdict", "confidence", "reason"],
        "additionalProperties": False,
    },
    "event": {
        "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                            "code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
                            "required": ["city", "code"], "additionalProperties": False}},
        "type": "object",
        "properties": {"date": {"type": "string", "format": "date"}, "where": {"$ref": "#/$defs/place"},
                       "guests": {"type": "integer"}},
        "required": ["date", "where"],
        "additionalProperties": False,
    },
}

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def chat(client, prompt, seed=None, temperature=0.0, max_tokens=160, **kw):
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": prompt}],
                                       max_tokens=max_tokens, temperature=temperature, seed=seed, **kw)
    return r.choices[0].message.content, r.choices[0].finish_reason


def json_schema_format(name):
    return {"type": "json_schema", "json_schema": {"name": name, "strict": True, "schema": SCHEMAS[name]}}


def valid_instance(name, text):
    try:
        jsonschema.validate(json.loads(text), SCHEMAS[name])
        return True
    except (ValueError, jsonschema.ValidationError) as e:
        print(f"  invalid ({name}): {e.__class__.__name__}: {str(e)[:200]}\n  text: {text!r}")
        return False


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"], "additionalProperties": False}}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def valid_call(call):
    try:
        jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])
        return call.id.startswith("call_") and call.type == "function"
    except (KeyError, ValueError, jsonschema.ValidationError) as e:
        print(f"  invalid call {call}: {e}")
        return False


def tool_calls(client, base_url):
    """tools / tool_choice / parallel_tool_calls: forced calls valid for their function's
    schema (jsonschema), named and single calls, streamed tool_call deltas, a two-round loop
    that sends the result back, and the 400s."""
    user = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    calls = 0
    for seed in range(4):
        r = client.chat.completions.create(model="default", messages=user, tools=TOOLS, tool_choice="required",
                                           max_tokens=120, temperature=0.8, seed=seed)
        c = r.choices[0]
        check(c.finish_reason == "tool_calls" and c.message.tool_calls, f"required: {c.finish_reason} {c.message}")
        for call in c.message.tool_calls or []:
            calls += 1
            check(valid_call(call), f"required seed {seed}: invalid call {call}")
    r = client.chat.completions.create(model="default", messages=user, tools=TOOLS, max_tokens=120, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    c, named_prompt = r.choices[0], r.usage.prompt_tokens
    check(c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1 and
          c.message.tool_calls[0].function.name == "get_weather" and valid_call(c.message.tool_calls[0]),
          f"named: {c}")
    first = c.message.tool_calls[0]
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Add 2 and 3, then 4 and 5."}],
                                       tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=150,
                                       temperature=0.7, seed=3)
    check(len(r.choices[0].message.tool_calls or []) == 1, f"parallel_tool_calls false: {r.choices[0].message}")
    # streamed: the call arrives as a tool_calls delta, no content
    stream = client.chat.completions.create(model="default", messages=user, tools=TOOLS, max_tokens=120, temperature=0,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            stream=True)
    got, content, finish = [], "", None
    for ev in stream:
        if not ev.choices:
            continue
        d = ev.choices[0].delta
        content += d.content or ""
        got += d.tool_calls or []
        finish = ev.choices[0].finish_reason or finish
    check(finish == "tool_calls" and len(got) == 1 and got[0].function.name == "get_weather" and not content and
          json.loads(got[0].function.arguments) == json.loads(first.function.arguments),
          f"streamed named call: {finish} {got} {content!r}")
    # round two: the result goes back, the model answers in prose
    msgs = user + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": first.id, "type": "function",
         "function": {"name": first.function.name, "arguments": first.function.arguments}}]},
        {"role": "tool", "tool_call_id": first.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
    r2 = client.chat.completions.create(model="default", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=60,
                                        temperature=0)
    c2 = r2.choices[0]
    check(c2.message.content and not c2.message.tool_calls and c2.finish_reason in ("stop", "length"),
          f"round two: {c2}")
    check(r2.usage.prompt_tokens > named_prompt + 20, "round two's prompt does not carry the call and its result")
    # auto: an answer either way, calls (if any) valid
    r3 = client.chat.completions.create(model="default", messages=user, tools=TOOLS, max_tokens=120, temperature=0)
    for call in r3.choices[0].message.tool_calls or []:
        check(call.function.name in TOOL_SCHEMAS, f"auto call names no offered function: {call}")
    check(r3.choices[0].message.content or r3.choices[0].message.tool_calls, f"auto: empty answer {r3.choices[0]}")
    # bad
    bad = [({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
           ({"tools": {"a": 1}}, "tools"), ({"tools": [{"type": "retrieval"}]}, "tools"),
           ({"tool_choice": "required"}, "tool_choice"), ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
           ({"tools": [TOOLS[0], TOOLS[0]]}, "tools")]
    for extra, param in bad:
        body = {"model": "default", "messages": user, "max_tokens": 5}
        body.update(extra)
        req = urllib.request.Request(base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=30)
            check(False, f"bad tools body accepted: {extra}")
        except urllib.error.HTTPError as e:
            err = json.loads(e.read())["error"]
            check(e.code == 400 and err.get("param") == param, f"bad tools body {extra}: {e.code} {err}")
    print(f"tools: {calls} forced calls valid for their schemas; named, single, streamed and a two-round loop; "
          f"{len(bad)} bad bodies refused")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key="none", max_retries=0, timeout=300)

    # --- JSON schemas: many prompts and seeds, one at a time ---------------------------------
    finished = valid = 0
    runs = [(name, p, None, 0.0) for name in SCHEMAS for p in PROMPTS[:4]]
    runs += [(name, PROMPTS[(i * 3) % len(PROMPTS)], 100 + i, 0.9) for name in SCHEMAS for i in range(6)]
    t0 = time.time()
    for name, p, seed, temp in runs:
        text, finish = chat(client, p, seed=seed, temperature=temp, response_format=json_schema_format(name))
        if finish != "stop":
            continue
        finished += 1
        ok = valid_instance(name, text)
        valid += ok
        check(ok, f"json_schema {name} {p!r} seed={seed}: finished but invalid: {text!r}")
    check(finished >= len(runs) * 3 // 4, f"only {finished} of {len(runs)} schema answers finished within 160 tokens")
    print(f"json_schema: {valid} of {finished} finished answers valid ({len(runs)} runs, {time.time() - t0:.1f} s)")

    # --- guided_json and the same schema 8 at once, beside a plain greedy request ------------
    plain_alone, _ = chat(client, "Write one sentence about the sea.", max_tokens=40)
    with cf.ThreadPoolExecutor(9) as pool:
        futs = [pool.submit(chat, client, PROMPTS[i], 7 + i, 0.8, extra_body={"guided_json": SCHEMAS["answer"]})
                for i in range(8)]
        plain_fut = pool.submit(chat, client, "Write one sentence about the sea.", max_tokens=40)
        batched = [f.result() for f in futs]
        plain_batched, _ = plain_fut.result()
    check(plain_batched == plain_alone, f"a plain request changed beside constrained ones: {plain_alone!r} vs {plain_batched!r}")
    done = [t for t, f in batched if f == "stop"]
    check(len(done) >= 6, f"only {len(done)} of 8 concurrent guided_json answers finished")
    for t in done:
        check(valid_instance("answer", t), f"concurrent guided_json answer invalid: {t!r}")
    # the same seed gives the same text alone as in the batch (batch invariance holds under a mask)
    alone = chat(client, PROMPTS[2], 9, 0.8, extra_body={"guided_json": SCHEMAS["answer"]})
    check(alone == batched[2], f"seeded constrained answer differs alone vs batched: {alone!r} vs {batched[2]!r}")
    print(f"guided_json: 8 concurrent, {len(done)} finished and valid; the plain request beside them unchanged")

    # --- streamed --------------------------------------------------------------------------
    stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": PROMPTS[0]}],
                                            max_tokens=160, temperature=0, stream=True,
                                            response_format=json_schema_format("person"))
    text, finish = "", None
    for ev in stream:
        if ev.choices:
            text += ev.choices[0].delta.content or ""
            finish = ev.choices[0].finish_reason or finish
    check(finish == "stop" and valid_instance("person", text), f"streamed json_schema: {finish} {text!r}")

    # --- regex, choice, grammar --------------------------------------------------------------
    regexes = [r"\d{3}-\d{3}-\d{4}", r"(yes|no), because [a-z ]{5,40}\.", r"[A-Z][a-z]{2,12}( [A-Z][a-z]{2,12})?"]
    n_re = 0
    for rx in regexes:
        for seed in range(4):
            r = client.completions.create(model="default", prompt="Answer: ", max_tokens=40, temperature=0.9, seed=seed,
                                          extra_body={"guided_regex": rx})
            c = r.choices[0]
            if c.finish_reason == "stop":
                n_re += 1
                check(re.fullmatch(rx, c.text) is not None, f"guided_regex {rx!r}: {c.text!r} does not match")
    check(n_re >= 8, f"only {n_re} of 12 regex answers finished")
    choices = ["positive", "negative", "neutral"]
    for p in ["I love this film!", "This is the worst day.", "The meeting is at noon."]:
        text, finish = chat(client, f"Sentiment of: {p}", extra_body={"guided_choice": choices})
        check(finish == "stop" and text in choices, f"guided_choice: {text!r} {finish}")
    gbnf = 'root ::= "The answer is " [0-9]+ "."'
    text, finish = chat(client, "What is 6 times 7?", extra_body={"guided_grammar": gbnf})
    check(finish == "stop" and re.fullmatch(r"The answer is [0-9]+\.", text) is not None, f"guided_grammar: {text!r}")
    text, finish = chat(client, "Pick a colour.", extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    check(text in ("red", "blue"), f"structured_outputs choice: {text!r}")
    print(f"guided_regex: {n_re} finished answers full-match; guided_choice, guided_grammar, structured_outputs ok")

    # --- bad and hostile: 400 naming the field, within a bound -------------------------------
    deep = {"type": "string"}
    for _ in range(60):
        deep = {"type": "array", "items": deep}
    hostile = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}}, "response_format",
         "deeper"),
        ({"guided_json": {"enum": [f"value {i}" for i in range(5000)]}}, "guided_json", "enum"),
        ({"guided_json": {"type": "string", "maxLenght": 3}}, "guided_json", "maxLenght"),
        ({"guided_json": {"type": "integer", "maximum": 10}}, "guided_json", "maximum"),
        ({"guided_regex": "(a)\\1"}, "guided_regex", "unsupported escape"),
        ({"guided_regex": "a{99999}"}, "guided_regex", "limit"),
        ({"guided_grammar": 'root ::= ("" | ""){64} "a"'}, "guided_grammar", "ambiguous"),
        ({"guided_grammar": "root ::= root \"a\""}, "guided_grammar", "left-recursive"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
    ]
    worst = 0.0
    for body, param, words in hostile:
        full = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        full.update(body)
        req = urllib.request.Request(args.base_url + "/v1/chat/completions", data=json.dumps(full).encode(),
                                     headers={"Content-Type": "application/json"})
        t = time.time()
        try:
            urllib.request.urlopen(req, timeout=30)
            check(False, f"hostile {param}: accepted")
            continue
        except urllib.error.HTTPError as e:
            took = time.time() - t
            worst = max(worst, took)
            err = json.loads(e.read())["error"]
            check(e.code == 400 and err.get("param") == param and words in err["message"],
                  f"hostile {param}: {e.code} {err}")
        check(took < 2.0, f"hostile {param}: the 400 took {took:.2f} s")
    # the server still serves, the same greedy answer
    again, _ = chat(client, "Write one sentence about the sea.", max_tokens=40)
    check(again == plain_alone, "the plain answer changed after the hostile requests")
    print(f"hostile: {len(hostile)} bodies refused with 400 naming the field, slowest {worst * 1000:.0f} ms")

    tool_calls(client, args.base_url)

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("structured output: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
