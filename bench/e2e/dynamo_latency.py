"""Small requests through NVIDIA Dynamo's KServe gRPC frontend, and through a tritonfast
route (``serve --dynamo-route``), against tritonfast directly.

Starts one tritonfast server with ``--dynamo`` (file discovery in a temporary directory,
every plane on loopback), Dynamo's frontend (``python -m dynamo.frontend
--kserve-grpc-server``) and a route, then, alternating, sends REQUESTS lone requests (c=1) of
an ELEMENTS-element FP32 tensor to ``identity_fp32`` with ``tritonclient.grpc``: to the
server's own gRPC port, through the frontend, and through the route. Prints the p50 and p90
latency of each and the differences, per round.

    python bench/e2e/dynamo_latency.py [ROUNDS] [REQUESTS] [ELEMENTS]   (3 rounds of 2000, 16)

Needs ``pip install '.[dynamo]'`` and Dynamo's frontend (docs/scale-out.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[2]


def _ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [int(sock.getsockname()[1]) for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def _wait_ready(url: str, model: str, seconds: float = 60) -> None:
    client = grpcclient.InferenceServerClient(url)
    deadline = time.monotonic() + seconds
    while True:
        try:
            if client.is_model_ready(model):
                return
        except InferenceServerException:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{model} not ready at {url}")
        time.sleep(0.1)


def _latencies_ms(url: str, count: int, elements: int = 16) -> list[float]:
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("INPUT0", [1, elements], "FP32")
    tensor.set_data_from_numpy(np.arange(elements, dtype=np.float32).reshape(1, elements))
    for _ in range(10):  # warm-up
        client.infer("identity_fp32", [tensor])
    times = []
    for _ in range(count):
        started = time.perf_counter()
        client.infer("identity_fp32", [tensor])
        times.append((time.perf_counter() - started) * 1e3)
    client.close()
    return sorted(times)


def dynamo_environment() -> dict[str, str]:
    """This process's environment with Dynamo's for one host: file discovery in a new
    temporary directory, TCP request plane, ZMQ event plane, everything on loopback."""
    return dict(
        os.environ,
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=tempfile.mkdtemp(prefix="dynamo-kv-"),
        DYN_REQUEST_PLANE="tcp",
        DYN_EVENT_PLANE="zmq",
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_EVENT_PLANE_HOST="127.0.0.1",
        DYN_SYSTEM_HOST="127.0.0.1",
    )


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    elements = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    env = dynamo_environment()
    http, grpc, metrics, front, front_metrics, *routed = _ports(8)
    server = subprocess.Popen(
        [sys.executable, "-m", "tritonfast", "serve", "--model-repository",
         str(ROOT / "tests" / "models"), "--model-control-mode=explicit",
         "--load-model=identity_fp32", f"--http-port={http}", f"--grpc-port={grpc}",
         f"--metrics-port={metrics}", "--dynamo"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    frontend = subprocess.Popen(
        [sys.executable, "-m", "dynamo.frontend", "--kserve-grpc-server",
         f"--http-port={front}", f"--grpc-metrics-port={front_metrics}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    route = subprocess.Popen(
        [sys.executable, "-m", "tritonfast", "serve", "--dynamo-route",
         f"--http-port={routed[0]}", f"--grpc-port={routed[1]}", f"--metrics-port={routed[2]}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        urls = {
            "direct": f"127.0.0.1:{grpc}",
            "Dynamo's frontend": f"127.0.0.1:{front}",
            "tritonfast route": f"127.0.0.1:{routed[1]}",
        }
        for url in urls.values():
            _wait_ready(url, "identity_fp32")
        for index in range(1, rounds + 1):
            p50 = {}
            text = []
            for label, url in urls.items():
                latencies = _latencies_ms(url, count, elements)
                p50[label] = latencies[len(latencies) // 2]
                p90 = latencies[len(latencies) * 9 // 10]
                text.append(f"{label} p50 {p50[label]:.3f} ms p90 {p90:.3f}")
            plus = [f"{label} +{p50[label] - p50['direct']:.3f} ms" for label in list(urls)[1:]]
            print(f"round {index}: " + "; ".join(text) + "; p50 " + ", ".join(plus), flush=True)
    finally:
        for proc in (route, frontend, server):
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
