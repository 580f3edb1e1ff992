#!/usr/bin/env bash
# Online serving: `troupe serve` vs llama.cpp's `llama-server` (the peer), same GGUF, same load.
#
#   bench/serve/compare_llama_server.sh [MODEL.gguf]
#
# For each server in $SERVERS and each C in $CONCURRENCY (default "1 8 32") it starts a fresh
# server with C sequence slots and 2 threads, waits for GET /health = 200, and runs
#   bench/serve/bench_serve.py --dataset random --random-input-len 288 --random-range-ratio 0.78
#       (prompts of 63..512 tokens) --random-output-len 128 --max-concurrency C --num-prompts N
# with the same --seed, so both servers get the same prompts (the bench trims them with the
# server's /tokenize; both use the GGUF's tokenizer).
#   llama-server -m MODEL --host 127.0.0.1 --port 8090 -t 2 -np C -c C*CTX_PER_SLOT -fa on -cb
#   troupe serve MODEL --host 127.0.0.1 --port 8000 -t 2 --max-num-seqs C
#
# Writes bench/results/serve-<model tag>.json and .md (OUT_JSON / OUT_MD override).
# Environment: SERVERS (default "llama-server troupe"), CONCURRENCY ("1 8 32"),
#   NUM_PROMPTS (default per C: max(16, 4*C)), INPUT_LEN (288), RANGE_RATIO (0.78),
#   OUTPUT_LEN (128), SEED (0), ENDPOINT (/v1/completions), THREADS (2), CTX_PER_SLOT (1024),
#   PEER_BIN (dir with llama-server), TROUPE_BIN (build/bin/troupe), LLAMA_ARGS / TROUPE_ARGS
#   (extra server flags), NICE (0: benchmarks should run un-niced on a quiet machine),
#   HEALTH_TIMEOUT (180 s).
# If troupe is missing or does not come up, its cells read "n/a" and the log says why.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/scripts/lib.sh"   # TROUPE_HOME, log, python_env
MODEL="${1:-${MODEL:-$TROUPE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf}}"
PEER_DIR="${PEER_DIR:-$TROUPE_HOME/peer}"
LLCPP_VERSION="${LLCPP_VERSION:-0.3.36}"
PEER_BIN="${PEER_BIN:-$PEER_DIR/llama-cpp-python-$LLCPP_VERSION/vendor/llama.cpp/build/bin}"
TROUPE_BIN="${TROUPE_BIN:-$ROOT/build/bin/troupe}"
SERVERS="${SERVERS:-llama-server troupe}"
CONCURRENCY="${CONCURRENCY:-1 8 32}"
NUM_PROMPTS="${NUM_PROMPTS:-}"
INPUT_LEN="${INPUT_LEN:-288}"
RANGE_RATIO="${RANGE_RATIO:-0.78}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
SEED="${SEED:-0}"
ENDPOINT="${ENDPOINT:-/v1/completions}"
THREADS="${THREADS:-2}"
CTX_PER_SLOT="${CTX_PER_SLOT:-1024}"
LLAMA_ARGS="${LLAMA_ARGS:-}"
TROUPE_ARGS="${TROUPE_ARGS:-}"
NICE="${NICE:-0}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-180}"
LLAMA_PORT=8090
TROUPE_PORT=8000

tag="$(basename "$MODEL" .gguf | tr '[:upper:]' '[:lower:]')"
case "$tag" in smollm2-135m-instruct.q4_1) tag="smollm2-q4_1" ;; esac
OUT_JSON="${OUT_JSON:-$ROOT/bench/results/serve-$tag.json}"
OUT_MD="${OUT_MD:-${OUT_JSON%.json}.md}"

[[ -f "$MODEL" ]] || { echo "model not found: $MODEL" >&2; exit 1; }
if [[ " $SERVERS " == *" llama-server "* && ! -x "$PEER_BIN/llama-server" ]]; then
  echo "llama-server not found in $PEER_BIN (run scripts/peer/build-llamacpp.sh)" >&2; exit 1
