#!/usr/bin/env bash
# The GPU check (docs/gpu.md): builds the CUDA targets (unless TROUPE_BIN_DIR names a folder
# with troupe, troupe_tests and troupe_gpu_bench already built), runs every [cuda] test
# (ops against the CPU, the default model and bf16 weights end to end, batch invariance),
# the GPU microbenchmarks and Llama-3-8B dummy figures, `troupe bench` on the default model
# and on the Llama-3-70B dummy shape in q4_0, and one `troupe serve` request; prints one table and writes OUT_DIR/gpu-check.{md,json} plus the logs.
#   bench/gpu/check.sh OUT_DIR
# Environment: TROUPE_BIN_DIR (prebuilt binaries), TROUPE_MODEL_PATH or TROUPE_HOME (the
# default model, as for the tests), TROUPE_CUDA_ARCHS (default 90 here: the GPU at hand).
set -uo pipefail
OUT="${1:?usage: bench/gpu/check.sh OUT_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$OUT"
T0=$(date +%s)
say() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*" >&2; }

if ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU here (nvidia-smi -L failed): nothing to check"
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/device.txt"

BIN="${TROUPE_BIN_DIR:-}"
if [ -z "$BIN" ]; then
  B="$ROOT/build-gpu"
  say "configuring and building the CUDA targets in $B"
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTROUPE_CUDA_ARCHS="${TROUPE_CUDA_ARCHS:-90}" >"$OUT/build.log" 2>&1 &&
    cmake --build "$B" --target troupe troupe_tests troupe_gpu_bench >>"$OUT/build.log" 2>&1 ||
    { say "build failed: see $OUT/build.log"; tail -20 "$OUT/build.log"; exit 1; }
  BIN="$B/bin"
fi

status=0
say "[cuda] tests (ops vs the CPU, models end to end, batch invariance)"
(cd "$ROOT" && timeout 150 "$BIN/troupe_tests" "[cuda]" --durations yes) >"$OUT/cuda-tests.log" 2>&1
tests_rc=$?
grep -E "^(All tests passed|test cases:|assertions:)" "$OUT/cuda-tests.log" || tail -5 "$OUT/cuda-tests.log"
grep -A2 "warning:" "$OUT/cuda-tests.log" | grep -v "^--$" | sed -n '1,40p'
[ $tests_rc -ne 0 ] && { say "[cuda] tests FAILED (rc $tests_rc): $OUT/cuda-tests.log"; status=1; }

say "microbenchmarks and Llama-3-8B dummy figures"
(cd "$ROOT" && timeout 360 "$BIN/troupe_gpu_bench" "$OUT" --config "$ROOT/configs/llama-3-8b.json") 2>&1 | tee "$OUT/gpu-bench.log"
[ "${PIPESTATUS[0]}" -ne 0 ] && { say "troupe_gpu_bench FAILED"; status=1; }

say "default model (SmolLM2-135M Q4_1): troupe bench on the GPU"
for dev in cuda cpu; do
  (cd "$ROOT" && timeout 120 "$BIN/troupe" bench -m "${TROUPE_MODEL_PATH:-default}" --device "$dev" -p 512 -n 128 -r 3 --json) >"$OUT/bench-default-$dev.json" 2>"$OUT/bench-default-$dev.log" ||
    { say "troupe bench --device $dev failed"; tail -3 "$OUT/bench-default-$dev.log"; status=1; }
  cat "$OUT/bench-default-$dev.json"
done
# The same on the GPU with the int8 matmuls of 64+ tokens on tensor cores (prefill; the same
# bits as the GEMV, opt-in until measured here).
(cd "$ROOT" && TROUPE_CUDA_Q8_MMA=64 timeout 120 "$BIN/troupe" bench -m "${TROUPE_MODEL_PATH:-default}" --device cuda -p 512 -n 128 -r 3 --json) >"$OUT/bench-default-cuda-q8mma.json" 2>"$OUT/bench-default-cuda-q8mma.log" ||
  { say "troupe bench --device cuda with TROUPE_CUDA_Q8_MMA=64 failed"; tail -3 "$OUT/bench-default-cuda-q8mma.log"; status=1; }
cat "$OUT/bench-default-cuda-q8mma.json"

# And with every token's attention on tensor cores (batch-invariant; opt-in until measured here).
(cd "$ROOT" && TROUPE_CUDA_ATTN=tc timeout 120 "$BIN/troupe" bench -m "${TROUPE_MODEL_PATH:-default}" --device cuda -p 512 -n 128 -r 3 --json) >"$OUT/bench-default-cuda-tc-attn.json" 2>"$OUT/bench-default-cuda-tc-attn.log" ||
  { say "troupe bench --device cuda with TROUPE_CUDA_ATTN=tc failed"; tail -3 "$OUT/bench-default-cuda-tc-attn.log"; status=1; }
