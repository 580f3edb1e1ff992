#!/usr/bin/env bash
# Starts `troupe serve` (default model) on a free port, waits for /health, runs the given
# Python test against it with --base-url, stops the server; fails if the server crashed.
# Usage: run_with_server.sh TROUPE_BIN TEST.py [server flags...]
set -euo pipefail
troupe="$1"; test_py="$2"; shift 2
py="${TROUPE_PY:-}"
if [ -z "$py" ] || [ ! -x "$py" ]; then
  echo "FAIL: TROUPE_PY is not set to the venv python with the openai client (scripts/test sets it up via python_env)" >&2
  exit 1
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
"$troupe" serve --port "$port" -t 2 "$@" >"$log" 2>&1 &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then echo "FAIL: server exited during start-up:"; cat "$log"; exit 1; fi
  sleep 0.1
done
rc=0
"$py" "$test_py" --base-url "http://127.0.0.1:$port" || rc=$?
if ! kill -0 "$pid" 2>/dev/null; then echo "FAIL: the server died during the test:"; cat "$log"; exit 1; fi
kill -TERM "$pid"
if ! wait "$pid"; then echo "FAIL: the server did not exit 0 on SIGTERM:"; tail -20 "$log"; exit 1; fi
trap - EXIT
rm -f "$log"
exit $rc