fi
command -v curl >/dev/null || { echo "curl is needed" >&2; exit 1; }
python_env   # TROUPE_PY: venv python with aiohttp

WORK="$(mktemp -d)"
SERVER_PID=""
stop_server() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap 'stop_server; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

busy_others() {
  ps -eo pcpu=,pid=,comm= --sort=-pcpu | awk '$1 > 15 && $3 != "ps" && $3 != "llama-server" && $3 != "troupe" && $3 !~ /python/ {printf "%s(%s%%) ", $3, $1}'
}

# start_server NAME C LOGFILE: starts it in the background (SERVER_PID), waits for /health 200.
start_server() {
  local name=$1 c=$2 logf=$3 port cmd
  if [[ $name == llama-server ]]; then
    port=$LLAMA_PORT
    cmd=("$PEER_BIN/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$port" -t "$THREADS"
         -np "$c" -c $((c * CTX_PER_SLOT)) -fa on -cb --no-webui $LLAMA_ARGS)
  else
    port=$TROUPE_PORT
    [[ -x "$TROUPE_BIN" ]] || { echo "troupe not found: $TROUPE_BIN" > "$logf"; return 1; }
    cmd=("$TROUPE_BIN" serve "$MODEL" --host 127.0.0.1 --port "$port" -t "$THREADS"
         --max-num-seqs "$c" $TROUPE_ARGS)
  fi
  if curl -s -o /dev/null "http://127.0.0.1:$port/health"; then
    echo "port $port is already in use" | tee "$logf" >&2; return 1
  fi
  echo "+ ${cmd[*]}" > "$logf"
  LD_LIBRARY_PATH="$PEER_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" nice -n "$NICE" "${cmd[@]}" >> "$logf" 2>&1 &
  SERVER_PID=$!
  local t0=$SECONDS
  while (( SECONDS - t0 < HEALTH_TIMEOUT )); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "$name exited before it was healthy; log tail:" >&2; tail -n 20 "$logf" >&2; SERVER_PID=""; return 1
    fi
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" == 200 ]] && return 0
    sleep 0.5
  done
  echo "$name not healthy after ${HEALTH_TIMEOUT}s" >&2; stop_server; return 1
}

for name in $SERVERS; do
  for c in $CONCURRENCY; do
    n="${NUM_PROMPTS:-$(( 4 * c > 16 ? 4 * c : 16 ))}"
    echo "== $name, concurrency $c, $n prompts" >&2
    { echo "$name c$c before: load $(cut -d' ' -f1-3 /proc/loadavg); $(busy_others)"; } >> "$WORK/contention.txt"
    if ! start_server "$name" "$c" "$WORK/$name-c$c.log"; then
      echo "$name did not start; its cells will read n/a. Log tail:" >&2
      tail -n 5 "$WORK/$name-c$c.log" | tee "$WORK/$name-c$c.startfail" >&2
      continue
    fi
    port=$LLAMA_PORT; [[ $name == troupe ]] && port=$TROUPE_PORT
    if ! nice -n "$NICE" "$TROUPE_PY" "$ROOT/bench/serve/bench_serve.py" --base-url "http://127.0.0.1:$port" \
        --endpoint "$ENDPOINT" --dataset random --random-input-len "$INPUT_LEN" \
        --random-range-ratio "$RANGE_RATIO" --random-output-len "$OUTPUT_LEN" --num-prompts "$n" \
        --max-concurrency "$c" --seed "$SEED" --label "$name-c$c" --quiet \
        --result-json "$WORK/$name-c$c.json"; then
      echo "bench against $name failed (c=$c)" >&2
    fi
    stop_server
    { echo "$name c$c after: load $(cut -d' ' -f1-3 /proc/loadavg); $(busy_others)"; } >> "$WORK/contention.txt"
  done
done

peer_version="$(LD_LIBRARY_PATH="$PEER_BIN" "$PEER_BIN/llama-server" --version 2>&1 | grep -m1 version || true)"
troupe_version="$( { [[ -x "$TROUPE_BIN" ]] && echo "commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"; } || echo "not built")"

