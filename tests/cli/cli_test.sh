#!/usr/bin/env bash
# End-to-end checks of the troupe executable: the main job on the default model, and bad
# input of every kind the command line can receive (clear one-line error, non-zero exit,
# no crash). Usage: cli_test.sh path/to/troupe
set -uo pipefail
TROUPE="$1"
MODEL="${TROUPE_MODEL_PATH:-${TROUPE_HOME:-$HOME/.cache/troupe}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
fails=0

# expect NAME WANT_EXIT PATTERN -- ARGS...: runs troupe, checks the exit code (0, or any
# non-zero for "nz") and that stdout+stderr match PATTERN; a crash (signal) always fails.
# EXPECT_TIMEOUT (seconds, default 120) bounds one run.
expect() {
  local name="$1" want="$2" pattern="$3"
  shift 4
  local out rc
  out="$(timeout "${EXPECT_TIMEOUT:-120}" "$TROUPE" "$@" 2>&1 </dev/null)"
  rc=$?
  local ok=1
  if [ $rc -ge 124 ]; then ok=0; fi
  if [ "$want" = "nz" ]; then [ $rc -ne 0 ] || ok=0; else [ $rc -eq "$want" ] || ok=0; fi
  grep -qE -- "$pattern" <<<"$out" || ok=0  # not a pipe: with pipefail, grep -q's early exit would fail printf
  if [ $ok -eq 1 ]; then
    echo "ok   $name (exit $rc)"
  else
    echo "FAIL $name (exit $rc, wanted $want and /$pattern/)"
    printf '%s\n' "$out" | tail -5 | sed 's/^/     | /'
    fails=$((fails + 1))
  fi
}

if [ ! -f "$MODEL" ]; then
  echo "FAIL default model missing at $MODEL: run scripts/fetch-model"
  exit 1
fi

expect "paris" 0 "Paris" -- run -m "$MODEL" -p "The capital of France is" --temperature 0 -n 16 -t 2
expect "speed on stderr" 0 "decode: 16 tokens, [0-9.]+ tok/s" -- run -m "$MODEL" -p "Hello" --temperature 0 -n 16 --ignore-eos
expect "seeded sampling" 0 "." -- run -m "$MODEL" -p "Once upon a time" --seed 7 -n 8
a="$("$TROUPE" run -m "$MODEL" -p "Once upon a time" --seed 7 -n 12 2>/dev/null)"
b="$("$TROUPE" run -m "$MODEL" -p "Once upon a time" --seed 7 -n 12 2>/dev/null)"
if [ "$a" = "$b" ] && [ -n "$a" ]; then echo "ok   same seed, same output"; else echo "FAIL same seed gave different output"; fails=$((fails + 1)); fi
printf 'What is 2+2?\n' > "$TMP/chat.txt"
out="$("$TROUPE" run -m "$MODEL" --chat --temperature 0 -n 24 < "$TMP/chat.txt" 2>&1)"
if printf '%s' "$out" | grep -q "4"; then echo "ok   chat answers"; else echo "FAIL chat: $out" | tail -3; fails=$((fails + 1)); fi

printf 'What is 2+2?\nAnd what is 3+3?\n' > "$TMP/chat2.txt"
n="$("$TROUPE" run -m "$MODEL" --chat --temperature 0 -n 24 < "$TMP/chat2.txt" 2>&1 | grep -c 'decode:')"
if [ "$n" = "2" ]; then echo "ok   two chat turns answered"; else echo "FAIL two chat turns: $n replies"; fails=$((fails + 1)); fi

# Prompt-lookup drafts (--draft-max) change the steps, never the text: greedy, seeded
# sampling and a two-turn chat (the cache keeps only accepted drafts across turns) give the
# same stdout as without; the stats line counts the drafts.
copy="Copy this text exactly. Text: The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. Copy:"
for args in "--temperature 0" "--seed 11 --temperature 0.7 --repeat-penalty 1.1"; do
  # shellcheck disable=SC2086
  a="$("$TROUPE" run -m "$MODEL" -p "$copy" -n 48 --ignore-eos $args 2>/dev/null)"
  # shellcheck disable=SC2086
  b="$("$TROUPE" run -m "$MODEL" -p "$copy" -n 48 --ignore-eos $args --draft-max 8 2>"$TMP/draft.err")"
  if [ "$a" = "$b" ] && [ -n "$a" ] && grep -qE '[0-9]+ of [0-9]+ drafts accepted' "$TMP/draft.err"; then
    echo "ok   --draft-max: same text ($args): $(grep -oE '[0-9]+ steps, [0-9]+ of [0-9]+ drafts accepted' "$TMP/draft.err")"
  else
    echo "FAIL --draft-max changed the text or printed no draft counts ($args)"; fails=$((fails + 1))
  fi
