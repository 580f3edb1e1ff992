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

CXXFLAGS=(-O1 -g -std=c++20 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
          -fno-omit-frame-pointer "-I$REPO" "-I$OUT/gen")
LDLIBS=(-lpcre2-8 -lcapnp -lkj)

# Library sources each target needs (compiled once into shared objects).
SRC_CORE=(kernels/dtype.cpp runtime/mapped_file.cpp runtime/gguf.cpp)
SRC_TOKENIZER=(runtime/tokenizer.cpp runtime/tokenizer_bpe.cpp runtime/tokenizer_load.cpp runtime/tokenizer_utf8.cpp)
SRC_TEMPLATE=(runtime/chat_template.cpp)
for f in "$REPO"/runtime/jinja_*.cpp; do SRC_TEMPLATE+=("runtime/$(basename "$f")"); done

ALL_TARGETS=(gguf_fuzz safetensors_fuzz chat_template_fuzz tokenizer_fuzz openai_request_fuzz codec_fuzz)
target_sources() {
  case "$1" in
    gguf_fuzz) echo tests/fuzz/gguf_fuzz.cpp "${SRC_CORE[@]}" "${SRC_TOKENIZER[@]}" ;;
    safetensors_fuzz) echo tests/fuzz/safetensors_fuzz.cpp runtime/safetensors.cpp kernels/dtype.cpp runtime/mapped_file.cpp ;;
    chat_template_fuzz) echo tests/fuzz/chat_template_fuzz.cpp "${SRC_TEMPLATE[@]}" ;;
    tokenizer_fuzz) echo tests/fuzz/tokenizer_fuzz.cpp "${SRC_CORE[@]}" "${SRC_TOKENIZER[@]}" ;;
    openai_request_fuzz) echo tests/fuzz/openai_request_fuzz.cpp apps/serve/openai_request.cpp runtime/sampler.cpp runtime/json_constraint.cpp runtime/context_fit.cpp ;;
    # (gen/: generated under $OUT from schema/troupe.capnp, below)
    codec_fuzz) echo tests/fuzz/codec_fuzz.cpp actors/codec.cpp gen/troupe.capnp.c++ ;;
    *) return 1 ;;
  esac
}

TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  target_sources "$t" >/dev/null || { echo "fuzz: unknown target '$t' (known: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

mkdir -p "$OUT/obj" "$OUT/bin"
# Flags or compiler changed -> rebuild everything.
FLAGS_ID="$("$CXX" --version | head -1) ${CXXFLAGS[*]} ${LDLIBS[*]}"
if [ "$(cat "$OUT/flags" 2>/dev/null)" != "$FLAGS_ID" ]; then
  rm -f "$OUT"/obj/*.o "$OUT"/obj/*.d "$OUT"/bin/*
  printf '%s' "$FLAGS_ID" >"$OUT/flags"
fi

obj_of() { local s="${1//\//_}"; echo "$OUT/obj/${s%.cpp}.o"; }
# A source's path: gen/... is generated under $OUT, everything else is in the repository.
src_path() { case "$1" in gen/*) echo "$OUT/$1" ;; *) echo "$REPO/$1" ;; esac; }

# The Cap'n Proto code of the wire schema (codec_fuzz), regenerated when the schema changes.
mkdir -p "$OUT/gen"
if [ "$REPO/schema/troupe.capnp" -nt "$OUT/gen/troupe.capnp.h" ]; then
  if ! command -v capnp >/dev/null 2>&1; then
    echo "fuzz: capnp not found; install capnproto to generate the schema for codec_fuzz" >&2
    exit 1
  fi
  capnp compile "-oc++:$OUT/gen" "--src-prefix=$REPO/schema" "$REPO/schema/troupe.capnp" || {
    echo "fuzz: capnp compile of schema/troupe.capnp failed" >&2
    exit 1
  }
fi

# An object is stale when it is missing or any file in its dependency list (the source and
# every header it included, from -MMD) is newer.
stale() {
  local src="$1" obj="$2" dep="${2%.o}.d"
  [ -f "$obj" ] && [ -f "$dep" ] || return 0
  [ "$(src_path "$src")" -nt "$obj" ] && return 0
  local f
  for f in $(sed -e 's/\\$//' -e 's/^[^:]*://' "$dep"); do
    [ -e "$f" ] || return 0
    [ "$f" -nt "$obj" ] && return 0
  done
  return 1
}

# Compile every needed source once, up to $JOBS at a time.
declare -A SEEN=()
NEEDED=()
for t in "${TARGETS[@]}"; do
  for s in $(target_sources "$t"); do
    [ -n "${SEEN[$s]:-}" ] && continue
    SEEN[$s]=1
    NEEDED+=("$s")
  done
done
PIDS=()
BUILD_FAILED=0
wait_one() {
  local pid="${PIDS[0]}"
  PIDS=("${PIDS[@]:1}")
  wait "$pid" || BUILD_FAILED=1
}
for s in "${NEEDED[@]}"; do
  o="$(obj_of "$s")"
  if stale "$s" "$o"; then
    echo "fuzz: compiling $s"
    "$CXX" "${CXXFLAGS[@]}" -MMD -MF "${o%.o}.d" -c "$(src_path "$s")" -o "$o.tmp" && mv "$o.tmp" "$o" &
    PIDS+=("$!")
    [ ${#PIDS[@]} -ge "$JOBS" ] && wait_one
  fi
done
while [ ${#PIDS[@]} -gt 0 ]; do wait_one; done
if [ "$BUILD_FAILED" -ne 0 ]; then
  echo "fuzz: compilation failed" >&2
  exit 1
fi

for t in "${TARGETS[@]}"; do
  bin="$OUT/bin/$t"
  objs=()
  relink=0
  [ -x "$bin" ] || relink=1
  for s in $(target_sources "$t"); do
    o="$(obj_of "$s")"
    objs+=("$o")
    [ "$o" -nt "$bin" ] && relink=1
  done
  if [ "$relink" -eq 1 ]; then
    echo "fuzz: linking $t"
    "$CXX" "${CXXFLAGS[@]}" "${objs[@]}" "${LDLIBS[@]}" -o "$bin.tmp" && mv "$bin.tmp" "$bin" || {
      echo "fuzz: linking $t failed" >&2
      exit 1
    }
  fi
done
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
