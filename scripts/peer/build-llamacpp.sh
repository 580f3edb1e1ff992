#!/usr/bin/env bash
# Builds the peer (llama.cpp, as vendored by llama-cpp-python) OUTSIDE the repo, and installs the
# llama-cpp-python bindings so they load that very library (no second compile).
#
#   scripts/peer/build-llamacpp.sh            # idempotent: re-running skips finished steps
#
# Environment:
#   PEER_DIR      where the sdist is unpacked and built (default ${TROUPE_HOME:-$HOME/.cache/troupe}/peer)
#   LLCPP_VERSION llama-cpp-python version to pin (default 0.3.36)
#   JOBS          ninja jobs (default: nproc)
#   NICE          nice level for the heavy steps (default 15)
#   FORCE=1       reconfigure and rebuild even if the binaries exist
#
# Result (printed at the end; source it or copy the lines):
#   $PEER_DIR/llama-cpp-python-$V/vendor/llama.cpp/build/bin/{llama-bench,llama-cli,llama-server,
#       llama-completion,llama-tokenize,libllama.so,libggml*.so,libmtmd.so}
#   export LLAMA_CPP_LIB_PATH=<that bin dir>   # llama_cpp/llama_cpp.py reads it to find libllama.so
#   export MTMD_CPP_LIB=<that bin dir>/libmtmd.so
#
# The Python package is installed with CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF": its
# CMakeLists.txt puts the whole llama.cpp build under if(LLAMA_BUILD), so the wheel holds only the
# Python code, and without LLAMA_CPP_LIB_PATH it fails to import (no llama_cpp/lib/libllama.so).
# Nothing here is ever committed: peer code and weights stay out of the repo.
set -euo pipefail

V="${LLCPP_VERSION:-0.3.36}"
PEER_DIR="${PEER_DIR:-${TROUPE_HOME:-$HOME/.cache/troupe}/peer}"
JOBS="${JOBS:-$(nproc)}"
NICE="${NICE:-15}"
PY="${PYTHON:-python3}"

SRC="$PEER_DIR/llama-cpp-python-$V"
LLAMA="$SRC/vendor/llama.cpp"
BUILD="$LLAMA/build"
BIN="$BUILD/bin"
DL="$PEER_DIR/dl"
TARGETS=(llama mtmd llama-bench llama-cli llama-server llama-completion llama-tokenize)

log() { printf '[build-llamacpp] %s\n' "$*" >&2; }

mkdir -p "$PEER_DIR" "$DL"

# 1. Download the pinned sdist (pip, from PyPI) unless it is already there.
SDIST="$DL/llama_cpp_python-$V.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  for cand in "/tmp/dl/llcpp/llama_cpp_python-$V.tar.gz"; do
    [[ -f "$cand" ]] && cp "$cand" "$SDIST" && log "reused $cand"
  done
fi
if [[ ! -f "$SDIST" ]]; then
  log "downloading llama-cpp-python==$V sdist"
  nice -n "$NICE" "$PY" -m pip download --no-binary :all: --no-deps -d "$DL" "llama-cpp-python==$V"
fi
[[ -f "$SDIST" ]] || { log "sdist not found at $SDIST"; exit 1; }

# 2. Extract (the tarball's top folder is llama_cpp_python-$V; we name it llama-cpp-python-$V).
if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
  log "extracting to $SRC"
  tmp="$(mktemp -d "$PEER_DIR/.extract.XXXXXX")"
  tar -xzf "$SDIST" -C "$tmp"
  rm -rf "$SRC"
  mv "$tmp/llama_cpp_python-$V" "$SRC"
  rmdir "$tmp"
fi

# 3. Configure + build the vendored llama.cpp: Release, CPU only, -march=native, shared libs.
need_build=0
[[ "${FORCE:-0}" == 1 ]] && need_build=1
for f in llama-bench llama-cli llama-server libllama.so libmtmd.so; do
  [[ -e "$BIN/$f" ]] || need_build=1
done
if [[ $need_build == 1 ]]; then
  if [[ ! -f "$BUILD/build.ninja" || "${FORCE:-0}" == 1 ]]; then
    log "configuring $BUILD"
    # No network at build time: no web-UI download, no curl/OpenSSL (the server serves plain HTTP).
    nice -n "$NICE" cmake -S "$LLAMA" -B "$BUILD" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=ON \
      -DGGML_NATIVE=ON \
      -DGGML_OPENMP=ON \
      -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
  fi
  log "building ${TARGETS[*]} (-j$JOBS, nice $NICE)"
  nice -n "$NICE" ninja -C "$BUILD" -j "$JOBS" "${TARGETS[@]}"
else
  log "llama.cpp already built in $BIN (FORCE=1 to rebuild)"
fi

# 4. Python bindings, pinned, without compiling llama.cpp a second time.
have_py="$("$PY" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
if [[ "$have_py" != "$V" || "${FORCE:-0}" == 1 ]]; then
  log "installing llama-cpp-python==$V (LLAMA_BUILD=OFF: python code only)"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" nice -n "$NICE" \
    "$PY" -m pip install --no-cache-dir --no-deps --force-reinstall "$SDIST"
  # its runtime dependencies, normal wheels
  "$PY" -m pip install "typing-extensions>=4.5.0" "numpy>=1.20.0" "diskcache>=5.6.1" "jinja2>=2.11.3"
else
  log "llama-cpp-python $V already installed"
fi

# 5. Smoke check: the bindings load the peer's libllama.so and report its system info.
LLAMA_CPP_LIB_PATH="$BIN" MTMD_CPP_LIB="$BIN/libmtmd.so" "$PY" - <<'EOF'
import llama_cpp
print("[build-llamacpp] llama_cpp", llama_cpp.__version__, "lib:", llama_cpp.llama_cpp._lib._name)
print("[build-llamacpp] system_info:", llama_cpp.llama_print_system_info().decode().strip())
EOF
"$BIN/llama-bench" --help >/dev/null 2>&1 || { log "llama-bench does not run"; exit 1; }

cat <<EOF
PEER_BIN=$BIN
export LLAMA_CPP_LIB_PATH=$BIN
export MTMD_CPP_LIB=$BIN/libmtmd.so
EOF
