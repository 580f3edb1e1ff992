#!/usr/bin/env bash
# One long copy request three times (the first computes the prompt, the next two find it in
# the prefix cache): output tok/s with and without --speculative ngram, and each step's time
# by its token count from --step-log (what a draft costs).
#
#   TROUPE_PY=... bench/serve/spec_long_copy.sh [MODEL.gguf] [K]   (K: --num-speculative-tokens, 7)
#   KEEP_DIR=DIR keeps both servers' step logs there (plain.csv, ngram.csv) for `troupe sim`.
#
# Prompt: "Repeat the following text exactly, word for word." and the first 1,500 characters
# of docs/serving.md (607 tokens); 200 greedy tokens. Prints a markdown report on stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODEL="${1:-$HOME/.cache/troupe/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
K="${2:-7}"
PY="${TROUPE_PY:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
run() {  # run NAME PORT FLAGS...
  local name=$1 port=$2; shift 2
  "$ROOT/build/bin/troupe" serve -m "$MODEL" --port "$port" -t 2 --step-log "$WORK/$name.csv" "$@" \
    > "$WORK/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf "localhost:$port/health" >/dev/null && break; sleep 0.5; done
  "$PY" - "$port" "$name" "$ROOT" <<'PY'
import hashlib, json, sys, time, urllib.request
port, name, root = sys.argv[1:4]
text = open(f"{root}/docs/serving.md").read()[:1500]
body = {"messages": [{"role": "user", "content": "Repeat the following text exactly, word for word.\n\n" + text}],
        "max_tokens": 200, "temperature": 0}
for rep in range(3):
    t = time.time()
    req = urllib.request.Request(f"http://localhost:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req))
    dt = time.time() - t
    u = r["usage"]
    d = u.get("completion_tokens_details") or {}
    sha = hashlib.sha256(r["choices"][0]["message"]["content"].encode()).hexdigest()[:12]
    print(f"| {name} | {rep + 1} | {u['completion_tokens'] / dt:.1f} | {d.get('accepted_prediction_tokens', '-')} "
          f"| {d.get('rejected_prediction_tokens', '-')} | {sha} |")
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
echo "| server | request | output tok/s | drafts accepted | rejected | output sha256 |"
echo "|---|---:|---:|---:|---:|---|"
run plain 8151
run ngram 8152 --speculative ngram --num-speculative-tokens "$K"
echo
echo "Steps of the speculating server at a context past 500 tokens, by tokens in the step:"
echo
echo "| tokens in step | steps | median step ms (plan to result) | median compute ms |"
echo "|---:|---:|---:|---:|"
if [ -n "${KEEP_DIR:-}" ]; then mkdir -p "$KEEP_DIR"; cp "$WORK/plain.csv" "$WORK/ngram.csv" "$KEEP_DIR/"; fi
python3 - "$WORK/ngram.csv" <<'PY'
import collections, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]).read().split("\n")[1:]:
    if not line:
        continue
    sec, comp, seqs = line.split(",")
    c, n = seqs.rstrip("*").split("+")
    if int(c) > 500 and int(n) <= 16:
        d[int(n)].append((float(sec) * 1e3, float(comp) * 1e3))
for n in sorted(d):
    a = sorted(x[0] for x in d[n]); b = sorted(x[1] for x in d[n])
    print(f"| {n} | {len(a)} | {a[len(a) // 2]:.2f} | {b[len(b) // 2]:.2f} |")
PY
