"""Soak and memory growth: mixed load with model reloads for a long run, the server's memory
sampled as it goes (like Triton's L0_long_running_stress and L0_memory_growth).

Starts tritonfast (``--model-control-mode=explicit``) on a temporary repository holding the
identity model of ``bench/models`` and a Python model that is reloaded with new code every
RELOAD_S seconds. For DUR seconds these run side by side:

- 2 HTTP clients (binary extension): 16 FP32 values, and every 50th request 1 MiB;
- 2 gRPC clients: 16 FP32 values;
- 1 client through system shared memory (input and output in registered regions);
- 1 gRPC client of the reloaded model;
- the reloader.

Every SAMPLE_S seconds it records the resident memory of the server and all its processes
(workers, fork server), and the requests answered and failed so far. It prints a table and a
text plot, writes ``soak.csv`` to OUT, and ends with the growth after warm-up: the resident
memory at the end against the first sample after WARM_S seconds.

    python bench/e2e/soak.py [DUR_SECONDS] [OUT_DIR]      (600 s, a new temporary directory)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_S = 10.0
WARM_S = 60.0
RELOAD_S = 5.0
PORTS = (28300, 28301, 28302)

RELOADED_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
"""
RELOADED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils
GENERATION = {generation}
BALLAST = np.ones(1 << 18)  # 2 MiB per load: memory a leaked instance would keep
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + GENERATION)])
            for r in requests]
"""


def tree_rss_kib(root: int) -> int:
    """Resident memory of process ``root`` and all its descendants (KiB)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, pending = 0, [root]
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


class Load:
    """The clients' threads and their counts."""

    def __init__(self, duration: float) -> None:
        self.end = time.monotonic() + duration
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def run(self, make: Callable[[], Callable[[], None]]) -> None:
        """Run the step ``make()`` returns, over and over, on a thread of its own (made there:
        tritonclient's HTTP clients belong to the thread that made them)."""

        def loop() -> None:
            step = make()
            while time.monotonic() < self.end:
                try:
                    step()
                    self.count("answered")
                except Exception as error:
                    self.count("failed")
                    self.count(f"failed: {str(error)[:80]}")

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        self.threads.append(thread)


def main() -> int:
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 600.0
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="soak-"))
    out.mkdir(parents=True, exist_ok=True)
    repo = Path(tempfile.mkdtemp(prefix="soak-repo-"))
    shutil.copytree(ROOT / "bench" / "models" / "identity", repo / "identity")
    (repo / "reloaded" / "1").mkdir(parents=True)
    (repo / "reloaded" / "config.pbtxt").write_text(RELOADED_CONFIG)
    (repo / "reloaded" / "1" / "model.py").write_text(RELOADED_MODEL.format(generation=0))
    http_port, grpc_port, metrics_port = PORTS
    log = open(out / "server.log", "w")  # noqa: SIM115 - open for the server's whole life
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tritonfast",
            "serve",
            f"--model-repository={repo}",
            "--model-control-mode=explicit",
            "--load-model=identity",
            "--load-model=reloaded",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    http_url, grpc_url = f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    admin = httpclient.InferenceServerClient(http_url)
    for _ in range(600):
        try:
            if admin.is_server_ready():
                break
        except Exception:
            pass
        time.sleep(0.1)
    load = Load(duration)
    small = np.ones((1, 16), np.float32)
    large = np.ones((1, 1 << 18), np.float32)

    def http_client() -> Callable[[], None]:
        client = httpclient.InferenceServerClient(http_url)
        sent = 0

        def once() -> None:
            nonlocal sent
            sent += 1
            data = large if sent % 50 == 0 else small
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            out = client.infer("identity", [tensor]).as_numpy("OUTPUT0")
            assert out.shape == data.shape

        return once

    def grpc_client(model: str, name: str, data: np.ndarray) -> Callable[[], None]:
        client = grpcclient.InferenceServerClient(grpc_url)

        def once() -> None:
            tensor = grpcclient.InferInput(
                name, list(data.shape), "FP32" if name == "INPUT0" else "INT32"
            )
            tensor.set_data_from_numpy(data)
            client.infer(model, [tensor])

        return once

    regions: dict[str, object] = {}

    def shm_client() -> Callable[[], None]:
        client = httpclient.InferenceServerClient(http_url)
        size = small.nbytes
        for role in ("in", "out"):
            key = f"soak-{os.getpid()}-{role}"
            regions[role] = shm.create_shared_memory_region(key, f"/{key}", size)
            client.register_system_shared_memory(key, f"/{key}", size)
        shm.set_shared_memory_region(regions["in"], [small])

        def once() -> None:
            tensor = httpclient.InferInput("INPUT0", list(small.shape), "FP32")
            tensor.set_shared_memory(f"soak-{os.getpid()}-in", size)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            output.set_shared_memory(f"soak-{os.getpid()}-out", size)
            client.infer("identity", [tensor], outputs=[output])

        return once

    generation = 0

    def reloader() -> Callable[[], None]:
        client = httpclient.InferenceServerClient(http_url)

        def once() -> None:
            nonlocal generation
            time.sleep(RELOAD_S)
            generation += 1
            (repo / "reloaded" / "1" / "model.py").write_text(
                RELOADED_MODEL.format(generation=generation)
            )
            client.load_model("reloaded")

        return once

    for _ in range(2):
        load.run(http_client)
        load.run(lambda: grpc_client("identity", "INPUT0", small))
    load.run(shm_client)
    load.run(lambda: grpc_client("reloaded", "X", np.array([[1]], np.int32)))
    load.run(reloader)

    started = time.monotonic()
    samples: list[tuple[float, float, int, int]] = []
    while time.monotonic() < load.end:
        time.sleep(min(SAMPLE_S, max(0.0, load.end - time.monotonic())))
        with load.lock:
            answered, failed = load.counts["answered"], load.counts["failed"]
        sample = (time.monotonic() - started, tree_rss_kib(server.pid) / 1024, answered, failed)
        samples.append(sample)
        t, rss, answered, failed = sample
        print(
            f"t={t:5.0f} s  rss {rss:7.1f} MiB  answered {answered:8d}  failed {failed}", flush=True
        )
    for thread in load.threads:
        thread.join(60)
    server.terminate()
    server.wait(60)
    for handle in regions.values():
        shm.destroy_shared_memory_region(handle)

    with open(out / "soak.csv", "w") as csv:
        csv.write("seconds,rss_mib,answered,failed\n")
        for t, rss, answered, failed in samples:
            csv.write(f"{t:.0f},{rss:.1f},{answered},{failed}\n")
    peak = max(rss for _, rss, _, _ in samples)
    print("\nRSS (MiB), one row per sample:")
    for t, rss, _, _ in samples:
        print(f"{t:6.0f} s {rss:7.1f} |" + "#" * int(60 * rss / peak))
    warm = next((s for s in samples if s[0] >= WARM_S), samples[0])
    last = samples[-1]
    print(
        f"\nreloads {generation}, requests answered {last[2]}, failed {last[3]}"
        f" ({dict((k, v) for k, v in load.counts.items() if k.startswith('failed: '))})"
    )
    print(
        f"RSS after warm-up ({warm[0]:.0f} s) {warm[1]:.1f} MiB, at the end ({last[0]:.0f} s)"
        f" {last[1]:.1f} MiB: growth {last[1] - warm[1]:+.1f} MiB; csv in {out}"
    )
    shutil.rmtree(repo, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
