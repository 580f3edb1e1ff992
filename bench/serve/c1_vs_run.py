#!/usr/bin/env python3
"""Concurrency 1: `troupe serve`'s decode speed beside `troupe run`'s, same prompt, same machine.

The issue's target is serving at concurrency 1 within 10% of `troupe run`'s decode speed.
On a 2-core machine a heavyweight load generator (bench_serve.py: aiohttp, JSON per chunk)
takes CPU from the server's compute threads, so this uses a light client: one streaming
request at a time over http.client (standard library only), a timestamp per SSE line and
nothing else. It reports, per round (run and serve alternate, since the VM's speed drifts):

  run     `troupe run -n 128 --ignore-eos`: its own decode tok/s, as ms per token, right
          before and right after the serve round (their mean is the round's reference)
  client  the gaps between streamed chunks the client saw (mean, p50, p99)
  server  /metrics: troupe:inter_token_latency_seconds (sum / count) and the engine's
          step, compute and KV-block-manager round-trip time per step

  bench/serve/c1_vs_run.py --troupe build/bin/troupe --repeat 39 --rounds 3
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import time


def metric(text, name):
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def run_decode_ms(troupe, prompt, threads):
    out = subprocess.run([troupe, "run", "-p", prompt, "-n", "128", "--temperature", "0", "--ignore-eos",
                          "-t", str(threads)], capture_output=True, text=True, check=True)
    m = re.search(r"decode: (\d+) tokens, ([0-9.]+) tok/s", out.stderr)
    if not m:
        sys.exit("no decode figure in `troupe run` output:\n" + out.stderr[-2000:])
    return 1000.0 / float(m.group(2))


def stream_once(port, model, prompt):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 128, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json", "Connection": "close"})
    resp = conn.getresponse()
    if resp.status != 200:
        sys.exit(f"serve answered {resp.status}: {resp.read()[:500]!r}")
    stamps = []
    while True:
        line = resp.fp.readline()
        if not line:
            break
        if line.startswith(b"data: [DONE]"):
            break
        if line.startswith(b"data: "):
            stamps.append(time.perf_counter())
    conn.close()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--troupe", default="build/bin/troupe")
    ap.add_argument("--repeat", type=int, default=39,
                    help="prompt = 'the quick brown fox jumps over the lazy dog' x N (7: 63 tokens, 39: 351)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6, help="streamed requests per serve round")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * args.repeat)
    rows = []
    for r in range(args.rounds):
        run_before = run_decode_ms(args.troupe, prompt, args.threads)
        srv = subprocess.Popen([args.troupe, "serve", "-t", str(args.threads), "--port", str(args.port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    c = http.client.HTTPConnection("127.0.0.1", args.port, timeout=2)
                    c.request("GET", "/health")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            c = http.client.HTTPConnection("127.0.0.1", args.port, timeout=5)
            c.request("GET", "/v1/models")
            model = json.loads(c.getresponse().read())["data"][0]["id"]
            gaps = []
            for _ in range(args.requests):
                gaps += stream_once(args.port, model, prompt)
            c = http.client.HTTPConnection("127.0.0.1", args.port, timeout=5)
            c.request("GET", "/metrics")
            m = c.getresponse().read().decode()
        finally:
            srv.terminate()
            srv.wait()
        # `troupe run` before and after the serve round: the VM's speed drifts by minutes.
        run_after = run_decode_ms(args.troupe, prompt, args.threads)
        run_ms = (run_before + run_after) / 2
        steps = metric(m, "troupe:engine_steps_total")
        row = {
            "run_ms": run_ms,
            "run_before_ms": run_before,
            "run_after_ms": run_after,
            "client_mean_ms": 1000 * statistics.fmean(gaps),
            "client_p50_ms": 1000 * statistics.median(gaps),
            "client_p99_ms": 1000 * sorted(gaps)[int(0.99 * (len(gaps) - 1))],
            "server_itl_ms": 1000 * metric(m, "troupe:inter_token_latency_seconds_sum") /
                             metric(m, "troupe:inter_token_latency_seconds_count"),
            "step_ms": 1000 * metric(m, "troupe:engine_step_seconds_total") / steps,
            "compute_ms": 1000 * metric(m, "troupe:engine_compute_seconds_total") / steps,
            "kv_ms": 1000 * metric(m, "troupe:engine_kv_seconds_total") / steps,
        }
        row["ratio"] = row["client_mean_ms"] / run_ms
        rows.append(row)
        print(f"round {r + 1}: run {run_before:.2f} / {run_after:.2f} ms/token (before / after) | serve client mean {row['client_mean_ms']:.2f} "
              f"p50 {row['client_p50_ms']:.2f} p99 {row['client_p99_ms']:.2f} ms, server ITL {row['server_itl_ms']:.2f} ms "
              f"| serve/run {row['ratio']:.3f} | per step: {row['step_ms']:.2f} ms, compute {row['compute_ms']:.2f}, "
              f"KV round trip {row['kv_ms']:.3f}", flush=True)
    ratios = sorted(r["ratio"] for r in rows)
    print(f"serve client mean ITL / run: median {statistics.median(ratios):.3f} (rounds: "
          + ", ".join(f"{x:.3f}" for x in ratios) + ")")
    print(json.dumps({"prompt_repeat": args.repeat, "rounds": rows}))


if __name__ == "__main__":
    main()
