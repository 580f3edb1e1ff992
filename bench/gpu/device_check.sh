#!/usr/bin/env bash
# Runs on a lent GPU machine, in the copy of the working tree (see bench/gpu/device_prep.sh):
#   device_check.sh stage   copies the carried model part (.devcarry/model-a) into /tmp/troupe-model
#   device_check.sh run     joins it with the part carried beside the binaries
#                           (.devcarry/bin), checks the sha256, unpacks the binaries into
#                           /tmp/troupe-bin, runs bench/gpu/check.sh with them and packs
#                           its output into one file, $OUT/gpu-check.tar.gz (a call returns
#                           at most 8 files)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
M=/tmp/troupe-model
case "${1:-}" in
  stage)
    mkdir -p "$M"
    found=0
    for p in "$ROOT"/.devcarry/model-*/model.part*; do
      [ -f "$p" ] && cp "$p" "$M/" && found=1
    done
    [ $found -eq 1 ] || { echo "device_check: no model part carried (.devcarry/model-a)"; exit 1; }
    ls -la "$M"
    ;;
  run)
    C="$ROOT/.devcarry/bin"
    [ -f "$C/troupe-bin.tar.xz" ] || { echo "device_check: carry .devcarry/bin (bench/gpu/device_prep.sh)"; exit 1; }
    [ -f "$C/model.sha256" ] || { echo "device_check: $C/model.sha256 missing (bench/gpu/device_prep.sh)"; exit 1; }
    B=/tmp/troupe-bin
    rm -rf "$B" && mkdir -p "$B"
    # (tar's xz filter needs the xz tool; Python's tarfile reads xz without it)
    tar -xJf "$C/troupe-bin.tar.xz" -C "$B" 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$C/troupe-bin.tar.xz" "$B" ||
      { echo "device_check: cannot unpack $C/troupe-bin.tar.xz"; exit 1; }
    mkdir -p "$M" && cp "$C"/model.part* "$M/"
    cat "$M"/model.part? >"$M/model.gguf" 2>/dev/null  # (part0, part1, ...: in order)
    if ! echo "$(cat "$C/model.sha256")  $M/model.gguf" | sha256sum -c --status; then
      echo "device_check: the model parts are missing or damaged in $M (did the machine go cold between the calls?)"
      exit 3
    fi
    # cuBLAS 13: the toolkit's, else the pip wheel's (nvidia/cu13/lib).
    libs="$B"
    wheel_dirs=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas")))' 2>/dev/null)
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib $wheel_dirs; do
      [ -e "$d/libcublas.so.13" ] && libs="$libs:$d"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for b in troupe troupe_tests troupe_gpu_bench; do
      if ldd "$B/$b" | grep -q 'not found'; then
        echo "device_check: $b cannot load its libraries here:"; ldd "$B/$b" | grep 'not found'; exit 4
      fi
    done
    out="${OUT:-/tmp/out}"
    mkdir -p "$out/gpu"
    # One file back whatever happens (a call returns at most 8), the console log included;
    # check.sh is stopped well inside the call's 600 s.
    trap 'tar -czf "$out/gpu-check.tar.gz" -C "$out" gpu && rm -rf "$out/gpu"' EXIT
    TROUPE_BIN_DIR="$B" TROUPE_MODEL_PATH="$M/model.gguf" timeout -k 10 "${TROUPE_CHECK_TIMEOUT:-420}" \
      bash "$ROOT/bench/gpu/check.sh" "$out/gpu" 2>&1 | tee "$out/gpu/console.log"
    rc=${PIPESTATUS[0]}
    echo "device_check: check.sh exited $rc (124: stopped at the time limit); output in gpu-check.tar.gz"
    exit $rc
    ;;
  *)
    echo "usage: device_check.sh stage|run" >&2
    exit 2
    ;;
esac
