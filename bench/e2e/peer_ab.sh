#!/usr/bin/env bash
# Side-by-side load matrix: a real Triton and tritonfast on the same machine, alternating
# (Triton, tritonfast, Triton, tritonfast, ...), each server fresh and measured by the
# load-matrix script. Prints where each table went. See bench/README.md.
#
#   usage: bench/e2e/peer_ab.sh [ROUNDS] [MODEL_REPO]      (2 rounds, bench/models)
#
#   PEER_BENCH     the load-matrix script, run as
#                  SERVER_PGID=<server's process group> $PEER_BENCH HTTP GRPC MODEL LABEL
#                  (bench/e2e/load_matrix.sh, the core's own load generator, by default)
#   TRITON_LAUNCH  required: a command that runs Triton in the foreground when given
#                  REPO HTTP_PORT GRPC_PORT METRICS_PORT as its last four arguments
#   PYTHON         the Python whose environment holds tritonfast (.venv/bin/python)
#   MODEL          the model the matrix measures (identity)
#   OUT            where tables and server logs go (a new temporary directory)
#   TRITONFAST_ARGS more arguments for tritonfast serve (split on blanks)
#   Other variables (ROWS, DUR, ...) reach PEER_BENCH unchanged.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

usage() {
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
PEER_BENCH=${PEER_BENCH:-$ROOT/bench/e2e/load_matrix.sh}
[ -n "${TRITON_LAUNCH:-}" ] || { echo "peer_ab.sh: TRITON_LAUNCH is not set" >&2; usage; }
[ -x "$PEER_BENCH" ] || { echo "peer_ab.sh: PEER_BENCH=$PEER_BENCH is not executable" >&2; exit 2; }
read -r -a LAUNCH <<< "$TRITON_LAUNCH"
read -r -a EXTRA <<< "${TRITONFAST_ARGS:-}"

ROUNDS=${1:-2}
REPO=${2:-$ROOT/bench/models}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
MODEL=${MODEL:-identity}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

wait_ready() {
  for _ in $(seq 1 240); do
    curl -sf "localhost:$1/v2/health/ready" >/dev/null && return 0
    sleep 0.5
  done
  echo "server on :$1 never became ready" >&2
  return 1
}

run_one() {  # label http grpc metrics command...
  local label=$1 http=$2 grpc=$3; shift 4
  # The server's own pid, read after setsid (which forks when its caller leads a process
  # group, so $! would name a process that has already gone): it is the group to account.
  rm -f "$OUT/$label.pid"
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$OUT/$label.pid" "$@" > "$OUT/$label.log" 2>&1 &
  for _ in $(seq 1 50); do [ -s "$OUT/$label.pid" ] && break; sleep 0.1; done
  local pid
  pid=$(cat "$OUT/$label.pid")
  wait_ready "$http" && SERVER_PGID=$pid "$PEER_BENCH" "127.0.0.1:$http" \
    "127.0.0.1:$grpc" "$MODEL" "$label" > "$OUT/$label.txt" 2>&1
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in $(seq 1 120); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.25; done
  echo "$label: $OUT/$label.txt"
}

for round in $(seq 1 "$ROUNDS"); do
  run_one "triton-r$round" 18000 18001 18002 "${LAUNCH[@]}" "$REPO" 18000 18001 18002
  run_one "tritonfast-r$round" 28000 28001 28002 "$PYTHON" -m tritonfast serve \
    --model-repository "$REPO" --http-port 28000 --grpc-port 28001 --metrics-port 28002 \
    "${EXTRA[@]}"
done
