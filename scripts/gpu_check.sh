#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU that reaches no package index, made ready by
# scripts/gpu_kit.sh (its .whl/ copied into this checkout):
#   1. installs the kit into a folder of its own ($SITE), beside the machine's packages;
#   2. runs the shared-memory tests, the CUDA ones included (they skip without a GPU);
#   3. times FP32 identities through CUDA shared memory, system shared memory, HTTP and gRPC
#      (bench/e2e/transfer.py against tritonfast serving tests/models);
#   4. runs `python -m tritonfast selfcheck tensorrt` where TensorRT is installed.
# Logs go to $OUT. Exits non-zero if a test failed.
#   usage: OUT=<log folder> bash scripts/gpu_check.sh
#   env:   OUT (required), KIT (.whl), SITE ($KIT/site)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${OUT:-}" ]; then
    echo "gpu_check.sh: OUT is not set" >&2
    sed -n '10,11p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
KIT=${KIT:-.whl}
SITE=${SITE:-$KIT/site}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$KIT"/*.whl || exit 1
PYTHONPATH=$(cd "$SITE" && pwd)
export PYTHONPATH PYTHONUNBUFFERED=1

{
    nvidia-smi -L || echo "nvidia-smi: none"
    python3 --version
    python3 -c 'from tritonfast.memory import cudamemory
print("a GPU the server can use:", cudamemory.cuda_runtime() is not None)'
} 2>&1 | tee "$OUT/machine.txt"

# The image's packages may warn where CI's do not: warnings are shown, not made errors.
python3 -m pytest -p no:cacheprovider -o filterwarnings=default -rs \
    tests/e2e/test_shared_memory.py 2>&1 | tee "$OUT/pytest.txt"
tests=${PIPESTATUS[0]}

python3 -m tritonfast serve --model-repository tests/models --http-port 28000 \
    --grpc-port 28001 --metrics-port 28002 > "$OUT/server.log" 2>&1 &
server=$!
python3 - <<'WAIT'
import time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen("http://127.0.0.1:28000/v2/health/ready", timeout=1)
        break
    except OSError:
        time.sleep(0.5)
WAIT
kill -0 "$server" 2> /dev/null || { echo "the server did not start: see server.log"; exit 1; }
python3 bench/e2e/transfer.py 127.0.0.1:28000 127.0.0.1:28001 identity_fp32 20 2>&1 \
    | tee "$OUT/transfer.txt"
kill "$server"
wait "$server"

# The TensorRT backend's self-check, where TensorRT is installed (docs/tensorrt.md).
if python3 -c 'import tensorrt' 2> /dev/null; then
    python3 -m tritonfast selfcheck tensorrt 2>&1 | tee "$OUT/selfcheck_tensorrt.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || tests=1
else
    echo "no tensorrt here: the TensorRT self-check did not run" | tee "$OUT/selfcheck_tensorrt.txt"
fi
exit "$tests"
