#!/usr/bin/env python3
"""Integration test of an OpenAI-compatible server with the official `openai` client.

  source scripts/lib.sh; python_env
  build/bin/troupe serve MODEL --host 127.0.0.1 --port 8000 &
  $TROUPE_PY tests/serve/openai_client_test.py --base-url http://127.0.0.1:8000 [--api-key K]
      [--model NAME] [--skip name,...] [--only name,...] [--list]

Prints one PASS/FAIL/SKIP line per check and exits 1 if any check failed (2 if the server
can't be reached). Requests are short (max_tokens <= 32) so a 135M model on a 2-core CPU
gets through it in well under a minute. --skip is for debugging against servers that lack a
feature (llama-server: no n>1, no legacy completion logprobs, no echo).
"""
import argparse
import json
import math
import sys
import time
import traceback

import httpx
import openai

CHAT_MSGS = [{"role": "user", "content": "Name three colors of the rainbow."}]
PROMPT = "The three primary colors are"
STOP_PROMPT = "Here is a list of fruits:\n1. Apple\n2."
MAX_TOKENS = 24
SEED = 42


class CheckFailed(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise CheckFailed(msg)


class Ctx:
    def __init__(self, client, model):
        self.client, self.model = client, model
        self._cache = {}

    def cached(self, key, fn):
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    # --- the greedy reference results, shared by several checks ---
    def chat_greedy(self):
        return self.cached("chat_greedy", lambda: self.client.chat.completions.create(
            model=self.model, messages=CHAT_MSGS, max_tokens=MAX_TOKENS, temperature=0, seed=SEED))

    def completion_greedy(self, prompt=PROMPT, max_tokens=MAX_TOKENS):
        return self.cached(("completion_greedy", prompt, max_tokens), lambda: self.client.completions.create(
            model=self.model, prompt=prompt, max_tokens=max_tokens, temperature=0, seed=SEED))


def check_usage(usage, max_tokens, what):
    check(usage is not None, f"{what}: no usage")
    check(usage.prompt_tokens > 0, f"{what}: prompt_tokens = {usage.prompt_tokens}")
    check(0 < usage.completion_tokens <= max_tokens,
          f"{what}: completion_tokens = {usage.completion_tokens}, max_tokens {max_tokens}")
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
          f"{what}: total_tokens {usage.total_tokens} != {usage.prompt_tokens} + {usage.completion_tokens}")


# ----------------------------------------------------------------------------------------------
# Checks: name -> function(ctx) that raises on failure and may return a note

CHECKS = []


def register(name):
    def deco(fn):
        CHECKS.append((name, fn))
        return fn
    return deco


@register("models")
def t_models(ctx):
    ids = [m.id for m in ctx.client.models.list().data]
    check(ctx.model in ids, f"{ctx.model!r} not in /v1/models: {ids}")
    return f"{len(ids)} model(s)"


@register("chat")
def t_chat(ctx):
    r = ctx.chat_greedy()
    check(len(r.choices) == 1, f"{len(r.choices)} choices")
    c = r.choices[0]
    check(c.index == 0, f"index {c.index}")
    check(c.message.role == "assistant", f"role {c.message.role!r}")
    check(bool(c.message.content and c.message.content.strip()), f"empty content {c.message.content!r}")
    check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}")
    check_usage(r.usage, MAX_TOKENS, "chat")
    if c.finish_reason == "length":
        check(r.usage.completion_tokens == MAX_TOKENS,
              f"finish_reason length but completion_tokens {r.usage.completion_tokens} != {MAX_TOKENS}")
    check(r.object == "chat.completion", f"object {r.object!r}")
    return repr(c.message.content[:60])


@register("json_mode")
def t_json_mode(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        max_tokens=200, temperature=0, response_format={"type": "json_object"})
    c = r.choices[0]
    check(c.finish_reason == "stop", f"finish_reason {c.finish_reason!r}: {c.message.content!r}")
    obj = json.loads(c.message.content)
    check(isinstance(obj, dict), f"not an object: {c.message.content!r}")
    return repr(c.message.content[:60])


@register("chat_stream")
def t_chat_stream(ctx):
    ref = ctx.chat_greedy()
    parts, finish, roles, n_chunks = [], None, set(), 0
    for ch in ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=MAX_TOKENS,
                                                 temperature=0, seed=SEED, stream=True):
        n_chunks += 1
        check(ch.object == "chat.completion.chunk", f"object {ch.object!r}")
        for c in ch.choices:
            check(c.index == 0, f"chunk index {c.index}")
            if c.delta.role:
                roles.add(c.delta.role)
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    text = "".join(parts)
    check(text == ref.choices[0].message.content,
          f"streamed {text!r} != non-streamed {ref.choices[0].message.content!r}")
    check(finish == ref.choices[0].finish_reason, f"finish_reason {finish!r} != {ref.choices[0].finish_reason!r}")
    check(roles <= {"assistant"}, f"roles {roles}")
    return f"{n_chunks} chunks"


