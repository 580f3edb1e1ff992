#!/usr/bin/env bash
# Prepares, on the build machine, what a lent GPU machine needs to run bench/gpu/check.sh
# when it can build nothing itself (its image has no CAF or Cap'n Proto) and one device
# call carries at most 64 MiB: .devcarry/bin (stripped troupe, troupe_tests and
# troupe_gpu_bench with the shared libraries the image lacks, gzipped into one tarball --
# 72 MB as they are, 29 MB packed, at 5a32408 -- and the model's sha256) and the
# default model in two halves, .devcarry/model-a and .devcarry/model-b. Three device calls
# follow, one carrying each folder (docs/gpu.md, "On a lent machine"):
#   1. carry .devcarry/model-a:  bash bench/gpu/device_check.sh stage
#   2. carry .devcarry/model-b:  bash bench/gpu/device_check.sh stage
#   3. carry .devcarry/bin:      bash bench/gpu/device_check.sh run
# .devcarry/ is added to .git/info/exclude, so it travels only where a call carries it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${TROUPE_BUILD_DIR:-$ROOT/build}/bin"
MODEL="${TROUPE_MODEL_PATH:-${TROUPE_HOME:-$HOME/.cache/troupe}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
D="$ROOT/.devcarry"
for b in troupe troupe_tests troupe_gpu_bench; do
  [ -x "$BIN/$b" ] || { echo "device_prep: $BIN/$b is not built (scripts/test builds it)" >&2; exit 1; }
done
[ -f "$MODEL" ] || { echo "device_prep: no model at $MODEL (scripts/fetch-model)" >&2; exit 1; }
grep -qx '/.devcarry/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.devcarry/' >>"$ROOT/.git/info/exclude"
rm -rf "$D"
mkdir -p "$D/bin" "$D/model-a" "$D/model-b"
S="$D/staging"
mkdir -p "$S"
for b in troupe troupe_tests troupe_gpu_bench; do strip -o "$S/$b" "$BIN/$b"; done
# The libraries of ours that a CUDA image lacks (CUDA's own and glibc's are there).
# (Not PCRE2: the image has it, and its own tools, grep among them, would load ours.)
libs=$(ldd "$BIN/troupe" "$BIN/troupe_tests" "$BIN/troupe_gpu_bench" | awk '/=>/ {print $3}' | sort -u |
  { grep -E 'lib(caf|capnp|kj|spdlog|fmt|xxhash|hwy|openblas|boost)' || true; })
for lib in $libs; do cp -L "$lib" "$S/"; done
tar -czf "$D/bin/troupe-bin.tar.gz" -C "$S" .
rm -rf "$S"
packed=$(stat -c %s "$D/bin/troupe-bin.tar.gz")
if [ "$packed" -gt $((60 << 20)) ]; then
  echo "device_prep: the packed binaries are $packed bytes, over what one call carries (64 MiB with the rest)" >&2
  exit 1
fi
half=$(( ($(stat -L -c %s "$MODEL") + 1) / 2 ))
split -b "$half" -d -a 1 "$MODEL" "$D/part"
mv "$D/part0" "$D/model-a/model.part0"
mv "$D/part1" "$D/model-b/model.part1"
sha256sum "$MODEL" | awk '{print $1}' >"$D/bin/model.sha256"
du -sh "$D"/* >&2
