"""Reloading a model under load: how many requests fail (should be none) and how long they wait.

Starts tritonfast with ``--model-control-mode=explicit`` on a temporary repository holding one
Python model, keeps 8 gRPC clients sending requests, and reloads the model (new code each
time) every 0.5 s for DUR seconds. Prints the requests sent, failures, and latency
percentiles overall.

    python bench/e2e/reload.py [DUR_SECONDS]
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
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
MODEL = """
import triton_python_backend_utils as pb_utils
GENERATION = {generation}
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + GENERATION)])
            for r in requests]
"""


def main() -> None:
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    root = Path(tempfile.mkdtemp(prefix="tritonfast-reload-"))
    model_dir = root / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG)
    (model_dir / "1" / "model.py").write_text(MODEL.format(generation=0))
    ports = ("28100", "28101", "28102")
    server = subprocess.Popen(
        [sys.executable, "-m", "tritonfast", "serve", "--model-repository", str(root),
         "--model-control-mode=explicit", "--load-model=m", f"--http-port={ports[0]}",
         f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=os.environ.copy(),
    )  # fmt: skip
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        stop = threading.Event()
        latencies: list[float] = []
        failures: list[str] = []

        def client_loop() -> None:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
            tensor = grpcclient.InferInput("X", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    client.infer("m", [tensor])
                    latencies.append(time.perf_counter() - start)
                except InferenceServerException as error:
                    failures.append(str(error))
            client.close()

        threads = [threading.Thread(target=client_loop) for _ in range(8)]
        for thread in threads:
            thread.start()
        admin = httpclient.InferenceServerClient(f"127.0.0.1:{ports[0]}")
        reloads = 0
        end = time.monotonic() + duration
        while time.monotonic() < end:
            time.sleep(0.5)
            reloads += 1
            (model_dir / "1" / "model.py").write_text(MODEL.format(generation=reloads))
            admin.load_model("m")
        stop.set()
        for thread in threads:
            thread.join()
        admin.close()
        ordered = sorted(latencies)

        def pct(p: float) -> float:
            return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e3

        print(
            f"{reloads} reloads in {duration:.0f} s: {len(latencies)} requests answered,"
            f" {len(failures)} failed; latency p50 {pct(0.5):.2f} ms, p99 {pct(0.99):.2f} ms,"
            f" max {ordered[-1] * 1e3:.1f} ms"
        )
        for failure in failures[:5]:
            print("  failure:", failure)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
