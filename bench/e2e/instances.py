"""Throughput of N model instances, in-process threads vs worker processes.

A pure-Python, CPU-bound model (holds the GIL for its whole execution) is served with
instance_group count 1 and 2, in the default in-process mode and with
TRITONFAST_INSTANCE_MODE "process"; 8 concurrent gRPC clients send requests for DUR seconds.
In-process instances share one GIL, so a second one adds nothing for such a model; worker
processes run in parallel, so two give up to 2x on a machine with two free cores.

    python bench/e2e/instances.py [DUR_SECONDS]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[2]
MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            total = 0
            for i in range(60_000):  # ~5 ms of pure Python: the GIL is held throughout
                total += i * i
            value = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", value + total % 7)]))
        return out
"""
CONFIG = """
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{parameters}
"""
PROCESS = 'parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "process" } }'
CLIENTS = 8


def make_repository(root: Path) -> None:
    for mode in ("thread", "process"):
        for count in (1, 2):
            model = root / f"burn_{mode}_{count}"
            (model / "1").mkdir(parents=True)
            (model / "1" / "model.py").write_text(MODEL_PY)
            parameters = PROCESS if mode == "process" else ""
            (model / "config.pbtxt").write_text(CONFIG.format(count=count, parameters=parameters))


def drive(url: str, model: str, seconds: float) -> float:
    """Requests per second from CLIENTS closed-loop clients."""
    stop = time.monotonic() + seconds
    counts = [0] * CLIENTS

    def client(index: int) -> None:
        connection = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("X", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, np.float32))
        while time.monotonic() < stop:
            connection.infer(model, [tensor])
            counts[index] += 1
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.monotonic() - started)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        make_repository(repo)
        http, grpc = 28100, 28101
        server = subprocess.Popen(
            [sys.executable, "-m", "tritonfast", "serve", "--model-repository", str(repo),
             f"--http-port={http}", f"--grpc-port={grpc}", "--metrics-port=28102"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
        )  # fmt: skip
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            rates = {}
            for mode in ("thread", "process"):
                for count in (1, 2):
                    model = f"burn_{mode}_{count}"
                    drive(f"127.0.0.1:{grpc}", model, 1.0)  # warm-up
                    rates[(mode, count)] = drive(f"127.0.0.1:{grpc}", model, seconds)
            print(f"{'mode':8} {'instances':>9} {'req/s':>8} {'vs 1':>6}")
            for (mode, count), rate in rates.items():
                print(f"{mode:8} {count:9d} {rate:8.1f} {rate / rates[(mode, 1)]:6.2f}")
        finally:
            server.terminate()
            server.wait(60)


if __name__ == "__main__":
    main()