@register("completion")
def t_completion(ctx):
    r = ctx.completion_greedy()
    check(len(r.choices) == 1, f"{len(r.choices)} choices")
    c = r.choices[0]
    check(bool(c.text), "empty text")
    check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}")
    check_usage(r.usage, MAX_TOKENS, "completion")
    check(r.object == "text_completion", f"object {r.object!r}")
    return repr(c.text[:60])


@register("completion_stream")
def t_completion_stream(ctx):
    ref = ctx.completion_greedy()
    parts, finish = [], None
    for ch in ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                            temperature=0, seed=SEED, stream=True):
        for c in ch.choices:
            check(c.index == 0, f"chunk index {c.index}")
            parts.append(c.text or "")
            if c.finish_reason:
                finish = c.finish_reason
    text = "".join(parts)
    check(text == ref.choices[0].text, f"streamed {text!r} != non-streamed {ref.choices[0].text!r}")
    check(finish == ref.choices[0].finish_reason, f"finish_reason {finish!r} != {ref.choices[0].finish_reason!r}")


@register("include_usage")
def t_include_usage(ctx):
    ref = ctx.completion_greedy()
    chunks = list(ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                                temperature=0, seed=SEED, stream=True,
                                                stream_options={"include_usage": True}))
    check(chunks, "no chunks")
    last = chunks[-1]
    check(last.usage is not None, "last chunk has no usage")
    check(not last.choices, f"usage chunk has choices: {last.choices}")
    check_usage(last.usage, MAX_TOKENS, "stream usage")
    check(all(ch.usage is None for ch in chunks[:-1]), "usage on a chunk before the last")
    check((last.usage.prompt_tokens, last.usage.completion_tokens) ==
          (ref.usage.prompt_tokens, ref.usage.completion_tokens),
          f"stream usage {last.usage} != non-streamed {ref.usage}")
    # chat too
    chunks = list(ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=8,
                                                     temperature=0, seed=SEED, stream=True,
                                                     stream_options={"include_usage": True}))
    check(chunks and chunks[-1].usage is not None, "chat: last chunk has no usage")
    check_usage(chunks[-1].usage, 8, "chat stream usage")


def _check_n3_choices(choices, what):
    idx = sorted(c.index for c in choices)
    check(idx == [0, 1, 2], f"{what}: indexes {idx}")
    for c in choices:
        check(c.finish_reason in ("stop", "length"), f"{what}: choice {c.index} finish_reason {c.finish_reason!r}")


@register("n3_chat")
def t_n3_chat(ctx):
    r = ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=12, temperature=1.0,
                                           seed=SEED, n=3)
    check(len(r.choices) == 3, f"{len(r.choices)} choices")
    _check_n3_choices(r.choices, "chat n=3")
    check(r.usage.completion_tokens <= 3 * 12, f"completion_tokens {r.usage.completion_tokens} > 36")
    texts = [c.message.content for c in r.choices]
    return f"{len(set(texts))} distinct of 3"


@register("n3_chat_stream")
def t_n3_chat_stream(ctx):
    texts, finish = {}, {}
    for ch in ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=12,
                                                 temperature=1.0, seed=SEED, n=3, stream=True):
        for c in ch.choices:
            check(c.index in (0, 1, 2), f"chunk index {c.index}")
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                check(c.index not in finish, f"two finish_reasons for choice {c.index}")
                finish[c.index] = c.finish_reason
    check(sorted(texts) == [0, 1, 2], f"indexes seen {sorted(texts)}")
    check(sorted(finish) == [0, 1, 2], f"finish_reason for {sorted(finish)}")


@register("n3_completion")
def t_n3_completion(ctx):
    r = ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=12, temperature=1.0,
                                      seed=SEED, n=3)
    check(len(r.choices) == 3, f"{len(r.choices)} choices")
    _check_n3_choices(r.choices, "completion n=3")
    seen = set()
    for ch in ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=12, temperature=1.0,
                                            seed=SEED, n=3, stream=True):
        for c in ch.choices:
            seen.add(c.index)
    check(seen == {0, 1, 2}, f"streamed indexes {sorted(seen)}")


