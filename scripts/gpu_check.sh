#!/usr/bin/env bash
# The GPU checks, on a machine lent by the `device` tool (made ready by scripts/gpu_kit.sh):
#   1. installs the kit (.whl/) into a folder of its own, beside the image's packages;
#   2. runs the shared-memory tests, the CUDA ones included (they skip without a GPU);
#   3. times FP32 identities through CUDA shared memory, system shared memory, HTTP and gRPC
#      (bench/e2e/transfer.py against tritonfast serving tests/models).
# Logs go to $OUT (which `run` brings back). Exits non-zero if a test failed.
#   usage: bash scripts/gpu_check.sh       env: OUT (/tmp/gpu_check), KIT (.whl), SITE (/tmp/site)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
KIT=${KIT:-.whl}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$KIT"/*.whl || exit 1
export PYTHONPATH=$SITE PYTHONUNBUFFERED=1

{
    nvidia-smi -L || echo "nvidia-smi: none"
    python3 --version
    python3 -c 'from tritonfast.runtime import cudamemory
print("a GPU the server can use:", cudamemory._runtime() is not None)'
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
exit "$tests"