done
printf 'Repeat after me: one two three four five six.\nNow say it again.\n' > "$TMP/chat3.txt"
a="$("$TROUPE" run -m "$MODEL" --chat --temperature 0 -n 32 < "$TMP/chat3.txt" 2>/dev/null)"
b="$("$TROUPE" run -m "$MODEL" --chat --temperature 0 -n 32 --draft-max 6 < "$TMP/chat3.txt" 2>/dev/null)"
if [ "$a" = "$b" ] && [ -n "$a" ]; then echo "ok   --draft-max: same two-turn chat"; else echo "FAIL --draft-max changed a chat"; fails=$((fails + 1)); fi
expect "draft-max negative" nz "draft-max" -- run -m "$MODEL" -p hi --draft-max -1
expect "draft-max too large" nz "draft-max" -- run -m "$MODEL" -p hi --draft-max 65

expect "empty prompt" 2 "the prompt is empty" -- run -m "$MODEL" -p ""
printf '\xff\xfe bad' > "$TMP/bad_utf8"
expect "invalid utf-8" 2 "not valid UTF-8" -- run -m "$MODEL" -p "$(cat "$TMP/bad_utf8")"
long="$(python3 -c 'print("word " * 3000)')"
expect "prompt longer than context" 2 "more than the context" -- run -m "$MODEL" -p "$long" -c 512
expect "missing model" 1 "cannot open" -- run -m "$TMP/nope.gguf" -p hi
# A mixture-of-experts GGUF (Mixtral-shaped, 4 experts top-2; the file of the MoE golden test,
# byte for byte): it generates, the same tokens on 1 and 2 threads; a hostile one is refused.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python3 "$HERE/make_tiny_moe.py" "$TMP/moe.gguf"
expect "moe run" 0 "decode: 16 tokens" -- run -m "$TMP/moe.gguf" -p "ab ab a" --temperature 0 -n 16 --ignore-eos
a="$("$TROUPE" run -m "$TMP/moe.gguf" -p "ab ab a" --temperature 0 -n 16 --ignore-eos -t 1 2>/dev/null | od -An -tx1)"
b="$("$TROUPE" run -m "$TMP/moe.gguf" -p "ab ab a" --temperature 0 -n 16 --ignore-eos -t 2 2>/dev/null | od -An -tx1)"
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok   moe run: 1 and 2 threads give the same bytes"; else echo "FAIL moe run: 1 vs 2 threads differ"; fails=$((fails + 1)); fi
expect "moe bench" 0 "tg_tok_s" -- bench -m "$TMP/moe.gguf" -p 32 -n 8 -r 1 --json
python3 "$HERE/make_tiny_moe.py" "$TMP/moe_bad.gguf" 5
expect "moe top-k > experts" 1 "experts per token 5" -- run -m "$TMP/moe_bad.gguf" -p hi
printf 'GGUF' > "$TMP/trunc.gguf"
expect "truncated model" 1 "truncated file" -- run -m "$TMP/trunc.gguf" -p hi
head -c 1000000 "$MODEL" > "$TMP/cut.gguf"
expect "model cut in the middle" 1 "cannot fit|past the end|truncated" -- run -m "$TMP/cut.gguf" -p hi
printf 'not a model at all, just text\n' > "$TMP/text.gguf"
expect "not a gguf" 1 "bad magic" -- run -m "$TMP/text.gguf" -p hi
expect "negative temperature" 2 "temperature" -- run -m "$MODEL" -p hi --temperature -1
expect "NaN top-p" 2 "top_p" -- run -m "$MODEL" -p hi --top-p nan
expect "bad threads" 1 "threads" -- run -m "$MODEL" -p hi -t -3
expect "unknown flag" nz "not expected|extras|following arguments" -- run --no-such-flag
expect "help lists flags" 0 "--temperature" -- run --help
expect "bench json" 0 "\"tg_tok_s\"" -- bench -m "$MODEL" -p 16 -n 4 -r 1 --json

