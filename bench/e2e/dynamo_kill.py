"""What ``kill -9`` of a Dynamo worker costs: two ``serve --dynamo`` workers behind Dynamo's
KServe gRPC frontend (file discovery, loopback), four clients sending small requests to
``identity_fp32`` one after another; one worker is killed with SIGKILL; the clients go on for
SECONDS more. Prints, per round, the requests answered, the requests that failed and for how
long failures went on after the kill.

    python bench/e2e/dynamo_kill.py [ROUNDS] [SECONDS]        (3 rounds, 10 s)

Needs ``pip install '.[dynamo]'`` and Dynamo's frontend (docs/scale-out.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, os.path.dirname(__file__))
from dynamo_latency import ROOT, _ports, _wait_ready, dynamo_environment

CLIENTS = 4


def _worker(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    http, grpc, metrics = _ports(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tritonfast", "serve", "--model-repository",
         str(ROOT / "tests" / "models"), "--model-control-mode=explicit",
         "--load-model=identity_fp32", f"--http-port={http}", f"--grpc-port={grpc}",
         f"--metrics-port={metrics}", "--dynamo"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    return proc, f"127.0.0.1:{grpc}"


def one_round(seconds: float) -> str:
    env = dynamo_environment()
    front, front_metrics = _ports(2)
    frontend = subprocess.Popen(
        [sys.executable, "-m", "dynamo.frontend", "--kserve-grpc-server",
         f"--http-port={front}", f"--grpc-metrics-port={front_metrics}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers = [_worker(env) for _ in range(2)]
    url = f"127.0.0.1:{front}"
    try:
        for _, own in workers:
            _wait_ready(own, "identity_fp32")
        _wait_ready(url, "identity_fp32")
        time.sleep(3)  # (both workers in the frontend's routing: it sees them within ~2 s)
        answered = [0] * CLIENTS
        failed: list[float] = []
        stop = threading.Event()

        def client(index: int) -> None:
            own = grpcclient.InferenceServerClient(url)
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            while not stop.is_set():
                try:
                    own.infer("identity_fp32", [tensor], client_timeout=10)
                    answered[index] += 1
                except Exception:
                    failed.append(time.monotonic())
            own.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        time.sleep(2)
        killed_at = time.monotonic()
        os.killpg(workers[1][0].pid, signal.SIGKILL)
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(30)
        span = (max(failed) - killed_at) if failed else 0.0
        return (
            f"answered {sum(answered)}, failed {len(failed)},"
            f" failures until {span:.2f} s after the kill"
        )
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
        frontend.terminate()
        frontend.wait(30)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    for index in range(1, rounds + 1):
        print(f"round {index}: {one_round(seconds)}", flush=True)


if __name__ == "__main__":
    main()
