#!/usr/bin/env bash
# CPU throughput: Troupe vs llama.cpp (the peer) on the same GGUF, threads 1 and 2.
#
#   bench/cpu/compare_llamacpp.sh [MODEL.gguf]
#
# Runs, for T in $THREADS (default "1 2"):
#   llama-bench -m MODEL -p 512 -n 128 -t T -r 3 -o json            (peer, scripts/peer/build-llamacpp.sh)
#   build/bin/troupe bench -m MODEL -t T -p 512 -n 128 -r 3 --json   (prints {"pp_tok_s", "tg_tok_s"})
# plus a STREAM-like triad (bench/cpu/triad.c) at the same thread counts, for the decode roofline
#   tg_roofline_tok_s = triad bandwidth / bytes of all GGUF tensors (every weight is read once per
#   generated token; SmolLM2 ties the output matrix to token_embd, so that is read in full too).
#
# Writes bench/results/cpu-<model tag>.md and .json (OUT_MD / OUT_JSON override).
# Environment: PEER_BIN (dir with llama-bench), TROUPE_BIN (default build/bin/troupe),
#              PYTHON (for the report; with numpy + pyyaml it reads the GGUF through the peer's gguf-py),
#              THREADS (default "1 2"), REPS (default 3), PP (512), TG (128), NICE (default 0:
#              benchmarks should run un-niced on a quiet machine).
# If troupe bench is missing or fails, its cells read "troupe bench not available".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TROUPE_HOME="${TROUPE_HOME:-$HOME/.cache/troupe}"
MODEL="${1:-${MODEL:-$TROUPE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf}}"
PEER_DIR="${PEER_DIR:-$TROUPE_HOME/peer}"
LLCPP_VERSION="${LLCPP_VERSION:-0.3.36}"
PEER_BIN="${PEER_BIN:-$PEER_DIR/llama-cpp-python-$LLCPP_VERSION/vendor/llama.cpp/build/bin}"
TROUPE_BIN="${TROUPE_BIN:-$ROOT/build/bin/troupe}"
THREADS="${THREADS:-1 2}"
REPS="${REPS:-3}"
PP="${PP:-512}"
TG="${TG:-128}"
NICE="${NICE:-0}"

tag="$(basename "$MODEL" .gguf | tr '[:upper:]' '[:lower:]')"
case "$tag" in smollm2-135m-instruct.q4_1) tag="smollm2-q4_1" ;; esac
OUT_MD="${OUT_MD:-$ROOT/bench/results/cpu-$tag.md}"
OUT_JSON="${OUT_JSON:-${OUT_MD%.md}.json}"

[[ -f "$MODEL" ]] || { echo "model not found: $MODEL" >&2; exit 1; }
[[ -x "$PEER_BIN/llama-bench" ]] || {
  echo "llama-bench not found in $PEER_BIN (run scripts/peer/build-llamacpp.sh)" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# Other processes over 15% CPU (ps %CPU: CPU time / lifetime, so a rough sign of a shared box).
busy_others() {
  ps -eo pcpu=,pid=,comm= --sort=-pcpu | awk -v me=$$ '$1 > 15 && $3 != "ps" && $3 != "llama-bench" && $3 != "triad" && $3 != "troupe" {printf "%s(%s%%) ", $3, $1}'
}

# Triad, built with -O3 -march=native -fopenmp.
gcc -O3 -march=native -fopenmp "$ROOT/bench/cpu/triad.c" -o "$WORK/triad"

for T in $THREADS; do
  { echo "threads $T before: load $(cut -d' ' -f1-3 /proc/loadavg); $(busy_others)"; } >> "$WORK/contention.txt"
  echo "== threads $T: triad" >&2
  OMP_NUM_THREADS=$T OMP_PROC_BIND=spread nice -n "$NICE" "$WORK/triad" > "$WORK/triad-$T.json"
  cat "$WORK/triad-$T.json" >&2

  echo "== threads $T: llama-bench -p $PP -n $TG -r $REPS" >&2
  nice -n "$NICE" "$PEER_BIN/llama-bench" -m "$MODEL" -p "$PP" -n "$TG" -t "$T" -r "$REPS" -o json \
    > "$WORK/llama-$T.json" 2> "$WORK/llama-$T.err" || {
      echo "llama-bench failed:" >&2; cat "$WORK/llama-$T.err" >&2; exit 1; }

  echo "== threads $T: troupe bench" >&2
  if [[ -x "$TROUPE_BIN" ]] && nice -n "$NICE" "$TROUPE_BIN" bench -m "$MODEL" -t "$T" -p "$PP" \
       -n "$TG" -r "$REPS" --json > "$WORK/troupe-$T.out" 2> "$WORK/troupe-$T.err"; then
    :
  else
    echo "troupe bench not available ($TROUPE_BIN)" >&2
    : > "$WORK/troupe-$T.out"
  fi
  { echo "threads $T after: load $(cut -d' ' -f1-3 /proc/loadavg); $(busy_others)"; } >> "$WORK/contention.txt"
done

"$PEER_BIN/llama-bench" --version > "$WORK/peer-version.txt" 2>&1 || true

WORK="$WORK" MODEL="$MODEL" THREADS="$THREADS" OUT_MD="$OUT_MD" OUT_JSON="$OUT_JSON" \
PP="$PP" TG="$TG" REPS="$REPS" LLCPP_VERSION="$LLCPP_VERSION" PEER_BIN="$PEER_BIN" \
TROUPE_BIN="$TROUPE_BIN" "${PYTHON:-python3}" - <<'EOF'
import json, os, platform, re, subprocess, datetime

W = os.environ["WORK"]; model = os.environ["MODEL"]
threads = [int(t) for t in os.environ["THREADS"].split()]
pp, tg, reps = int(os.environ["PP"]), int(os.environ["TG"]), int(os.environ["REPS"])
NA = "troupe bench not available"

# --- CPU description ---
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
def field(name):
    m = re.search(rf"^{re.escape(name)}:\s*(.+)$", lscpu, re.M)
    return m.group(1).strip() if m else "?"
flags = set(field("Flags").split())
interest = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
            "avx_vnni", "amx_int8", "amx_bf16"]