cat "$OUT/bench-default-cuda-tc-attn.json"

# And with --cuda-cublas (not batch-invariant): prefill matmuls through cuBLAS and the prompt's
# attention on tensor cores, the mma.sync kernel, then the WMMA one it replaced there.
for attn in mma wmma; do
  (cd "$ROOT" && TROUPE_CUDA_ATTN=$([ $attn = wmma ] && echo wmma) timeout 120 "$BIN/troupe" bench -m "${TROUPE_MODEL_PATH:-default}" --device cuda --cuda-cublas -p 512 -n 128 -r 3 --json) >"$OUT/bench-default-cuda-cublas-$attn.json" 2>"$OUT/bench-default-cuda-cublas-$attn.log" ||
    { say "troupe bench --device cuda --cuda-cublas ($attn attention) failed"; tail -3 "$OUT/bench-default-cuda-cublas-$attn.log"; status=1; }
  cat "$OUT/bench-default-cuda-cublas-$attn.json"
done

say "Llama-3-70B dummy weights in q4_0 (40 GB on the device): troupe bench on the GPU"
(cd "$ROOT" && timeout 300 "$BIN/troupe" bench --device cuda --load-format dummy -m "$ROOT/configs/llama-3-70b.json" --dtype q4_0 -p 128 -n 32 -r 1 --json) >"$OUT/bench-70b-q4_0.json" 2>"$OUT/bench-70b-q4_0.log" ||
  { say "troupe bench of the 70B dummy shape failed"; tail -3 "$OUT/bench-70b-q4_0.log"; status=1; }
cat "$OUT/bench-70b-q4_0.json"

say "prompt-lookup drafts on the GPU (troupe run --draft-max): the same text, and the decode speed"
LOOKUP_PROMPT="Text: $(sed -n 1,12p "$ROOT/docs/serving.md" | tr '\n' ' ' | tr -d '`')
Repeat the text above word for word.
Text:"
for d in 0 16; do
  (cd "$ROOT" && timeout 60 "$BIN/troupe" run -m "${TROUPE_MODEL_PATH:-default}" --device cuda -p "$LOOKUP_PROMPT" -n 160 --temp 0 --draft-max $d) >"$OUT/lookup-$d.out" 2>"$OUT/lookup-$d.log" ||
    { say "troupe run --device cuda --draft-max $d failed"; tail -3 "$OUT/lookup-$d.log"; status=1; }
  echo "--draft-max $d: $(grep -oE 'decode: .*' "$OUT/lookup-$d.log")"
done
cmp -s "$OUT/lookup-0.out" "$OUT/lookup-16.out" || { say "--draft-max 16 changed the text on the GPU"; status=1; }

say "troupe serve --device cuda: one chat completion over HTTP, then SIGTERM"
PORT="${TROUPE_CHECK_PORT:-18431}"
"$BIN/troupe" serve "${TROUPE_MODEL_PATH:-default}" --device cuda --port "$PORT" >"$OUT/serve.log" 2>&1 &
SERVER=$!
timeout 120 python3 - "$PORT" >"$OUT/serve-reply.json" 2>&1 <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
for _ in range(240):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
        break
    except Exception:
        time.sleep(0.5)
models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10))
body = {"model": models["data"][0]["id"], "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24, "temperature": 0}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(req, timeout=60))
print(json.dumps(reply))
assert reply["choices"][0]["message"]["content"].strip(), "empty completion"
# Seeded sampling on the device, twice: the same text.
body.update({"temperature": 0.8, "top_p": 0.9, "seed": 7})
texts = []
for _ in range(2):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    texts.append(json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"])
print(json.dumps({"seeded": texts}))
assert texts[0] == texts[1] and texts[0].strip(), "seeded sampling is not reproducible"
PY
serve_rc=$?
kill -TERM "$SERVER" 2>/dev/null
wait "$SERVER"
server_rc=$?
cat "$OUT/serve-reply.json"
if [ $serve_rc -ne 0 ] || [ $server_rc -ne 0 ]; then
  say "serve check FAILED (client rc $serve_rc, server exit $server_rc): $OUT/serve.log"
  tail -5 "$OUT/serve.log"
  status=1
fi

echo
[ -f "$OUT/gpu-check.md" ] && cat "$OUT/gpu-check.md"
say "done in $(( $(date +%s) - T0 )) s, status $status"
exit $status
