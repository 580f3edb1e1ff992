#!/usr/bin/env bash
# The simulator's expert-worker layouts against real runs on this machine: calibrates the
# cost model through a real `troupe serve` (no expert workers), fits the hand-off to 1 and 2
# local expert workers and to 1 worker on a `troupe node` over loopback (`sim calibrate
# --expert-parallel / --expert-placement`), then replays sim/examples/validate-cpu.csv at three
# loads through the real server and the simulator for each layout (`sim validate`), and
# writes the table of the simulator's errors.
#
#   [EXPERTS=64] bench/cpu/sim_ep_validate.sh MODEL.gguf OUT_DIR
# (MODEL: e.g. the OLMoE-shaped file of bench/cpu/make_moe_gguf.py)
set -euo pipefail
MODEL="$1"; OUT="$2"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$ROOT/build/bin/troupe"
mkdir -p "$OUT"
T=(-m "$MODEL" -t 2)
"$BIN" sim calibrate "${T[@]}" --hardware "$ROOT/sim/profiles/cpu-avx512.json" --via-serve --repetitions 2 \
  --name "cpu (2-core AMD EPYC VM, AVX-512 VNNI; $(basename "$MODEL") through troupe serve, 2 threads)" \
  --out "$OUT/base.json" --samples-out "$OUT/base-steps.csv" > "$OUT/calibrate-base.log" 2>&1
for n in 1 2; do
  "$BIN" sim calibrate "${T[@]}" --hardware "$OUT/base.json" --expert-parallel "$n" --repetitions 2 \
    --name "cpu (as base.json) with $n local expert worker(s)" \
    --out "$OUT/ep$n.json" --samples-out "$OUT/ep$n-steps.csv" > "$OUT/calibrate-ep$n.log" 2>&1
done
# One expert worker holding every expert on a troupe node (another process, loopback link).
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$OUT/node.key"
rm -f "$OUT/node.port"
"$BIN" node -m "$MODEL" -t 2 --key-file "$OUT/node.key" --port 0 --port-file "$OUT/node.port" > "$OUT/node.log" 2>&1 &
NODE=$!
trap 'kill $NODE 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do [ -s "$OUT/node.port" ] && break; sleep 0.1; done
E="${EXPERTS:-64}"  # the file's routed experts (OLMoE's 64 by default)
printf '{"workers": [{"name": "far", "experts": "0-%d", "node": "127.0.0.1:%s"}]}\n' $((E - 1)) "$(cat "$OUT/node.port")" \
  > "$OUT/node-placement.json"
NODEF=(--expert-placement "$OUT/node-placement.json" --node-key-file "$OUT/node.key")
"$BIN" sim calibrate "${T[@]}" --hardware "$OUT/base.json" "${NODEF[@]}" --repetitions 2 \
  --name "cpu (as base.json) with 1 expert worker on a troupe node over loopback" \
  --out "$OUT/node1.json" --samples-out "$OUT/node1-steps.csv" > "$OUT/calibrate-node1.log" 2>&1
"$BIN" sim validate "${T[@]}" --hardware "$OUT/base.json" --out "$OUT/val-none" > "$OUT/validate-none.log" 2>&1
for n in 1 2; do
  "$BIN" sim validate "${T[@]}" --hardware "$OUT/ep$n.json" --expert-parallel "$n" --out "$OUT/val-ep$n" \
    > "$OUT/validate-ep$n.log" 2>&1
done
"$BIN" sim validate "${T[@]}" --hardware "$OUT/node1.json" "${NODEF[@]}" --out "$OUT/val-node1" \
  > "$OUT/validate-node1.log" 2>&1
python3 "$ROOT/bench/cpu/sim_ep_table.py" "$OUT" > "$OUT/table.md"
cat "$OUT/table.md"