mem_kib = 0
with open("/proc/meminfo") as f:
    for line in f:
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
cpu = {
    "model_name": field("Model name"),
    "cpus": field("CPU(s)"),
    "threads_per_core": field("Thread(s) per core"),
    "cores_per_socket": field("Core(s) per socket"),
    "l3": field("L3 cache"),
    "flags": {fl: fl in flags for fl in interest},
    "memory_gib": round(mem_kib / 1024 / 1024, 1),
    "hypervisor": field("Hypervisor vendor"),
}

# --- model weight bytes ---
weight_bytes, by_type, active_bytes, moe = None, {}, None, None
try:
    import sys
    # gguf-py from the peer's own llama.cpp tree when the package is not installed
    sys.path.append(os.path.join(os.environ["PEER_BIN"], "..", "..", "gguf-py"))
    from gguf import GGUFReader
    r = GGUFReader(model)
    for t in r.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    weight_bytes = sum(by_type.values())
    # Mixture of experts: a decoded token reads only its experts' weights (used / count of
    # every stacked *_exps tensor), so the roofline counts those.
    def meta_int(suffix):
        for k, f in r.fields.items():
            if k.endswith(suffix) and f.types and len(f.data):
                return int(f.parts[f.data[0]][0])
        return 0
    n_exp, n_used = meta_int(".expert_count"), meta_int(".expert_used_count")
    if n_exp > 0 and n_used > 0:
        exps = sum(int(t.n_bytes) for t in r.tensors if "_exps." in t.name)
        active_bytes = weight_bytes - exps + exps * n_used / n_exp
        moe = {"experts": n_exp, "experts_used": n_used, "expert_bytes": exps, "active_bytes": active_bytes}
except Exception as e:  # no gguf package: fall back to the file size (an upper bound)
    weight_bytes = os.path.getsize(model)
    by_type = {"file_size_fallback": weight_bytes, "error": str(e)}

peer_version = open(os.path.join(W, "peer-version.txt")).read().strip()
contention = open(os.path.join(W, "contention.txt")).read().strip().splitlines()
contended = any(not l.rstrip().endswith(";") for l in contention)

rows = []
for t in threads:
    triad = json.load(open(os.path.join(W, f"triad-{t}.json")))
    lb = json.load(open(os.path.join(W, f"llama-{t}.json")))
    l_pp = next(x for x in lb if x["n_prompt"] == pp and x["n_gen"] == 0)
    l_tg = next(x for x in lb if x["n_gen"] == tg and x["n_prompt"] == 0)
    tro = None
    txt = open(os.path.join(W, f"troupe-{t}.out")).read().strip()
    if txt:
        try:
            # the last line that parses as a JSON object
            for line in reversed(txt.splitlines()):
                line = line.strip()
                if line.startswith("{"):
                    tro = json.loads(line); break
            if tro is not None:
                tro = {"pp_tok_s": float(tro["pp_tok_s"]), "tg_tok_s": float(tro["tg_tok_s"])}
        except Exception:
            tro = None
    bw = triad["best_gb_s"] * 1e9
    rows.append({
        "threads": t,
        "triad": triad,
        "roofline_tg_tok_s": bw / (active_bytes or weight_bytes),
        "llama_cpp": {"pp_tok_s": l_pp["avg_ts"], "pp_stddev": l_pp["stddev_ts"],
                      "tg_tok_s": l_tg["avg_ts"], "tg_stddev": l_tg["stddev_ts"],
                      "build_commit": l_pp.get("build_commit"), "cpu_info": l_pp.get("cpu_info"),
                      "backends": l_pp.get("backends"), "flash_attn": l_pp.get("flash_attn"),
                      "n_batch": l_pp.get("n_batch"), "n_ubatch": l_pp.get("n_ubatch"),
                      "type_k": l_pp.get("type_k"), "use_mmap": l_pp.get("use_mmap")},
        "troupe": tro,
        "ratio_pp": (tro["pp_tok_s"] / l_pp["avg_ts"]) if tro else None,
        "ratio_tg": (tro["tg_tok_s"] / l_tg["avg_ts"]) if tro else None,
    })