WORK="$WORK" MODEL="$MODEL" SERVERS="$SERVERS" CONCURRENCY="$CONCURRENCY" OUT_MD="$OUT_MD" \
OUT_JSON="$OUT_JSON" INPUT_LEN="$INPUT_LEN" RANGE_RATIO="$RANGE_RATIO" OUTPUT_LEN="$OUTPUT_LEN" \
SEED="$SEED" ENDPOINT="$ENDPOINT" THREADS="$THREADS" CTX_PER_SLOT="$CTX_PER_SLOT" \
LLCPP_VERSION="$LLCPP_VERSION" PEER_BIN="$PEER_BIN" TROUPE_BIN="$TROUPE_BIN" \
PEER_VERSION="$peer_version" TROUPE_VERSION="$troupe_version" python3 - <<'EOF'
import datetime, json, os, platform, re, subprocess

E = os.environ
W = E["WORK"]
servers = E["SERVERS"].split()
concs = [int(c) for c in E["CONCURRENCY"].split()]

lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
def field(name):
    m = re.search(rf"^{re.escape(name)}:\s*(.+)$", lscpu, re.M)
    return m.group(1).strip() if m else "?"
try:
    cores = int(field("Core(s) per socket")) * int(field("Socket(s)"))
except ValueError:
    cores = None
nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() or 0)
mem_kib = 0
with open("/proc/meminfo") as f:
    for line in f:
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
machine = {"model_name": field("Model name"), "cores": cores, "threads_per_core": field("Thread(s) per core"),
           "nproc": nproc, "memory_gib": round(mem_kib / 1024 / 1024, 1),
           "hypervisor": field("Hypervisor vendor"), "kernel": platform.release()}

contention = open(os.path.join(W, "contention.txt")).read().strip().splitlines() \
    if os.path.exists(os.path.join(W, "contention.txt")) else []
contended = any(not l.rstrip().endswith(";") for l in contention)

def load(name, c):
    p = os.path.join(W, f"{name}-c{c}.json")
    if not os.path.exists(p):
        f = os.path.join(W, f"{name}-c{c}.startfail")
        return {"start_error": open(f).read().strip()} if os.path.exists(f) else None
    d = json.load(open(p))
    return {"num_prompts": d["args"]["num_prompts"], **d["metrics"], "errors": d.get("errors", [])}

METRICS = [("output_throughput", "output tok/s", None),
           ("ttft_ms", "TTFT p50 (ms)", "p50"), ("ttft_ms", "TTFT p99 (ms)", "p99"),
           ("itl_ms", "ITL p50 (ms)", "p50"), ("itl_ms", "ITL p99 (ms)", "p99")]
def get(r, key, sub):
    if r is None or not r.get("completed"):
        return None
    return r[key][sub] if sub else r[key]

rows = []
for c in concs:
    res = {s: load(s, c) for s in ("llama-server", "troupe")}
    row = {"concurrency": c, "llama_server": res["llama-server"], "troupe": res["troupe"], "ratio_troupe_over_llama": {}}
    for key, label, sub in METRICS:
        a, b = get(res["llama-server"], key, sub), get(res["troupe"], key, sub)
        row["ratio_troupe_over_llama"][label] = (b / a) if (a and b is not None) else None
    rows.append(row)

doc = {
    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "model": os.path.basename(E["MODEL"]),
    "machine": machine,
    "peer": {"llama_cpp_python": E["LLCPP_VERSION"], "llama_server_version": E["PEER_VERSION"], "bin": E["PEER_BIN"]},
    "troupe": {"bin": E["TROUPE_BIN"], "version": E["TROUPE_VERSION"]},
    "settings": {"servers": servers, "endpoint": E["ENDPOINT"], "random_input_len": int(E["INPUT_LEN"]),
                 "random_range_ratio": float(E["RANGE_RATIO"]), "random_output_len": int(E["OUTPUT_LEN"]),
                 "seed": int(E["SEED"]), "threads": int(E["THREADS"]), "ctx_per_slot_llama": int(E["CTX_PER_SLOT"]),
                 "concurrency": concs},
    "contention": contention, "contended": contended,
    "results": rows,
}
os.makedirs(os.path.dirname(os.path.abspath(E["OUT_JSON"])), exist_ok=True)
with open(E["OUT_JSON"], "w") as f:
    json.dump(doc, f, indent=1); f.write("\n")

