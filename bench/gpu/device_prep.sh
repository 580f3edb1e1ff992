#!/usr/bin/env bash
# Prepares, on the build machine, what a lent GPU machine needs to run bench/gpu/check.sh
# when it can build nothing itself (its image has no CAF or Cap'n Proto) and one device
# call carries at most 64 MiB: the stripped troupe, troupe_tests and troupe_gpu_bench with
# the shared libraries the image lacks, xz-packed into one tarball (100 MB as they are,
# 21 MB packed at 311a9f7; gzip made 39 MB), and the default model (98 MB) in two parts cut
# so that the second fits beside the binaries. Two device calls follow (docs/gpu.md, "On a
# lent machine"), so the machine has one gap fewer in which to go cold:
#   1. carry .devcarry/model-a:  bash bench/gpu/device_check.sh stage
#   2. carry .devcarry/bin:      bash bench/gpu/device_check.sh run
#      (.devcarry/bin: troupe-bin.tar.xz, the model's second part and its sha256)
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
mkdir -p "$D/bin"
S="$D/staging"
mkdir -p "$S"
for b in troupe troupe_tests troupe_gpu_bench; do strip -o "$S/$b" "$BIN/$b"; done
# The libraries of ours that a CUDA image lacks (CUDA's own and glibc's are there).
# (Not PCRE2: the image has it, and its own tools, grep among them, would load ours.)
libs=$(ldd "$BIN/troupe" "$BIN/troupe_tests" "$BIN/troupe_gpu_bench" | awk '/=>/ {print $3}' | sort -u |
  { grep -E 'lib(caf|capnp|kj|spdlog|fmt|xxhash|hwy|openblas|boost)' || true; })
for lib in $libs; do cp -L "$lib" "$S/"; done
echo "device_prep: packing the binaries (xz, about a minute)" >&2
XZ_OPT="-6 -T0" tar -cJf "$D/bin/troupe-bin.tar.xz" -C "$S" .
rm -rf "$S"
# What one call may carry: 64 MiB for the whole working tree that travels (this repo's
# tracked and untracked-not-ignored files, then the carried folder), less 1 MiB of room.
# The last call takes the binaries, the model's sha256 and the model's tail; the calls
# before it (usually one) the rest of the model, in order.
repo=$(cd "$ROOT" && git ls-files -z -co --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
budget=$(((63 << 20) - repo))
packed=$(stat -c %s "$D/bin/troupe-bin.tar.xz")
size=$(stat -L -c %s "$MODEL")
tail_bytes=$((budget - packed - 4096))
[ "$tail_bytes" -gt "$size" ] && tail_bytes=$size
if [ "$tail_bytes" -le 0 ]; then
  echo "device_prep: the binaries ($packed bytes) and this repo ($repo bytes) leave no room in a call" >&2
  exit 1
fi
rest=$((size - tail_bytes))
calls=$(((rest + budget - 1) / budget))
i=0
off=0
for letter in a b c d; do
  [ "$off" -ge "$rest" ] && break
  n=$((rest - off < budget ? rest - off : budget))
  mkdir -p "$D/model-$letter"
  dd if="$MODEL" of="$D/model-$letter/model.part$i" bs=1M iflag=skip_bytes,count_bytes skip="$off" count="$n" status=none
  off=$((off + n))
  i=$((i + 1))
done
[ "$off" -eq "$rest" ] || { echo "device_prep: the model needs more than five calls" >&2; exit 1; }
tail -c +"$((rest + 1))" "$MODEL" >"$D/bin/model.part$i"
sha256sum "$MODEL" | awk '{print $1}' >"$D/bin/model.sha256"
cat "$D"/model-*/model.part* "$D/bin/model.part$i" | cmp -s - "$MODEL" ||
  { echo "device_prep: the model's parts do not join back into it" >&2; exit 1; }
echo "device_prep: $((calls + 1)) device calls: 'stage' carrying each of $(cd "$D" && ls -d model-* | tr '\n' ' ')then 'run' carrying bin" >&2
du -sh "$D"/* >&2
