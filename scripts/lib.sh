# Shared set-up for scripts/run and scripts/test: packages, configure, build, model.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TROUPE_BUILD_DIR:-$ROOT/build}"
export TROUPE_HOME="${TROUPE_HOME:-$HOME/.cache/troupe}"

PACKAGES=(build-essential cmake ninja-build ccache pkg-config python3 python3-pip unzip
  libcaf-dev capnproto libcapnp-dev libboost1.74-dev libspdlog-dev catch2 nlohmann-json3-dev
  libcli11-dev libpcre2-dev libhwy-dev libxxhash-dev libopenblas-dev
  clang libclang-rt-14-dev)

log() { printf '\033[1m[troupe]\033[0m %s\n' "$*" >&2; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

build() {
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    log "configuring in $BUILD_DIR"
    cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  log "building"
  cmake --build "$BUILD_DIR" "$@"
}

fetch_model() { "$ROOT/scripts/fetch-model"; }