def fmt(x, f="{:.1f}"):
    return f.format(x) if x is not None else "n/a"
ii, rr = int(E["INPUT_LEN"]), float(E["RANGE_RATIO"])
lo, hi = max(1, int(ii * (1 - rr))), int(ii * (1 + rr))
L = [f"# Serving: Troupe vs llama-server, {doc['model']}", "",
     f"Generated by `bench/serve/compare_llama_server.sh` on {doc['date_utc']}.", "",
     f"- Machine: {machine['model_name']}, {machine['cores']} cores ({machine['threads_per_core']} threads/core), "
     f"nproc {machine['nproc']}, {machine['memory_gib']} GiB, hypervisor {machine['hypervisor']}",
     f"- Peer: llama-cpp-python {E['LLCPP_VERSION']} vendored llama.cpp, `llama-server --version`: {E['PEER_VERSION'] or '?'}; "
     f"`-t {E['THREADS']} -np C -c C*{E['CTX_PER_SLOT']} -fa on -cb`",
     f"- Troupe: `troupe serve -t {E['THREADS']} --max-num-seqs C` ({E['TROUPE_VERSION']})",
     f"- Load: `bench/serve/bench_serve.py` {E['ENDPOINT']}, streaming, random prompts {lo}-{hi} tokens "
     f"(--random-input-len {ii} --random-range-ratio {rr}), {E['OUTPUT_LEN']} output tokens (ignore_eos), "
     f"temperature 0, --max-concurrency C, seed {E['SEED']}; a fresh server per C",
     "- Load around the runs (1/5/15-min load average; other processes over 15% CPU by ps, a lifetime average): "
     + " | ".join(contention)]
if contended:
    L.append("- **WARNING: other processes were busy during this run; the numbers are not clean.**")
L += ["", "Ratio = troupe / llama-server: above 1 is better for tok/s, below 1 is better for latencies.", "",
      "| concurrency | prompts (L/T) | failed (L/T) | metric | llama-server | troupe | ratio T/L |",
      "|---:|---:|---:|---|---:|---:|---:|"]
for r in rows:
    l, t = r["llama_server"], r["troupe"]
    np_ = f"{(l or {}).get('num_prompts', 'n/a')}/{(t or {}).get('num_prompts', 'n/a')}"
    fl = f"{(l or {}).get('failed', 'n/a')}/{(t or {}).get('failed', 'n/a')}"
    for i, (key, label, sub) in enumerate(METRICS):
        L.append(f"| {r['concurrency'] if i == 0 else ''} | {np_ if i == 0 else ''} | {fl if i == 0 else ''} | {label} | "
                 f"{fmt(get(l, key, sub))} | {fmt(get(t, key, sub))} | "
                 f"{fmt(r['ratio_troupe_over_llama'][label], '{:.2f}')} |")
L.append("")
for r in rows:
    for k, who in (("llama_server", "llama-server"), ("troupe", "troupe")):
        if r[k] and r[k].get("start_error"):
            L.append(f"- {who} did not start at concurrency {r['concurrency']}: `{r[k]['start_error'].splitlines()[-1]}`")
        elif r[k] and r[k].get("errors"):
            L.append(f"- {who} at concurrency {r['concurrency']}: {r[k]['failed']} failed, e.g. `{r[k]['errors'][0][:120]}`")
L.append("")
L.append("TTFT: request sent to first streamed text; ITL: gaps between later streamed chunks, all requests pooled.")
with open(E["OUT_MD"], "w") as f:
    f.write("\n".join(L) + "\n")
print("\n".join(L))
EOF
echo "wrote $OUT_MD and $OUT_JSON" >&2
