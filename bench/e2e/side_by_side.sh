#!/usr/bin/env bash
# Every row of the request-path comparison against a real Triton in one sitting: each part
# runs bench/e2e/peer_ab.sh (Triton and tritonfast alternating, fresh servers, ROUNDS rounds),
# one part after another, and the ONNX Runtime rows last (tritonfast against session.run).
# The tables land under OUT, one directory per part; bench/README.md gathers them.
#
#   usage: TRITON_LAUNCH=<launcher> bench/e2e/side_by_side.sh [ROUNDS]     (2 rounds)
#
#   TRITON_LAUNCH  required: as for peer_ab.sh
#   LOAD_MATRIX    the load-matrix script for the small, 4 MiB, BLS and ensemble rows (run as
#                  PEER_BENCH by peer_ab.sh; bench/e2e/load_matrix.sh, the core's own load
#                  generator, by default)
#   OUT            where the parts go (a new temporary directory)
#   DUR            seconds per load-matrix row (6)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ -n "${TRITON_LAUNCH:-}" ] || { sed -n '2,13p' "$0" >&2; exit 2; }
LOAD_MATRIX=${LOAD_MATRIX:-$ROOT/bench/e2e/load_matrix.sh}
ROUNDS=${1:-2}
OUT=${OUT:-$(mktemp -d)}
export TRITON_LAUNCH DUR=${DUR:-6}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
mkdir -p "$OUT"

# The transfer rows' script in the shape peer_ab.sh runs (HTTP GRPC MODEL LABEL).
transfer="$OUT/transfer.sh"
cat > "$transfer" <<EOF
#!/usr/bin/env bash
exec "$PYTHON" "$ROOT/bench/e2e/transfer.py" "\$1" "\$2" "\$3" 15
EOF
chmod +x "$transfer"

part() {  # name repo model rows script
  local name=$1 repo=$2 model=$3 rows=$4 script=$5
  echo "== $name"
  OUT="$OUT/$name" MODEL=$model ROWS=$rows PEER_BENCH=$script \
    "$ROOT/bench/e2e/peer_ab.sh" "$ROUNDS" "$repo"
}

part small "$ROOT/bench/models" identity \
  "bin-c1 bin-c16 json-c16 grpc-c1 grpc-c16 gen-c1 gen-c16" "$LOAD_MATRIX"
part large "$ROOT/bench/models" identity "binL-c4 grpcL-c4" "$LOAD_MATRIX"
part bls "$ROOT/bench/models_compose" bls_identity "bin-c1 bin-c16" "$LOAD_MATRIX"
part ensemble "$ROOT/bench/models_compose" ens_identity "bin-c16 grpc-c16" "$LOAD_MATRIX"
part stateful "$ROOT/bench/models_stateful" sequence_sum "seq stream streamcore streampaced sse ssecore first firstcore" \
  "$ROOT/bench/e2e/stateful_bench.sh"
part shm "$ROOT/bench/models" identity "" "$transfer"
echo "== onnx"
"$PYTHON" "$ROOT/bench/e2e/onnx_mlp.py" "$DUR" "$ROUNDS" > "$OUT/onnx.txt" 2>&1
echo "onnx: $OUT/onnx.txt"