@register("logprobs_completion")
def t_logprobs_completion(ctx):
    r = ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=8, temperature=0, seed=SEED,
                                      logprobs=2)
    c = r.choices[0]
    lp = c.logprobs
    check(lp is not None, "no logprobs")
    n = r.usage.completion_tokens
    check(lp.tokens is not None and len(lp.tokens) == n, f"{len(lp.tokens or [])} tokens, usage says {n}")
    check(lp.token_logprobs is not None and len(lp.token_logprobs) == n,
          f"{len(lp.token_logprobs or [])} token_logprobs for {n} tokens")
    check(lp.top_logprobs is not None and len(lp.top_logprobs) == n,
          f"{len(lp.top_logprobs or [])} top_logprobs for {n} tokens")
    if lp.text_offset is not None:
        check(len(lp.text_offset) == n, f"{len(lp.text_offset)} text_offset for {n} tokens")
        check(all(a <= b for a, b in zip(lp.text_offset, lp.text_offset[1:])), f"text_offset {lp.text_offset}")
    check("".join(lp.tokens) == c.text, f"tokens {lp.tokens} do not join to {c.text!r}")
    for i, (tok_lp, top) in enumerate(zip(lp.token_logprobs, lp.top_logprobs)):
        check(tok_lp is not None and tok_lp <= 1e-6 and math.isfinite(tok_lp), f"token {i}: logprob {tok_lp}")
        check(top is not None and 1 <= len(top) <= 3, f"token {i}: top_logprobs {top}")
        check(all(v <= 1e-6 for v in top.values()), f"token {i}: top_logprobs {top}")
        # greedy: the chosen token is the most likely one
        check(tok_lp >= max(top.values()) - 1e-3, f"token {i}: greedy logprob {tok_lp} < top {top}")
    return f"{n} tokens, first {lp.tokens[0]!r} {lp.token_logprobs[0]:.3f}"


@register("logprobs_chat")
def t_logprobs_chat(ctx):
    r = ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=8, temperature=0,
                                           seed=SEED, logprobs=True, top_logprobs=2)
    c = r.choices[0]
    check(c.logprobs is not None and c.logprobs.content is not None, "no logprobs.content")
    items = c.logprobs.content
    n = r.usage.completion_tokens
    check(len(items) == n, f"{len(items)} logprob entries, usage says {n}")
    check("".join(it.token for it in items) == (c.message.content or ""),
          f"tokens {[it.token for it in items]} do not join to {c.message.content!r}")
    for i, it in enumerate(items):
        check(it.logprob <= 1e-6 and math.isfinite(it.logprob), f"token {i}: logprob {it.logprob}")
        check(len(it.top_logprobs) == 2, f"token {i}: {len(it.top_logprobs)} top_logprobs")
        tops = [t.logprob for t in it.top_logprobs]
        check(all(v <= 1e-6 for v in tops), f"token {i}: top_logprobs {tops}")
        check(tops == sorted(tops, reverse=True), f"token {i}: top_logprobs not sorted {tops}")
        check(it.logprob >= tops[0] - 1e-3, f"token {i}: greedy logprob {it.logprob} < top {tops[0]}")
    # streamed: the same entries, spread over the chunks
    streamed = []
    for ch in ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=8,
                                                 temperature=0, seed=SEED, logprobs=True, top_logprobs=2,
                                                 stream=True):
        for cc in ch.choices:
            if cc.logprobs and cc.logprobs.content:
                streamed += cc.logprobs.content
    check([it.token for it in streamed] == [it.token for it in items],
          f"streamed logprob tokens {[it.token for it in streamed]} != {[it.token for it in items]}")
    return f"{n} tokens"


@register("stop")
def t_stop(ctx):
    ref = ctx.completion_greedy(STOP_PROMPT, 16).choices[0].text
    r = ctx.client.completions.create(model=ctx.model, prompt=STOP_PROMPT, max_tokens=16, temperature=0,
                                      seed=SEED, stop=["\n"])
    c = r.choices[0]
    check("\n" not in c.text, f"text contains the stop string: {c.text!r}")
    if "\n" in ref:
        want = ref[:ref.index("\n")]
        check(c.text == want, f"text {c.text!r} != greedy text up to the stop {want!r}")
        check(c.finish_reason == "stop", f"stopped but finish_reason {c.finish_reason!r}")
    else:  # greedy text has no newline: the stop string changes nothing
        check(c.text == ref, f"text {c.text!r} != greedy text {ref!r}")
        want = ctx.completion_greedy(STOP_PROMPT, 16).choices[0].finish_reason
        check(c.finish_reason == want, f"finish_reason {c.finish_reason!r} != {want!r} without stop")
    # streamed: the stop string must not leak into the deltas either
    parts, finish = [], None
    for ch in ctx.client.completions.create(model=ctx.model, prompt=STOP_PROMPT, max_tokens=16, temperature=0,
                                            seed=SEED, stop=["\n"], stream=True):
        for cc in ch.choices:
            parts.append(cc.text or "")
            finish = cc.finish_reason or finish
    check("".join(parts) == c.text, f"streamed {''.join(parts)!r} != non-streamed {c.text!r}")
    check(finish == c.finish_reason, f"streamed finish_reason {finish!r} != {c.finish_reason!r}")
    return f"{c.text!r} ({c.finish_reason})"