# sim: the new inputs and commands (the simulator itself is tested in tests/sim).
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
expect "sim sharegpt" 0 "simulated 12 requests" -- sim --trace "$SRC/sim/examples/sharegpt.json" --rate 2 --out "$TMP/sg"
expect "sim azure 2024" 0 "simulated 10 requests" -- sim --trace "$SRC/sim/examples/azure_llm_inference_2024.csv" --out "$TMP/az"
expect "sim lengths from a trace" 0 "simulated 30 requests" -- sim --requests 30 --prompt-len "trace:$SRC/sim/examples/validate-cpu.csv" --out "$TMP/tl"
expect "sim chunked prefill off refuses long prompts" 0 "simulated 20 requests" -- sim --requests 20 --no-chunked-prefill --prompt-len uniform:100:900 --out "$TMP/nc"
expect "sweep over a scheduler flag" 0 "wrote .*sweep.svg" -- sim sweep --rates 1,2 --policies fcfs --param chunked-prefill --values 0,1 --requests 40 --out "$TMP/sw"
grep -q "fcfs chunked-prefill=0 p99" "$TMP/sw/sweep.svg" || { echo "FAIL sweep legend names the flag value"; fails=$((fails + 1)); }
expect "sim disaggregation" 0 "simulated 50 requests" -- sim --requests 50 --rate 5 --prefill-instances 1 --decode-instances 2 --kv-transfer-bandwidth 1e9 --out "$TMP/pd"
# The scheduler's decisions are byte-identical to the committed ones (tests/golden/sim/decisions.txt).
while IFS='|' read -r name sum args; do
  case "$name" in ''|'#'*) continue ;; esac
  # shellcheck disable=SC2086
  if timeout 300 "$TROUPE" sim $args --log-decisions --out "$TMP/golden-$name" >/dev/null 2>&1 &&
     [ "$(sha256sum <"$TMP/golden-$name/decisions.log" | cut -d' ' -f1)" = "$sum" ]; then
    echo "ok   sim decisions $name match the golden log"
  else
    echo "FAIL sim decisions $name differ from tests/golden/sim/decisions.txt (or the run failed)"
    fails=$((fails + 1))
  fi
