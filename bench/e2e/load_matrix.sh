#!/usr/bin/env bash
# bench/e2e/load_matrix.py in the shape bench/e2e/peer_ab.sh runs as PEER_BENCH:
#   load_matrix.sh HTTP_HOSTPORT GRPC_HOSTPORT MODEL LABEL
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
exec "${PYTHON:-$ROOT/.venv/bin/python}" "$ROOT/bench/e2e/load_matrix.py" "$@"