@register("seed_same")
def t_seed_same(ctx):
    def gen():
        return ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=16, temperature=0.8,
                                             seed=1234).choices[0].text
    a, b = gen(), gen()
    check(a == b, f"same seed, different text: {a!r} vs {b!r}")
    chat = [ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=16,
                                               temperature=0.8, seed=1234).choices[0].message.content
            for _ in range(2)]
    check(chat[0] == chat[1], f"chat: same seed, different text: {chat[0]!r} vs {chat[1]!r}")


@register("seed_diff")
def t_seed_diff(ctx):
    texts = [ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=16, temperature=0.8,
                                           seed=s).choices[0].text for s in (1, 2, 3)]
    k = len(set(texts))
    # 16 tokens at temperature 0.8: three seeds giving one identical text would mean the
    # seed is ignored.
    check(k > 1, f"seeds 1, 2, 3 gave the same text: {texts[0]!r}")
    return f"{k} distinct of 3"


@register("echo")
def t_echo(ctx):
    ref = ctx.completion_greedy().choices[0].text
    r = ctx.client.completions.create(model=ctx.model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                      seed=SEED, echo=True)
    t = r.choices[0].text
    check(t.startswith(PROMPT), f"echo text does not start with the prompt: {t!r}")
    check(t == PROMPT + ref, f"echo text {t!r} != prompt + completion {PROMPT + ref!r}")


@register("bad_request")
def t_bad_request(ctx):
    try:
        ctx.client.chat.completions.create(model=ctx.model, messages=CHAT_MSGS, max_tokens=4, temperature=5)
    except openai.BadRequestError as e:
        return f"400: {str(e)[:80]}"
    except openai.APIStatusError as e:
        raise CheckFailed(f"expected 400, got {e.status_code}: {str(e)[:120]}")
    raise CheckFailed("temperature=5 was accepted")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (\"/v1\" is appended)")
    p.add_argument("--api-key", default="none")
    p.add_argument("--model", default=None, help="default: the first id from /v1/models")
    p.add_argument("--skip", default="", help="comma-separated checks to skip (debugging only)")
    p.add_argument("--only", default="", help="comma-separated checks to run")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks for failures")
    a = p.parse_args()
    names = [n for n, _ in CHECKS]
    if a.list:
        print("\n".join(names))
        return 0
    skip = {s for s in a.skip.split(",") if s}
    only = {s for s in a.only.split(",") if s}
    for s in skip | only:
        if s not in names:
            p.error(f"unknown check {s!r}; checks: {', '.join(names)}")

    base = a.base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    # No retries (a retry would hide a server error) and no keep-alive: a pooled connection that the
    # server has just closed (llama-server drops idle ones after 5 s) fails with APIConnectionError.
    http = openai.DefaultHttpxClient(limits=httpx.Limits(max_keepalive_connections=0))
    client = openai.OpenAI(base_url=base, api_key=a.api_key, timeout=a.timeout, max_retries=0, http_client=http)
    model = a.model
    if model is None:
        try:
            model = client.models.list().data[0].id
        except Exception as e:  # noqa: BLE001
            print(f"FAIL setup: cannot list models at {base}: {type(e).__name__}: {e}")
            return 2
    ctx = Ctx(client, model)
    print(f"server {base}, model {model}, openai {openai.__version__}")
    failed, passed, skipped = [], 0, 0
    t_all = time.perf_counter()
    for name, fn in CHECKS:
        if name in skip or (only and name not in only):
            print(f"SKIP {name}")
            skipped += 1
            continue
        t0 = time.perf_counter()
        try:
            note = fn(ctx)
            print(f"PASS {name} ({time.perf_counter() - t0:.1f}s){': ' + note if note else ''}")
            passed += 1
        except CheckFailed as e:
            print(f"FAIL {name}: {e}")
            failed.append(name)
        except Exception as e:  # noqa: BLE001  (API errors etc. fail the check, not the run)
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}")
            if a.verbose:
                traceback.print_exc()
            failed.append(name)
        sys.stdout.flush()
    print(f"{passed} passed, {len(failed)} failed, {skipped} skipped in {time.perf_counter() - t_all:.1f}s"
          + (f"; failed: {','.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