doc = {
    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "model": os.path.basename(model),
    "weight_bytes": weight_bytes, "weight_bytes_by_type": by_type, "moe": moe,
    "cpu": cpu, "kernel": platform.release(),
    "peer": {"llama_cpp_python": os.environ["LLCPP_VERSION"], "llama_bench_version": peer_version,
             "bin": os.environ["PEER_BIN"]},
    "troupe_bin": os.environ["TROUPE_BIN"],
    "settings": {"pp": pp, "tg": tg, "reps": reps},
    "contention": contention, "contended": contended,
    "results": rows,
}
with open(os.environ["OUT_JSON"], "w") as f:
    json.dump(doc, f, indent=1); f.write("\n")

def num(x, fmt="{:.1f}"):
    return fmt.format(x) if x is not None else NA
fl = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["flags"].items())
L = []
L.append(f"# CPU: Troupe vs llama.cpp, {doc['model']}")
L.append("")
L.append(f"Generated by `bench/cpu/compare_llamacpp.sh` on {doc['date_utc']}.")
L.append("")
L.append(f"- CPU: {cpu['model_name']}, {cpu['cpus']} logical CPUs "
         f"({cpu['cores_per_socket']} cores/socket, {cpu['threads_per_core']} threads/core), "
         f"L3 {cpu['l3']}, hypervisor {cpu['hypervisor']}")
L.append(f"- Flags: {fl}")
L.append(f"- Memory: {cpu['memory_gib']} GiB")
L.append(f"- Peer: llama-cpp-python {os.environ['LLCPP_VERSION']} vendored llama.cpp; "
         f"`llama-bench --version`: {peer_version.splitlines()[0] if peer_version else '?'}; "
         f"backend {rows[0]['llama_cpp']['backends']}, flash_attn {rows[0]['llama_cpp']['flash_attn']}, "
         f"n_batch {rows[0]['llama_cpp']['n_batch']}, n_ubatch {rows[0]['llama_cpp']['n_ubatch']}, "
         f"KV {rows[0]['llama_cpp']['type_k']}")
L.append(f"- Weights: {weight_bytes/1e6:.2f} MB of tensors ("
         + ", ".join(f"{k} {v/1e6:.2f} MB" if isinstance(v, (int, float)) else f"{k}: {v}" for k, v in by_type.items()) + ")")
if moe:
    L.append(f"- Mixture of experts: {moe['experts']} experts, {moe['experts_used']} per token; expert tensors "
             f"{moe['expert_bytes']/1e6:.2f} MB, read per decoded token {moe['active_bytes']/1e6:.2f} MB "
             "(the roofline below uses this)")
L.append(f"- pp{pp} / tg{tg}, {reps} repetitions each, mean tok/s (llama-bench ± stddev)")
L.append(f"- Load around the runs (1/5/15-min load average; other processes over 15% CPU by ps, a lifetime average): "
         + " | ".join(contention))
if contended:
    L.append("- **WARNING: other processes were busy during this run; the numbers are not clean.**")
L.append("")
L.append(f"| threads | llama.cpp pp{pp} | Troupe pp{pp} | pp ratio T/L | llama.cpp tg{tg} | "
         f"Troupe tg{tg} | tg ratio T/L | triad GB/s | tg roofline tok/s | llama.cpp tg % of roofline |")
L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    l, t = r["llama_cpp"], r["troupe"]
    L.append(f"| {r['threads']} | {l['pp_tok_s']:.1f} ± {l['pp_stddev']:.1f} | "
             f"{num(t and t['pp_tok_s'])} | {num(r['ratio_pp'], '{:.2f}')} | "
             f"{l['tg_tok_s']:.1f} ± {l['tg_stddev']:.1f} | {num(t and t['tg_tok_s'])} | "
             f"{num(r['ratio_tg'], '{:.2f}')} | {r['triad']['best_gb_s']:.1f} | "
             f"{r['roofline_tg_tok_s']:.0f} | {100*l['tg_tok_s']/r['roofline_tg_tok_s']:.0f}% |")
L.append("")
L.append("Roofline: decode reads every weight once per token, so tg tok/s <= triad bandwidth / "
         "weight bytes (KV-cache reads, tiny at this context, are left out). Triad = best of 10 "
         "passes of a[i] = b[i] + s*c[i] over 3 x 256 MiB arrays, STREAM byte counting."
         + (" For a mixture of experts the weight bytes are the active ones (each token's experts); "
            "consecutive tokens that share experts find some in cache, so this bound can be passed."
            if moe else ""))
with open(os.environ["OUT_MD"], "w") as f:
    f.write("\n".join(L) + "\n")
print("\n".join(L))
EOF
echo "wrote $OUT_MD and $OUT_JSON" >&2
