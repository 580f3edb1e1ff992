#!/usr/bin/env python3
"""Serving load generator for OpenAI-compatible servers (troupe serve, llama-server, vLLM).

Modelled on `vllm bench serve`; needs only the standard library and aiohttp (scripts/lib.sh
python_env installs it into $TROUPE_HOME/venv). Every request streams
(stream: true, stream_options.include_usage, ignore_eos, temperature 0, max_tokens = output length).

  bench_serve.py --base-url http://127.0.0.1:8000 --dataset random \\
      --random-input-len 288 --random-range-ratio 0.78 --random-output-len 128 \\
      --num-prompts 200 --max-concurrency 8 --result-json out.json --label troupe-c8

Prompts are made without a tokenizer: random prompts are runs of common English words, trimmed
to the requested token count with the server's POST /tokenize ({"prompt": text} -> {"tokens",
"count"}, troupe/vLLM; or {"content": text} -> {"tokens"}, llama-server). If neither works, one
word is counted as one token.

Metrics (successful requests only):
  TTFT  request start -> first chunk with non-empty text
  ITL   gaps between later chunks with non-empty text (all requests pooled)
  TPOT  (E2E - TTFT) / (output tokens - 1), per request
  E2E   request start -> end of the stream
  output tokens: usage.completion_tokens when the server sends usage, else the number of chunks
  with text; input tokens: usage.prompt_tokens when sent, else the /tokenize count.
"""
import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field

try:
    import aiohttp
except ImportError:  # make_sharegpt.py imports WORDS from here without aiohttp
    aiohttp = None

# Common English words; in BPE vocabularies almost all of them are one token with a leading space.
WORDS = """the of and to in is was for on that with as by at it from he his be an are this which
or had not but have they were has one all their been she her we there would who more can will
first after two new when other time also into if about most only some year people over these
its up out so them years many such than city made may then school state where world part later
three under during war used while called its before number between being both family area life
known work since well each any through later name what same found house four water long small
back because high great day place still must while old little own several should those every
great very around much world early without large against five government group music game
country land line among along often form left same days town next early book team main name
season end local south north east west field light paper river road story hand party power
study system order point right side child week house plan open case money answer color sound
picture market table garden window letter morning evening summer winter spring animal forest
mountain island ocean bridge street village doctor teacher student friend mother father
brother sister people kitchen dinner coffee bread apple orange music movie travel ticket
station airport hotel office computer phone question problem reason result change interest
history science language number energy moment nature simple strong happy quiet bright warm
cold green blue black white heavy clean short young ready early quick slow kind true free
clear full real sure deep easy best better possible important different public private
general common special certain recent local major national social human single whole
""".split()


# ----------------------------------------------------------------------------------------------
# HTTP helpers

def _headers(args):
    h = {"Content-Type": "application/json"}
    if args.api_key:
        h["Authorization"] = f"Bearer {args.api_key}"
    return h


async def get_default_model(session, args):
    async with session.get(args.base_url + "/v1/models", headers=_headers(args)) as r:
        r.raise_for_status()
        data = await r.json(content_type=None)
    ids = [m.get("id") for m in data.get("data", []) if m.get("id")]
    if not ids:
        raise RuntimeError(f"GET /v1/models returned no models: {data}")
    return ids[0]


class Tokenizer:
    """Counts tokens through the server's /tokenize; falls back to one token per word."""

    def __init__(self, session, args):
        self.session, self.args = session, args
        self.mode = None  # "prompt" | "content" | "words"
        self.sem = asyncio.Semaphore(8)

    async def _try(self, key, text):
        body = {key: text}
        if key == "prompt" and self.args.model:
            body["model"] = self.args.model
        try:
            async with self.session.post(self.args.base_url + self.args.tokenize_path, json=body,
                                         headers=_headers(self.args)) as r:
                if r.status != 200:
                    return None
                data = await r.json(content_type=None)
        except (aiohttp.ClientError, json.JSONDecodeError, asyncio.TimeoutError):
            return None
        if not isinstance(data, dict):
            return None
        if isinstance(data.get("count"), int):
            return data["count"]
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
        return None

    async def probe(self):
        text = "hello world, this is a test"
        for key in ("prompt", "content"):
            n = await self._try(key, text)
            if n is not None and n > 0:
                self.mode = key
                return key
        self.mode = "words"
        return "words"

    async def count(self, text):
        if self.mode is None:
            await self.probe()
        if self.mode == "words":
            return len(text.split())
        async with self.sem:
            n = await self._try(self.mode, text)
        if n is None:
            raise RuntimeError(f"/tokenize stopped working (mode {self.mode})")
        return n


