# Shared set-up for scripts/run and scripts/test: packages, configure, build, model.
# Idempotent: each step is skipped when its result is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TROUPE_BUILD_DIR:-$ROOT/build}"
export TROUPE_HOME="${TROUPE_HOME:-$HOME/.cache/troupe}"
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

PACKAGES=(build-essential cmake ninja-build ccache pkg-config python3 python3-pip python3-venv unzip
  libcaf-dev libssl-dev capnproto libcapnp-dev libboost1.74-dev libspdlog-dev catch2 nlohmann-json3-dev
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
  # CI (.ci/run) turns warnings into errors; kept in the cache, so set it on every build.
  if [ -n "${TROUPE_WERROR:-}" ]; then
    cmake -S "$ROOT" -B "$BUILD_DIR" -DTROUPE_WERROR="$([ "$TROUPE_WERROR" = 1 ] && echo ON || echo OFF)" >/dev/null
  fi
  log "building"
  cmake --build "$BUILD_DIR" "$@"
}

fetch_model() { "$ROOT/scripts/fetch-model"; }

# Python venv for the serving bench and the OpenAI-client test (bench/serve, tests/serve):
# $TROUPE_HOME/venv with pinned openai + aiohttp (+ jsonschema, the structured-output test's
# independent validator); exports TROUPE_PY. Needs python3-venv.
python_env() {
  local venv="$TROUPE_HOME/venv"
  local reqs=(openai==1.109.1 aiohttp==3.12.15 jsonschema==4.25.1)
  if [ ! -x "$venv/bin/python" ]; then
    log "creating python venv in $venv"
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" - "${reqs[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
for r in sys.argv[1:]:
    name, want = r.split("==")
    if version(name) != want:
        sys.exit(1)
PY
    log "installing ${reqs[*]} into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${reqs[@]}"
  fi
  export TROUPE_PY="$venv/bin/python"
}
