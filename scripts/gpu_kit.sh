#!/usr/bin/env bash
# Packs what the GPU checks need into .whl/ (git-ignored), for a GPU machine that reaches no
# package index and whose Python (3.12) already holds numpy, aiohttp, uvloop,
# prometheus-client, pytest, pytest-timeout, hypothesis, ml-dtypes and cuda-python
# (cuda-bindings), so only the rest travels:
#   - tritonfast itself, built here (the extension is abi3, so one wheel serves 3.12);
#   - tritonclient and what its HTTP and gRPC clients import;
#   - grpcio and protobuf at the versions the tests run with (the machine's may be older).
# Then, on the GPU machine, with .whl/ copied into the checkout: OUT=<logs> bash scripts/gpu_check.sh
#   usage: scripts/gpu_kit.sh            env: PYTHON (python3, for pip), KIT (.whl)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
KIT=${KIT:-.whl}
rm -rf "$KIT"
mkdir -p "$KIT"

maturin build --release --quiet --out "$KIT"

# Pinned to the versions CI installs, so the GPU machine runs what CI tests.
WHEELS=(
    tritonclient==2.73.0 python-rapidjson==1.25 geventhttpclient==2.6.1 gevent==26.9.0
    greenlet==3.3.2 zope.event==6.2 zope.interface==8.7 brotli==1.2.1 orjson==3.13.0
    grpcio==1.85.3 protobuf==6.33.6
)
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$KIT" "${WHEELS[@]}"

du -sh "$KIT"
ls "$KIT"
