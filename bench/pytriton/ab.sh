#!/usr/bin/env bash
# A PyTriton program under PyTriton and under tritonfast (imports rewritten), alternating,
# each measured by the load-matrix script. Prints where each table went. See bench/README.md.
#
#   usage: bench/pytriton/ab.sh [ROUNDS] [PROGRAM]       (2 rounds, bench/pytriton/identity.py)
#
#   PEER_BENCH        required: the load-matrix script, run as
#                     SERVER_PGID=<server's process group> $PEER_BENCH HTTP GRPC MODEL LABEL
#   PYTRITON_PYTHON   required: a Python with nvidia-pytriton installed
#   PYTHON            the Python whose environment holds tritonfast (.venv/bin/python)
#   MODEL             the model the matrix measures (identity)
#   OUT               where tables and server logs go (a new temporary directory)
#   Other variables (ROWS, DUR, ...) reach PEER_BENCH unchanged.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ -n "${PEER_BENCH:-}" ] || { echo "ab.sh: PEER_BENCH is not set" >&2; exit 2; }
[ -n "${PYTRITON_PYTHON:-}" ] || { echo "ab.sh: PYTRITON_PYTHON is not set" >&2; exit 2; }
ROUNDS=${1:-2}
PROGRAM=${2:-$ROOT/bench/pytriton/identity.py}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
MODEL=${MODEL:-identity}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
REWRITTEN=$OUT/$(basename "$PROGRAM" .py)_tritonfast.py
sed -E 's/(from|import) pytriton\./\1 tritonfast.pytriton./' "$PROGRAM" > "$REWRITTEN"

wait_ready() {
  for _ in $(seq 1 240); do
    curl -sf "localhost:18000/v2/models/$MODEL/ready" >/dev/null && return 0
    sleep 0.5
  done
  echo "the server never became ready" >&2
  return 1
}

run_one() {  # label python program
  local label=$1; shift
  rm -f "$OUT/$label.pid"
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$OUT/$label.pid" "$@" > "$OUT/$label.log" 2>&1 &
  for _ in $(seq 1 50); do [ -s "$OUT/$label.pid" ] && break; sleep 0.1; done
  local pid
  pid=$(cat "$OUT/$label.pid")
  wait_ready && SERVER_PGID=$pid "$PEER_BENCH" 127.0.0.1:18000 127.0.0.1:18001 "$MODEL" \
    "$label" > "$OUT/$label.txt" 2>&1
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in $(seq 1 120); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.25; done
  kill -KILL -- "-$pid" 2>/dev/null
  echo "$label: $OUT/$label.txt"
}

for round in $(seq 1 "$ROUNDS"); do
  run_one "pytriton-r$round" "$PYTRITON_PYTHON" "$PROGRAM"
  run_one "tritonfast-r$round" "$PYTHON" "$REWRITTEN"
done
