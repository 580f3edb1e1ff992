#!/usr/bin/env python3
"""Speculative decoding in serving: speculation on vs off, troupe and llama-server, same run.

  $TROUPE_PY bench/serve/spec_bench.py [--model M.gguf] [--concurrency 1,8,32] [--out PREFIX]

Two workloads through /v1/chat/completions (bench_serve.py, ShareGPT format, 128 output
tokens, greedy, ignore_eos, streamed):
  copy  "Repeat the following text exactly" over a paragraph of this repository's docs/
        (real English prose, 60-250 words): the copy-heavy set n-gram drafts are for;
  chat  make_sharegpt.py's look-alike conversations (seed 0): drafts rarely land.
Servers, each started fresh per (workload, C) with C slots and 2 threads:
  troupe             troupe serve M -t 2 --max-num-seqs C
  troupe-ngram       ... --speculative ngram (--num-speculative-tokens 7)
  troupe-self:L      ... --speculative self:L (--num-speculative-tokens 7), when named in --servers
  llama-server       llama-server -m M -t 2 -np C -c C*1536 -fa on -cb
  llama-server-ngram ... --spec-type ngram-simple --spec-draft-n-max 7
Writes PREFIX.json and PREFIX.md (default bench/results/serve-spec-smollm2-q4_1) with output
tok/s, the on/off ratios and each server's acceptance where it reports one.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOME = os.environ.get("TROUPE_HOME", os.path.expanduser("~/.cache/troupe"))
PEER_BIN = os.environ.get("PEER_BIN", f"{HOME}/peer/llama-cpp-python-0.3.36/vendor/llama.cpp/build/bin")


def copy_dataset(path, n=160):
    """Paragraphs of docs/*.md (prose only: no code, tables or headings), 60-250 words each."""
    paras = []
    for name in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if not name.endswith(".md"):
            continue
        text = open(os.path.join(ROOT, "docs", name)).read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for block in text.split("\n\n"):
            lines = [l for l in block.splitlines() if l.strip()]
            if not lines or any(l.lstrip().startswith(("#", "|", "-", "*", ">", "    ", "1.")) for l in lines):
                continue
            p = " ".join(l.strip() for l in lines)
            if 60 <= len(p.split()) <= 250:
                paras.append(p)
    paras = paras[:n]
    data = [{"id": f"copy-{i}", "conversations": [
        {"from": "human", "value": "Repeat the following text exactly, word for word.\n\n" + p},
        {"from": "gpt", "value": p}]} for i, p in enumerate(paras)]
    with open(path, "w") as f:
        json.dump(data, f)
    return len(data)


def wait_healthy(port, proc, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def metrics(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})?\s+([-0-9.e+]+)", line)
        if m and "position=" not in (m.group(2) or ""):  # (totals only, not per draft position)
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


SPEC_TOKENS = 7  # troupe's --num-speculative-tokens (--spec-tokens)


def server_cmd(name, model, c, port):
    if name.startswith("llama-server"):
        cmd = [f"{PEER_BIN}/llama-server", "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", "2",
               "-np", str(c), "-c", str(c * 1536), "-fa", "on", "-cb", "--no-webui", "--metrics"]
        if name.endswith("ngram"):
            cmd += ["--spec-type", "ngram-simple", "--spec-draft-n-max", "7"]
        return cmd
    cmd = [os.path.join(ROOT, "build/bin/troupe"), "serve", model, "--host", "127.0.0.1", "--port", str(port),
           "-t", "2", "--max-num-seqs", str(c)]
    if name.endswith("ngram"):
        cmd += ["--speculative", "ngram", "--num-speculative-tokens", str(SPEC_TOKENS)]
    if name.startswith("troupe-self:"):  # troupe-self:L
        cmd += ["--speculative", name[len("troupe-"):], "--num-speculative-tokens", str(SPEC_TOKENS)]
    return cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=f"{HOME}/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--servers", default="troupe,troupe-ngram,llama-server,llama-server-ngram")
    ap.add_argument("--workloads", default="copy,chat")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/serve-spec-smollm2-q4_1"))
    ap.add_argument("--tables-from", default="", help="rewrite PREFIX.md from an earlier run's JSON (no servers run)")
    ap.add_argument("--spec-tokens", type=int, default=7, help="troupe --num-speculative-tokens (llama-server: 7)")
    a = ap.parse_args()
    global SPEC_TOKENS
    SPEC_TOKENS = a.spec_tokens
    if a.tables_from:
        saved = json.load(open(a.tables_from))
        tables(a, saved["meta"], saved["results"])
        return
    work = tempfile.mkdtemp(prefix="spec_bench_")
    datasets = {"copy": os.path.join(work, "copy.json"), "chat": os.path.join(work, "chat.json")}
    ncopy = copy_dataset(datasets["copy"])
    subprocess.run([sys.executable, os.path.join(ROOT, "bench/serve/make_sharegpt.py"), "-o", datasets["chat"]],
                   check=True, stdout=subprocess.DEVNULL)
    print(f"copy set: {ncopy} paragraphs; chat set: make_sharegpt.py", file=sys.stderr)
    results = []
    port = 8123
    for wl in a.workloads.split(","):
        for c in [int(x) for x in a.concurrency.split(",")]:
            n = max(16, 4 * c)
            for name in a.servers.split(","):
                log = open(os.path.join(work, f"{name}-{wl}-c{c}.log"), "w")
                env = dict(os.environ, LD_LIBRARY_PATH=PEER_BIN)
                proc = subprocess.Popen(server_cmd(name, a.model, c, port), stdout=log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
                row = {"server": name, "workload": wl, "concurrency": c, "num_prompts": n}
                try:
                    if not wait_healthy(port, proc):
                        row["error"] = "did not start"
                        results.append(row)
                        continue
                    out_json = os.path.join(work, f"{name}-{wl}-c{c}.json")
                    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench/serve/bench_serve.py"),
                                        "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions",
                                        "--dataset", "sharegpt", "--dataset-path", datasets[wl],
                                        "--sharegpt-output-len", "128", "--sharegpt-max-prompt-len", "700",
                                        "--num-prompts", str(n), "--max-concurrency", str(c), "--seed", "0",
                                        "--quiet", "--result-json", out_json], capture_output=True, text=True)
                    if r.returncode != 0:
                        row["error"] = r.stderr[-300:]
                    else:
                        m = json.load(open(out_json))["metrics"]
                        row.update({k: m[k] for k in ("output_throughput", "completed", "failed", "duration_s",
                                                      "total_output_tokens")})
                        row["tpot_ms_median"] = m["tpot_ms"].get("median") if isinstance(m["tpot_ms"], dict) else None
                        mm = metrics(port)
                        if "troupe:spec_decode_num_draft_tokens_total" in mm:
                            row["drafted"] = mm["troupe:spec_decode_num_draft_tokens_total"]
                            row["accepted"] = mm["troupe:spec_decode_num_accepted_tokens_total"]
                    print(f"{wl} C={c} {name}: {row.get('output_throughput', 0):.1f} tok/s "
                          f"{row.get('error', '')}", file=sys.stderr)
                finally:
                    os.killpg(proc.pid, 15)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, 9)
                    if name.startswith("llama-server"):  # its own acceptance, from its log
                        log.flush()
                        txt = open(log.name).read()
                        acc = re.findall(r"draft acceptance rate = ([0-9.]+) \(\s*(\d+) accepted /\s*(\d+) generated",
                                         txt)
                        if acc:
                            row["accepted"] = sum(int(x[1]) for x in acc)
                            row["drafted"] = sum(int(x[2]) for x in acc)
                    results.append(row)
                    port += 1
    cpu = ""
    try:
        cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    except (OSError, AttributeError):
        pass
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": os.cpu_count(), "commit": commit,
            "model": os.path.basename(a.model), "platform": platform.platform()}
    json.dump({"meta": meta, "results": results}, open(a.out + ".json", "w"), indent=1)
    tables(a, meta, results)


def tables(a, meta, results):
    cpu, commit = meta["cpu"], meta["commit"]
    by = {(r["server"], r["workload"], r["concurrency"]): r for r in results}
    L = [f"# Speculative decoding in serving ({meta['date']})", "",
         f"Machine: {cpu}, {os.cpu_count()} vCPUs. Model: {meta['model']}. troupe commit {commit}; llama-server "
         f"from llama-cpp-python 0.3.36. Command: `$TROUPE_PY bench/serve/spec_bench.py --servers {a.servers}` "
         "(one run; every cell a fresh server, the servers in turn within each row).", "",
         "Output tok/s (bench_serve.py, /v1/chat/completions, 128 greedy tokens per request, ignore_eos, "
         "N = max(16, 4C) requests); ratio = with speculation / without, same server; drafts = accepted of fed."]
    ngram_table = any(x in a.servers.split(",") for x in ("troupe-ngram", "llama-server", "llama-server-ngram"))
    if ngram_table:
        L += ["", "| workload | C | troupe | troupe ngram | ratio | drafts | llama-server | llama-server ngram | ratio "
              "| drafts | troupe ngram / llama-server ngram |", "|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|"]

    def tp(k):
        r = by.get(k)
        return r.get("output_throughput") if r and "error" not in r else None

    def dr(k):
        r = by.get(k) or {}
        return f"{r['accepted']:.0f} / {r['drafted']:.0f}" if "drafted" in r else "n/a"

    f = lambda v: f"{v:.1f}" if v else "n/a"  # noqa: E731
    ratio = lambda x, y: f"{x / y:.2f}" if x and y else "n/a"  # noqa: E731
    for wl in a.workloads.split(",") if ngram_table else []:
        for c in [int(x) for x in a.concurrency.split(",")]:
            t0, t1 = tp(("troupe", wl, c)), tp(("troupe-ngram", wl, c))
            l0, l1 = tp(("llama-server", wl, c)), tp(("llama-server-ngram", wl, c))
            L.append(f"| {wl} | {c} | {f(t0)} | {f(t1)} | {ratio(t1, t0)} | {dr(('troupe-ngram', wl, c))} | {f(l0)} | "
                     f"{f(l1)} | {ratio(l1, l0)} | {dr(('llama-server-ngram', wl, c))} | {ratio(t1, l1)} |")
    selfs = [x for x in a.servers.split(",") if x.startswith("troupe-self:")]
    if selfs:  # self-drafting (--speculative self:L) against the same run's plain troupe
        L += ["", "Self-drafting (`--speculative self:L`: the model's first L of 30 layers, final norm and LM head "
              "draft in rounds inside the step); ratio = with / without, same run.", "",
              "| workload | C | troupe | " + " | ".join(f"{x[7:]} | ratio | drafts" for x in selfs) + " |",
              "|---|---:|---:|" + "---:|---:|---|" * len(selfs)]
        for wl in a.workloads.split(","):
            for c in [int(x) for x in a.concurrency.split(",")]:
                t0 = tp(("troupe", wl, c))
                cells = [f"{f(tp((x, wl, c)))} | {ratio(tp((x, wl, c)), t0)} | {dr((x, wl, c))}" for x in selfs]
                plain = [r["output_throughput"] for r in results if r["server"] == "troupe" and r["workload"] == wl
                         and r["concurrency"] == c and "error" not in r]
                if len(plain) > 1:  # (troupe named twice in --servers: before and after, their mean)
                    t0 = sum(plain) / len(plain)
                    cells = [f"{f(tp((x, wl, c)))} | {ratio(tp((x, wl, c)), t0)} | {dr((x, wl, c))}" for x in selfs]
                    L.append(f"| {wl} | {c} | {f(t0)} ({' / '.join(f(v) for v in plain)}) | " + " | ".join(cells) + " |")
                    continue
                L.append(f"| {wl} | {c} | {f(t0)} | " + " | ".join(cells) + " |")
    open(a.out + ".md", "w").write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
