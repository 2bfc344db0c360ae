#!/usr/bin/env bash
# Side-by-side load matrix: real Triton and tritonfast on the same machine, alternating
# (A B A B …), with ../shared/tools/peer_bench.sh. Prints where each table went.
#   usage: bench/e2e/peer_ab.sh [ROUNDS] [MODEL_REPO]
# Needs: wrk and h2load (apt-get install -y wrk nghttp2-client); tritonfast installed in
# $PYTHON's environment; ../shared/tools/triton_anchor.sh (builds /tmp/anchor on first use).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOOLS=${TOOLS:-$ROOT/../shared/tools}
ROUNDS=${1:-2}
REPO=${2:-$TOOLS/models}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
OUT=${OUT:-/tmp/peer_ab}
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
  wait_ready "$http" && SERVER_PGID=$pid "$TOOLS/peer_bench.sh" "127.0.0.1:$http" \
    "127.0.0.1:$grpc" identity "$label" > "$OUT/$label.txt" 2>&1
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in $(seq 1 120); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.25; done
  echo "$label: $OUT/$label.txt"
}

for round in $(seq 1 "$ROUNDS"); do
  run_one "triton-r$round" 18000 18001 18002 "$TOOLS/triton_anchor.sh" "$REPO" 18000 18001 18002
  run_one "tritonfast-r$round" 28000 28001 28002 "$PYTHON" -m tritonfast serve \
    --model-repository "$REPO" --http-port 28000 --grpc-port 28001 --metrics-port 28002
done
