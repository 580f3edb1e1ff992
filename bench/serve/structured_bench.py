#!/usr/bin/env python3
"""Structured output's cost per token: a JSON schema vs no constraint, troupe and llama-server.

  python3 bench/serve/structured_bench.py [--model M.gguf] [--concurrency 1,8] [--out PREFIX]

Per server and concurrency C: C streams of chat requests (greedy, 128 output tokens at most),
4*C requests in all, first plain (ignore_eos, so 128 tokens) then with a JSON schema whose
instances are longer than 128 tokens (an array of 8 city objects), so both write about as
many tokens. Measured from the SSE stream: the time per output token after the first (ITL)
and output tok/s over the whole batch; the first schema request of a server is reported
apart (it compiles the grammar and fills the mask table). Servers, started fresh, 2 threads:
  troupe         troupe serve M -t 2 --max-num-seqs C
  llama-server   llama-server -m M -t 2 -np C -c C*2048 -fa on -cb  (its json_schema is
                 converted to a GBNF grammar and applied by its own grammar sampler)
Writes PREFIX.json and PREFIX.md (default bench/results/serve-structured-smollm2-q4_1).
"""
import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOME = os.environ.get("TROUPE_HOME", os.path.expanduser("~/.cache/troupe"))
PEER_BIN = os.environ.get("PEER_BIN", f"{HOME}/peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin")

SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20},
                       "population": {"type": "integer"}},
        "required": ["city", "country", "population"],
        "additionalProperties": False,
    },
    "minItems": 8,
    "maxItems": 8,
}
PROMPTS = ["List eight large cities with their country and population.",
           "Give me eight cities in Europe, with countries and populations.",
           "Name eight cities in Asia and how many people live there.",
           "Eight cities of the Americas, their countries and populations, please."]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_health(port, proc, timeout=300):
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            raise RuntimeError("server exited during start-up")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become healthy")


def one_request(port, prompt, schema):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 128,
            "temperature": 0, "stream": True}
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "cities", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:300]!r}")
    times, text = [], ""
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for c in ev.get("choices", []):
            piece = (c.get("delta") or {}).get("content") or ""
            if piece:
                times.append(time.perf_counter() - t0)
                text += piece
    conn.close()
    return {"start": t0, "times": times, "text": text}


def run_batch(port, c, schema, n):
    results, lock = [], threading.Lock()
    todo = list(range(n))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            r = one_request(port, PROMPTS[i % len(PROMPTS)], schema)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    # chunks ~ tokens for both servers (one SSE event per token when streaming)
    tokens = sum(len(r["times"]) for r in results)
    itls = [(r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in results if len(r["times"]) > 1]
    valid = 0
    if schema:
        for r in results:
            try:
                json.loads(r["text"])
                valid += 1
            except ValueError:
                pass  # cut by max_tokens: expected, the schema's instances are longer
    return {"tok_s": tokens / wall, "itl_ms": 1000 * statistics.mean(itls), "tokens": tokens, "wall_s": wall,
            "requests": n, "complete_json": valid}


def start(kind, model, c, port):
    log = tempfile.NamedTemporaryFile(prefix=f"{kind}-", suffix=".log", delete=False)
    if kind == "troupe":
        cmd = [os.path.join(ROOT, "build/bin/troupe"), "serve", "-m", model, "-t", "2", "--port", str(port),
               "--max-num-seqs", str(c)]
    else:
        cmd = [os.path.join(PEER_BIN, "llama-server"), "-m", model, "-t", "2", "--port", str(port), "-np", str(c),
               "-c", str(c * 2048), "-fa", "on", "-cb"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_health(port, proc)
    return proc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=f"{HOME}/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--servers", default="troupe,llama-server")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/serve-structured-smollm2-q4_1"))
    args = ap.parse_args()
    rows = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        for kind in args.servers.split(","):
            if kind == "llama-server" and not os.path.exists(os.path.join(PEER_BIN, "llama-server")):
                print(f"skip llama-server: not built at {PEER_BIN} (scripts/peer/build-llamacpp.sh)")
                continue
            port = free_port()
            proc = start(kind, args.model, c, port)
            try:
                one_request(port, PROMPTS[0], False)  # warm-up
                first = one_request(port, PROMPTS[1], True)
                cold_ms = 1000 * (first["times"][-1] - first["times"][0]) / max(len(first["times"]) - 1, 1)
                plain = run_batch(port, c, False, 4 * c)
                schema = run_batch(port, c, True, 4 * c)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            row = {"server": kind, "c": c, "plain": plain, "schema": schema, "first_schema_itl_ms": cold_ms,
                   "itl_ratio": schema["itl_ms"] / plain["itl_ms"], "tok_s_ratio": schema["tok_s"] / plain["tok_s"]}
            rows.append(row)
            print(f"{kind:13s} C={c}: plain {plain['tok_s']:.1f} tok/s ITL {plain['itl_ms']:.2f} ms | schema "
                  f"{schema['tok_s']:.1f} tok/s ITL {schema['itl_ms']:.2f} ms (x{row['itl_ratio']:.3f}) | first schema "
                  f"request ITL {cold_ms:.2f} ms", flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, " + next(
        (l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    with open(args.out + ".json", "w") as f:
        json.dump({"machine": machine, "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"# Structured output: JSON schema vs none, per output token\n\n{time.strftime('%Y-%m-%d')}, {machine}; "
                f"SmolLM2-135M-Instruct Q4_1, greedy, 128 output tokens at most, 4*C requests per cell, "
                f"`python3 bench/serve/structured_bench.py`.\n\n")
        f.write("| server | C | plain tok/s | schema tok/s | plain ITL ms | schema ITL ms | ITL schema/plain | "
                "first schema request ITL ms |\n|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['server']} | {r['c']} | {r['plain']['tok_s']:.1f} | {r['schema']['tok_s']:.1f} | "
                    f"{r['plain']['itl_ms']:.2f} | {r['schema']['itl_ms']:.2f} | {r['itl_ratio']:.3f} | "
                    f"{r['first_schema_itl_ms']:.2f} |\n")
    print(f"wrote {args.out}.md")


if __name__ == "__main__":
    sys.exit(main())
