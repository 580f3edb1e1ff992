#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz/ with clang++ (ASan + UBSan) and runs each one
# for SECONDS (default 20) on a copy of its committed seed corpus.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET...]      e.g. tests/fuzz/run.sh 600 gguf_fuzz
#
# Environment:
#   TROUPE_BUILD_DIR   build directory (default: build); everything goes to $TROUPE_BUILD_DIR/fuzz
#   CLANGXX            compiler (default: clang++)
#   FUZZ_JOBS          parallel compile jobs (default: 2)
#   FUZZ_KEEP_CORPUS=1 keep the working corpus of earlier runs instead of starting from the seeds
#   FUZZ_BUILD_ONLY=1  build, do not run
#   TROUPE_MODEL_PATH / TROUPE_HOME   the model whose vocabulary tokenizer_fuzz uses
#
# Exits non-zero when a build fails or any target finds a crash, leak, timeout or OOM; the
# input that triggered it is kept under $TROUPE_BUILD_DIR/fuzz/artifacts/<target>/ and its
# path is printed, ready to replay with `<binary> <input>`.
set -uo pipefail

SECONDS_PER_TARGET="${1:-20}"
shift || true
if ! [[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]] || [ "$SECONDS_PER_TARGET" -lt 1 ]; then
  echo "usage: $0 [SECONDS] [TARGET...]" >&2
  exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${TROUPE_BUILD_DIR:-build}"
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
OUT="$BUILD/fuzz"
CXX="${CLANGXX:-clang++}"
JOBS="${FUZZ_JOBS:-2}"
FUZZ_DIR="$REPO/tests/fuzz"

if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "fuzz: $CXX not found; install clang (with libFuzzer) to build the fuzz targets" >&2
  exit 1
fi

ALL_TARGETS=(gguf_fuzz safetensors_fuzz chat_template_fuzz tokenizer_fuzz openai_request_fuzz codec_fuzz)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (known: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

# The targets are CMake targets (tests/fuzz/CMakeLists.txt) of a clang build of their own,
# configured once under $OUT/cmake with -DTROUPE_BUILD_FUZZ=ON; each links the library it
# exercises, and only those libraries are compiled.
CC_FOR_CXX="${CXX/clang++/clang}"
CMAKE_DIR="$OUT/cmake"
mkdir -p "$OUT/bin"
if [ ! -f "$CMAKE_DIR/build.ninja" ]; then
  echo "fuzz: configuring the fuzz build in $CMAKE_DIR"
  if ! cmake -S "$REPO" -B "$CMAKE_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_CXX_FLAGS_FUZZ="-O1 -g" \
      -DCMAKE_C_FLAGS_FUZZ="-O1 -g" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_COMPILER="$CC_FOR_CXX" \
      -DTROUPE_BUILD_FUZZ=ON -DTROUPE_ENABLE_CUDA=OFF -DTROUPE_BUILD_TESTS=OFF >"$OUT/configure.log" 2>&1; then
    echo "fuzz: configuring the fuzz build failed; the end of $OUT/configure.log:" >&2
    tail -20 "$OUT/configure.log" >&2
    rm -f "$CMAKE_DIR/build.ninja"
    exit 1
  fi
fi
echo "fuzz: building ${TARGETS[*]}"
if ! cmake --build "$CMAKE_DIR" -j "$JOBS" --target "${TARGETS[@]}"; then
  echo "fuzz: compilation failed" >&2
  exit 1
fi
for t in "${TARGETS[@]}"; do ln -sf "$CMAKE_DIR/bin/$t" "$OUT/bin/$t"; done
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && { echo "fuzz: built ${TARGETS[*]} in $OUT/bin"; exit 0; }

# Run each target on a copy of its seed corpus (the committed corpus is never written).
FAILED=()
SUMMARY=()
for t in "${TARGETS[@]}"; do
  name="${t%_fuzz}"
  seeds="$FUZZ_DIR/corpus/$name"
  work="$OUT/corpus/$name"
  art="$OUT/artifacts/$t"
  log="$OUT/logs/$t.log"
  mkdir -p "$art" "$OUT/logs"
  [ "${FUZZ_KEEP_CORPUS:-0}" = 1 ] || rm -rf "$work"
  mkdir -p "$work"
  [ -d "$seeds" ] && cp -p "$seeds"/* "$work"/ 2>/dev/null
  args=(-max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
        -artifact_prefix="$art/")
  [ -f "$FUZZ_DIR/$name.dict" ] && args+=(-dict="$FUZZ_DIR/$name.dict")
  before="$(ls -A "$art" | sort)"
  echo "fuzz: running $t for ${SECONDS_PER_TARGET}s on $(ls -A "$work" | wc -l) seeds (log: $log)"
  "$OUT/bin/$t" "${args[@]}" "$work" >"$log" 2>&1
  rc=$?
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')"
  [ -z "$execs" ] && execs="$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')"
  [ -z "$execs" ] && execs="?"
  new_artifacts="$(comm -13 <(echo "$before") <(ls -A "$art" | sort) | sed '/^$/d')"
  if [ "$rc" -ne 0 ]; then
    FAILED+=("$t")
    SUMMARY+=("$t: FAILED (exit $rc) after $execs executions")
    echo "fuzz: $t FAILED (exit $rc) after $execs executions; last lines of $log:" >&2
    grep -E 'ERROR|SUMMARY|WARNING|runtime error|Test unit written|deadly signal|==[0-9]+==' "$log" | head -20 >&2
    if [ -n "$new_artifacts" ]; then
      while IFS= read -r a; do echo "fuzz: $t: input kept at $art/$a (replay: $OUT/bin/$t $art/$a)" >&2; done <<<"$new_artifacts"
    fi
  else
    SUMMARY+=("$t: ok, $execs executions in ${SECONDS_PER_TARGET}s, corpus $(ls -A "$work" | wc -l) inputs")
  fi
done

echo "fuzz: summary"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "fuzz: ${#FAILED[@]} target(s) found problems: ${FAILED[*]} (inputs under $OUT/artifacts/)" >&2
  exit 1
fi
exit 0