# ----------------------------------------------------------------------------------------------
# Datasets. Each request: dict(prompt=str, prompt_len=int, output_len=int)

def _lens(rng, base, ratio):
    lo = max(1, int(base * (1 - ratio)))
    hi = max(lo, int(base * (1 + ratio)))
    return rng.randint(lo, hi)


async def make_random_prompt(tok, rng, target):
    """Random common words, cut to about `target` tokens (within ±1 where the tokenizer allows)."""
    words = [rng.choice(WORDS) for _ in range(int(target * 1.5) + 8)]
    k = max(1, min(len(words), target))  # first guess: one token per word
    best = None
    for _ in range(6):
        text = " ".join(words[:k])
        n = await tok.count(text)
        if best is None or abs(n - target) < abs(best[1] - target):
            best = (text, n)
        if abs(n - target) <= 1 or tok.mode == "words":
            break
        # secant step on the (close to linear) words -> tokens map
        nk = max(1, round(k * target / max(n, 1)))
        if nk == k:
            nk = k + (1 if n < target else -1)
        if nk > len(words):
            words += [rng.choice(WORDS) for _ in range(nk - len(words))]
        k = max(1, nk)
    return best


async def build_random(tok, args):
    rng = random.Random(args.seed)
    specs = [(_lens(rng, args.random_input_len, args.random_range_ratio),
              _lens(rng, args.random_output_len, args.random_output_range_ratio))
             for _ in range(args.num_prompts)]
    # one RNG per prompt, so the prompt text does not depend on scheduling of the /tokenize calls
    seeds = [rng.getrandbits(64) for _ in specs]

    async def one(i):
        text, n = await make_random_prompt(tok, random.Random(seeds[i]), specs[i][0])
        return {"prompt": text, "prompt_len": n, "output_len": specs[i][1],
                "requested_input_len": specs[i][0]}
    return list(await asyncio.gather(*(one(i) for i in range(len(specs)))))


async def build_sharegpt(tok, args):
    if not args.dataset_path:
        raise SystemExit("--dataset sharegpt needs --dataset-path")
    with open(args.dataset_path) as f:
        data = json.load(f)
    pairs = []
    for conv in data:
        turns = conv.get("conversations") or conv.get("conversation") or []
        if len(turns) < 2:
            continue
        a, b = turns[0], turns[1]
        if a.get("from") not in ("human", "user") or b.get("from") not in ("gpt", "assistant"):
            continue
        pairs.append((a.get("value", ""), b.get("value", "")))
    rng = random.Random(args.seed)
    rng.shuffle(pairs)
    out = []
    idx = 0
    batch = 32
    while len(out) < args.num_prompts and idx < len(pairs):
        chunk = pairs[idx: idx + batch]
        idx += batch

        async def lens(p):
            pl = await tok.count(p[0])
            ol = args.sharegpt_output_len or await tok.count(p[1])
            return pl, ol
        counted = await asyncio.gather(*(lens(p) for p in chunk))
        for (prompt, _), (pl, ol) in zip(chunk, counted):
            # vLLM's filter: drop tiny and over-long pairs
            if pl < 4 or ol < 4 or pl > args.sharegpt_max_prompt_len or pl + ol > args.sharegpt_max_len:
                continue
            out.append({"prompt": prompt, "prompt_len": pl, "output_len": ol})
            if len(out) == args.num_prompts:
                break
    if len(out) < args.num_prompts:
        print(f"warning: only {len(out)} usable ShareGPT conversations", file=sys.stderr)
    return out


# ----------------------------------------------------------------------------------------------
# One streamed request

@dataclass
class Result:
    ok: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list = field(default_factory=list)
    chunks: int = 0
    usage: dict = None
    start: float = 0.0