done <"$SRC/tests/golden/sim/decisions.txt"
expect "sim half a disaggregation" 2 "go together" -- sim --requests 5 --prefill-instances 1 --out "$TMP/pd2"
expect "sim expert parallel" 0 "simulated 50 requests" -- sim --requests 50 --model-config "$SRC/configs/mixtral-8x7b.json" --hardware "$SRC/sim/profiles/h200.json" --ep-degree 4 --all-to-all-bandwidth 4e11 --expert-imbalance 1.2 --out "$TMP/ep"
expect "sim ep on a dense model" 2 "mixture-of-experts" -- sim --requests 5 --ep-degree 2 --out "$TMP/ep2"
expect "sim pipeline" 0 "simulated 50 requests" -- sim --requests 50 --pipeline-stages 3 --micro-batches 2 --stage-bandwidth 1e10 --out "$TMP/pp"
expect "sweep unknown flag" 2 "is not one of" -- sim sweep --rates 1 --param warp-speed --values 1 --out "$TMP/sw2"
expect "sweep values without param" 2 "go together" -- sim sweep --rates 1 --values 1 --out "$TMP/sw3"
expect "sweep bad metric" 2 "metric" -- sim sweep --rates 1 --metric joy --out "$TMP/sw4"
expect "validate bad trace" 2 "cannot open" -- sim validate -m "$MODEL" --trace "$TMP/none.csv" --out "$TMP/v0"
expect "calibrate needs out" nz "out" -- sim calibrate -m "$MODEL"
# The real commands, briefly: calibrate on this machine (engine steps, then through a real
# troupe serve), then validate a 6-request trace at one rate against a real troupe serve.
EXPECT_TIMEOUT=900 expect "sim calibrate" 0 "step-time error" -- sim calibrate -m "$MODEL" --out "$TMP/cal.json" --samples-out "$TMP/cal.csv"
grep -q '"step_overhead_s"' "$TMP/cal.json" || { echo "FAIL calibrate wrote no profile"; fails=$((fails + 1)); }
printf 'arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_tokens\n0,40,12,0,32\n0.3,60,8,-1,0\n0.5,36,16,0,32\n0.9,80,10,-1,0\n1.2,20,12,-1,0\n1.4,50,6,-1,0\n' > "$TMP/mini.csv"
EXPECT_TIMEOUT=600 expect "sim validate" 0 "TTFT p50 .*%" -- sim validate -m "$MODEL" --trace "$TMP/mini.csv" --hardware "$TMP/cal.json" --rates 2 --out "$TMP/val"
grep -q '"real"' "$TMP/val/validation.json" || { echo "FAIL validate wrote no JSON"; fails=$((fails + 1)); }
# Speculation: the real server speculates, the simulator takes the rates it measured.
EXPECT_TIMEOUT=600 expect "sim validate speculative" 0 "step time, mean .*%" -- sim validate -m "$MODEL" --trace "$TMP/mini.csv" --hardware "$TMP/cal.json" --speculative ngram --rates 2 --out "$TMP/val-spec"
grep -q '"acceptance"' "$TMP/val-spec/validation.json" || { echo "FAIL validate --speculative wrote no rates"; fails=$((fails + 1)); }
# Agent pipelines (docs/pipelines.md): the examples check, the calculator one runs on the
# default model (its tool result is the expression's value), bad specs and inputs refused.
expect "pipeline check" 0 "4 nodes, in order: answers majority exact report" -- pipeline check "$SRC/docs/pipelines/vote.json"
expect "pipeline run tool" 0 '"tool_result".*"tool":"calculator"' -- pipeline run -m "$MODEL" -t 2 --events "$SRC/docs/pipelines/calculator.json" -i "question=What is 12 plus 7?"
expect "pipeline missing input" 2 "needs --input question" -- pipeline run -m "$MODEL" "$SRC/docs/pipelines/vote.json"
printf '{"name":"c","nodes":[{"id":"a","type":"generate","prompt":"{{b}}"},{"id":"b","type":"generate","prompt":"{{a}}"}]}' >"$TMP/cycle.json"
expect "pipeline cycle" 2 "is on a cycle" -- pipeline check "$TMP/cycle.json"
printf '{"name":"c","nodes":[{"id":"t","type":"tool","tool":"shell","input":"ls"}]}' >"$TMP/shell.json"
expect "pipeline tool not allowed" 2 "node 't': tool 'shell' is not allowed" -- pipeline check "$TMP/shell.json"
expect "pipeline not json" 2 "not valid JSON" -- pipeline check "$SRC/README.md"
expect "sim speculative" 0 "simulated 20 requests" -- sim --requests 20 --speculative-tokens 4 --spec-acceptance 0.8 --out "$TMP/spec"
expect "sim speculative bad rate" 2 "within 0..1" -- sim --requests 5 --speculative-tokens 4 --spec-acceptance 1.5 --out "$TMP/spec2"
expect "sim speculative cluster" 2 "one instance" -- sim --requests 5 --speculative-tokens 4 --instances 2 --out "$TMP/spec3"
expect "serve speculative unknown" 2 "unknown speculative method" -- serve -m "$MODEL" --port 0 --speculative medusa
# Expert workers: the hand-off fitted through a real troupe serve --expert-parallel 2 (its
# --step-log), then the simulator with that layout, on the GGUF's own config.
EXPECT_TIMEOUT=600 expect "sim calibrate experts" 0 "expert hand-off: .* ms per MoE layer" -- sim calibrate -m "$TMP/moe.gguf" --hardware "$TMP/cal.json" --expert-parallel 2 --out "$TMP/cal-ep.json"
grep -q '"expert_row_s"\|"expert_hop_s"' "$TMP/cal-ep.json" || { echo "FAIL calibrate wrote no hand-off"; fails=$((fails + 1)); }
head -1 "$TMP/cal-ep.json.steps.csv" | grep -q '^seconds,compute_seconds,seqs$' || { echo "FAIL no step log"; fails=$((fails + 1)); }
expect "sim expert workers" 0 "simulated 20 requests" -- sim --requests 20 --model-config "$TMP/moe.gguf" --hardware "$TMP/cal-ep.json" --expert-workers 2 --out "$TMP/epw"
expect "sim expert workers and ep" 2 "not both" -- sim --requests 5 --model-config "$TMP/moe.gguf" --expert-workers 2 --ep-degree 2 --out "$TMP/epw2"
expect "sim expert workers dense" 2 "mixture-of-experts" -- sim --requests 5 --expert-workers 2 --out "$TMP/epw3"
EXPECT_TIMEOUT=600 expect "sim validate experts" 0 "step time, mean .*%" -- sim validate -m "$TMP/moe.gguf" --trace "$TMP/mini.csv" --hardware "$TMP/cal-ep.json" --expert-parallel 2 --rates 2 --out "$TMP/val-ep"
expect "serve unwritable step log" 2 "cannot write" -- serve -m "$MODEL" --port 0 --step-log "$TMP/no/such/dir/steps.csv"
expect "calibrate bad step log" 2 "not a step log" -- sim calibrate -m "$MODEL" --steps "$TMP/mini.csv" --out "$TMP/cal-x.json"

echo "$fails failure(s)"
[ $fails -eq 0 ]
