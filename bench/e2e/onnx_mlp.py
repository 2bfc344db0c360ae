"""The onnxruntime backend against the identity model on the same server, and against
onnxruntime called directly.

A generated FP32 MLP 256 -> 1024 -> 256 (dynamic batch, max_batch_size 64, dynamic batching
100 µs, one instance with one intra-op thread: on two cores shared with the frontends and the
load generator, ORT's own thread pool only competes with them) is served next to
bench/models/identity by one tritonfast server; the core's load generator
(bench/e2e/closedloop.py) sends HTTP binary-extension requests (one connection per concurrent
client). Every body is checked once with tritonclient first
(the MLP's answer against onnxruntime's own). Rows, identity and MLP alternating, ROUNDS
times:

* c=16, one row per request: req/s of the MLP / req/s of the identity model;
* c=16, 16 rows per request: rows/s of the MLP / rows/s of ``session.run`` on batches of 16
  back to back, measured in this process while the server is idle, with ORT's default
  threads (every core) and with one intra-op thread (as the served session);
* c=1, one row: p50 latency of the MLP minus the identity model's.

    python bench/e2e/onnx_mlp.py [DUR_SECONDS] [ROUNDS]      (6 s, 2 rounds)

``TRITONFAST_ARGS`` adds arguments to the server's command line (split on blanks), e.g.
``--backend-config=onnxruntime,core-path=off``.

Needs onnx and onnxruntime. Prints a table; judges nothing.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient
from closedloop import closed_loop
from ports import free_port
from tritonfast.onnxgen import mlp, write_onnx
from tritonfast.perf import payloads
from tritonfast.perf.inputs import Tensor

ROOT = Path(__file__).resolve().parents[2]

MLP_CONFIG = """
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 256 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def load(
    http: int,
    model: str,
    input_name: str,
    output_name: str,
    array: np.ndarray,
    connections: int,
    seconds: float,
) -> dict[str, float]:
    """Closed-loop binary-extension requests for ``array`` from the core's load generator."""
    address = f"127.0.0.1:{http}"
    tensor = Tensor(input_name, "FP32", list(array.shape), array)
    request = payloads.http_request(address, model, "", [tensor], [output_name])
    measured = closed_loop("http", address, request, connections, seconds)
    return {"req_s": measured.req_s, "p50_us": measured.p50_us, "p99_us": measured.p99_us}


def direct_rows_per_second(model_file: Path, seconds: float, threads: int = 0) -> float:
    """``session.run`` on batches of 16 back to back; ``threads``: intra-op threads (0: ORT's
    default, every core)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_file), options)
    batch = np.random.default_rng(1).standard_normal((16, 256), np.float32)
    runs = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        session.run(None, {"INPUT": batch})
        runs += 1
    return runs * 16 / seconds


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    work = Path(tempfile.mkdtemp(prefix="onnx_mlp_"))
    repo = work / "repo"
    model_file = write_onnx(repo, "mlp", mlp(256, 1024, 256), MLP_CONFIG)
    shutil.copytree(ROOT / "bench" / "models" / "identity", repo / "identity")
    http, grpc, metrics = free_port(), free_port(), free_port()
    log = (work / "server.log").open("w")
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "tritonfast", "serve", f"--model-repository={repo}"),
            *(f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"),
            *os.environ.get("TRITONFAST_ARGS", "").split(),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        run_rows(model_file, http, seconds, rounds)
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def run_rows(model_file: Path, http: int, seconds: float, rounds: int) -> None:
    rng = np.random.default_rng(0)
    one = rng.standard_normal((1, 256), np.float32)
    sixteen = rng.standard_normal((16, 256), np.float32)
    direct = ort.InferenceSession(str(model_file))
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    for array in (one, sixteen):  # every body's answer checked once
        tensor = httpclient.InferInput("INPUT", list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        got = client.infer("mlp", [tensor]).as_numpy("OUTPUT")
        np.testing.assert_allclose(got, direct.run(None, {"INPUT": array})[0], rtol=1e-4)
    tensor = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    tensor.set_data_from_numpy(one)
    np.testing.assert_array_equal(client.infer("identity", [tensor]).as_numpy("OUTPUT0"), one)
    client.close()
    inputs = {"identity": ("INPUT0", "OUTPUT0"), "mlp": ("INPUT", "OUTPUT")}
    results: dict[str, list[dict[str, float]]] = {}
    direct_rates = []
    one_thread_rates = []
    for _ in range(rounds):
        for label, model, connections in (
            ("identity c16", "identity", 16),
            ("mlp c16", "mlp", 16),
            ("mlp16 c16", "mlp", 16),
            ("identity c1", "identity", 1),
            ("mlp c1", "mlp", 1),
        ):
            array = sixteen if label.startswith("mlp16") else one
            row = load(http, model, *inputs[model], array, connections, seconds)
            results.setdefault(label, []).append(row)
        direct_rates.append(direct_rows_per_second(model_file, seconds))
        one_thread_rates.append(direct_rows_per_second(model_file, seconds, threads=1))

    def median(label: str, field: str) -> float:
        return statistics.median(r[field] for r in results[label])

    print(f"{'row':<16} {'req/s':>9} {'p50 us':>8} {'p99 us':>8}   (medians of {rounds} rounds)")
    for label in results:
        print(
            f"{label:<16} {median(label, 'req_s'):>9.0f} {median(label, 'p50_us'):>8.0f}"
            f" {median(label, 'p99_us'):>8.0f}"
        )
    direct_rate = statistics.median(direct_rates)
    one_thread_rate = statistics.median(one_thread_rates)
    print(f"direct session.run, batches of 16: {direct_rate:.0f} rows/s")
    print(f"direct session.run, batches of 16, one intra-op thread: {one_thread_rate:.0f} rows/s")
    print()
    print(
        "c16 one row: mlp / identity req/s ="
        f" {median('mlp c16', 'req_s') / median('identity c16', 'req_s'):.2f}  (target >= 0.8)"
    )
    print(
        "c16 16 rows: server rows/s / direct rows/s ="
        f" {16 * median('mlp16 c16', 'req_s') / direct_rate:.2f}  (target >= 0.5);"
        " against one intra-op thread (the server's session options):"
        f" {16 * median('mlp16 c16', 'req_s') / one_thread_rate:.2f}"
    )
    print(
        "c1 p50: mlp - identity ="
        f" {median('mlp c1', 'p50_us') - median('identity c1', 'p50_us'):.0f} us"
        "  (target <= 100)"
    )


if __name__ == "__main__":
    main()