def _payload(args, req):
    body = {
        "model": args.model,
        "max_tokens": req["output_len"],
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if args.endpoint.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": req["prompt"]}]
    else:
        body["prompt"] = req["prompt"]
    if args.extra_body:
        body.update(json.loads(args.extra_body))
    return body


def _chunk_text(obj, chat):
    s = ""
    for ch in obj.get("choices") or []:
        if chat:
            d = ch.get("delta") or {}
            s += (d.get("content") or "") + (d.get("reasoning_content") or "")
        else:
            s += ch.get("text") or ""
    return s


async def send(session, args, req):
    res = Result(prompt_len=req["prompt_len"])
    chat = args.endpoint.endswith("/chat/completions")
    url = args.base_url + args.endpoint
    st = time.perf_counter()
    res.start = st
    last = None
    try:
        async with session.post(url, json=_payload(args, req), headers=_headers(args)) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return res
            buf = b""
            async for raw in r.content:
                buf += raw
                if not buf.endswith(b"\n"):
                    continue  # partial line
                line, buf = buf.strip(), b""
                if not line or line.startswith(b":") or not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = f"stream error: {json.dumps(obj['error'])[:300]}"
                    return res
                if obj.get("usage"):
                    res.usage = obj["usage"]
                if _chunk_text(obj, chat):
                    now = time.perf_counter()
                    if last is None:
                        res.ttft = now - st
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.chunks += 1
        res.e2e = time.perf_counter() - st
    except Exception as e:  # noqa: BLE001  (any failure counts as a failed request)
        res.error = f"{type(e).__name__}: {e}"
        return res
    if res.chunks == 0:
        res.error = "no content in the stream"
        return res
    u = res.usage or {}
    res.output_tokens = int(u.get("completion_tokens") or res.chunks)
    if u.get("prompt_tokens"):
        res.prompt_len = int(u["prompt_tokens"])
    res.ok = True
    return res


# ----------------------------------------------------------------------------------------------
# Driver and report

def pct(xs, p):
    """Percentile with linear interpolation (numpy's default)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def summarize(vals_s, percentiles):
    ms = [v * 1000.0 for v in vals_s]
    d = {"mean": sum(ms) / len(ms) if ms else 0.0}
    for p in percentiles:
        d[f"p{p:g}"] = pct(ms, p)
    return d


async def run(args):
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    # A new connection per request (as vLLM's bench does): servers differ in keep-alive limits,
    # and a pooled connection the server has just closed fails the request
    # ("Can not write request body").
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        if not args.model:
            args.model = await get_default_model(session, args)
        tok = Tokenizer(session, args)
        mode = await tok.probe()
        print(f"model {args.model}; token counts via "
              f"{'/tokenize {' + repr(mode) + ': text}' if mode != 'words' else 'word count (no /tokenize)'}",
              file=sys.stderr)
        t0 = time.perf_counter()
        reqs = await (build_random(tok, args) if args.dataset == "random" else build_sharegpt(tok, args))
        print(f"built {len(reqs)} prompts in {time.perf_counter() - t0:.1f}s "
              f"(mean {sum(r['prompt_len'] for r in reqs) / max(len(reqs), 1):.1f} prompt tokens, "
              f"mean {sum(r['output_len'] for r in reqs) / max(len(reqs), 1):.1f} output tokens)",
              file=sys.stderr)

        for i in range(args.warmup):
            w = await send(session, args, {"prompt": reqs[i % len(reqs)]["prompt"],
                                           "prompt_len": 0, "output_len": min(8, reqs[0]["output_len"])})
            if not w.ok:
                raise SystemExit(f"warm-up request failed: {w.error}")

        sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        rng = random.Random(args.seed + 1)

        async def limited(req):
            if sem is None:
                return await send(session, args, req)
            async with sem:
                return await send(session, args, req)

        tasks = []
        start = time.perf_counter()
        for i, req in enumerate(reqs):
            tasks.append(asyncio.create_task(limited(req)))
            if args.request_rate != float("inf") and i + 1 < len(reqs):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = []
        done = 0
        for fut in asyncio.as_completed(tasks):
            results.append(await fut)
            done += 1
            if not args.quiet and (done % max(1, len(reqs) // 10) == 0 or done == len(reqs)):
                print(f"  {done}/{len(reqs)} done", file=sys.stderr)
        duration = time.perf_counter() - start
    return reqs, results, duration


def report(args, reqs, results, duration):
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    P = args.percentiles
    tin = sum(r.prompt_len for r in ok)
    tout = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itl = [x for r in ok for x in r.itl]
    m = {
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": duration,
        "total_input_tokens": tin,
        "total_output_tokens": tout,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": tout / duration if duration else 0.0,
        "total_token_throughput": (tin + tout) / duration if duration else 0.0,
        "ttft_ms": summarize([r.ttft for r in ok], P),
        "tpot_ms": summarize(tpot, P),
        "itl_ms": summarize(itl, P),
        "e2el_ms": summarize([r.e2e for r in ok], P),
        "mean_output_tokens_per_chunk": (tout / sum(r.chunks for r in ok)) if ok else 0.0,
        "usage_reported": sum(1 for r in ok if r.usage) if ok else 0,
    }
    W = 50
    L = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=W, c="=")]
    if args.label:
        L.append(f"{'Label:':<40}{args.label:>10}")

    def row(k, v, fmt="{:.2f}"):
        L.append(f"{k:<40}{fmt.format(v) if not isinstance(v, str) else v:>10}")
    row("Successful requests:", m["completed"], "{}")
    row("Failed requests:", m["failed"], "{}")
    row("Maximum request concurrency:", str(args.max_concurrency or "none"))
    row("Request rate (req/s):", "inf" if args.request_rate == float("inf") else f"{args.request_rate:g}")
    row("Benchmark duration (s):", duration)
    row("Total input tokens:", tin, "{}")
    row("Total generated tokens:", tout, "{}")
    row("Request throughput (req/s):", m["request_throughput"])
    row("Output token throughput (tok/s):", m["output_throughput"])
    row("Total Token throughput (tok/s):", m["total_token_throughput"])
    for key, title in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                       ("itl_ms", "Inter-token Latency"), ("e2el_ms", "End-to-end Latency")):
        L.append("{s:{c}^{n}}".format(s=title, n=W, c="-"))
        short = key.split("_")[0].upper()
        row(f"Mean {short} (ms):", m[key]["mean"])
        for p in P:
            row(f"P{p:g} {short} (ms):", m[key][f"p{p:g}"])
    L.append("=" * W)
    print("\n".join(L))
    if failed:
        errs = {}
        for r in failed:
            errs[r.error] = errs.get(r.error, 0) + 1
        for e, n in sorted(errs.items(), key=lambda x: -x[1])[:5]:
            print(f"failed x{n}: {e}", file=sys.stderr)
    if args.result_json:
        a = dict(vars(args))
        if a.get("api_key"):
            a["api_key"] = "***"
        a["request_rate"] = "inf" if a["request_rate"] == float("inf") else a["request_rate"]
        doc = {"label": args.label, "args": a,
               "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "metrics": m,
               "errors": [r.error for r in failed][:20]}
        if args.save_detailed:
            doc["requests"] = [{"ok": r.ok, "prompt_len": r.prompt_len, "output_tokens": r.output_tokens,
                                "ttft_s": r.ttft, "e2e_s": r.e2e, "itl_s": r.itl, "error": r.error}
                               for r in results]
        with open(args.result_json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return m


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions",
                   choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--model", default=None, help="default: the first id from GET /v1/models")
    p.add_argument("--api-key", default=None)
    p.add_argument("--tokenize-path", default="/tokenize")
    p.add_argument("--dataset", default="random", choices=["random", "sharegpt"])
    p.add_argument("--dataset-path", default=None, help="ShareGPT JSON (see make_sharegpt.py)")
    p.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="override the output length (default: token count of the first gpt reply)")
    p.add_argument("--sharegpt-max-prompt-len", type=int, default=1024)
    p.add_argument("--sharegpt-max-len", type=int, default=2048, help="prompt + output")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="input length uniform in [len*(1-r), len*(1+r)]")
    p.add_argument("--random-output-range-ratio", type=float, default=0.0,
                   help="same for the output length (default 0: fixed)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals, requests/s (inf: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--percentiles", default="50,90,99")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests before the run")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="per-session total timeout, s")
    p.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    p.add_argument("--label", default="")
    p.add_argument("--result-json", default=None)
    p.add_argument("--save-detailed", action="store_true", help="per-request data in the JSON")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    a.base_url = a.base_url.rstrip("/")
    a.percentiles = [float(x) for x in a.percentiles.split(",") if x.strip()]
    if a.num_prompts < 1:
        p.error("--num-prompts must be >= 1")
    if a.max_concurrency is not None and a.max_concurrency < 1:
        p.error("--max-concurrency must be >= 1")
    if a.request_rate <= 0:
        p.error("--request-rate must be > 0")
    return a


def main(argv=None):
    if aiohttp is None:
        raise SystemExit("bench_serve.py needs aiohttp (source scripts/lib.sh; python_env; $TROUPE_PY ...)")
    args = parse_args(argv)
    reqs, results, duration = asyncio.run(run(args))
    m = report(args, reqs, results, duration)
    return 0 if m["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
