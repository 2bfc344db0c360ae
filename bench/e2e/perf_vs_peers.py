"""``tritonfast perf`` against the system's load generators on the same server: wrk for HTTP
(binary tensor extension) and h2load for gRPC, both closed-loop at the same concurrency,
alternating, on the identity model (16 FP32 values) of one ``tritonfast serve``.

    python bench/e2e/perf_vs_peers.py [ROUNDS] [SECONDS] [CONCURRENCY]   (defaults 3, 5, 16)

wrk runs one thread with CONCURRENCY connections; h2load one thread with CONCURRENCY/4
connections of 4 streams; ``tritonfast perf`` its defaults (one load thread; gRPC: connections
of at most 4 streams) with ``-p`` SECONDS*1000/3, so that its three stable windows last about
as long as the peers' run. Prints requests/s and p50 of each and the ratios; judges nothing.
Needs wrk and h2load on PATH.
"""

from __future__ import annotations

import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from ports import free_port
from tritonfast.perf import payloads
from tritonfast.perf.inputs import Tensor

HERE = Path(__file__).resolve().parent
MODELS = HERE.parent / "models"
LUA = HERE / "wrk_post.lua"


def start_server(http: int, grpc: int, metrics: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "tritonfast",
        "serve",
        "--model-repository",
        str(MODELS),
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--metrics-port",
        str(metrics),
    ]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=1)
            return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not become ready")


def bodies(directory: Path, http_address: str) -> tuple[Path, int, Path]:
    tensor = Tensor("INPUT0", "FP32", [1, 16], np.arange(16, dtype=np.float32).reshape(1, 16))
    request = payloads.http_request(http_address, "identity", "", [tensor], ["OUTPUT0"])
    head, _, body = request.partition(b"\r\n\r\n")
    header_length = int(re.search(rb"Inference-Header-Content-Length: (\d+)", head).group(1))
    http_body = directory / "http.bin"
    http_body.write_bytes(body)
    message = payloads.grpc_request("identity", "", [tensor], ["OUTPUT0"])
    grpc_body = directory / "grpc.bin"
    grpc_body.write_bytes(b"\0" + len(message).to_bytes(4, "big") + message)
    return http_body, header_length, grpc_body


def wrk(
    address: str, body: Path, header_length: int, concurrency: int, seconds: int
) -> tuple[float, float]:
    env = {**os.environ, "BODY": str(body), "HLEN": str(header_length)}
    url = f"http://{address}/v2/models/identity/infer"
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{seconds}s", "-s", str(LUA), url]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    fields = dict(kv.split("=") for kv in re.search(r"RESULT (.*)", out).group(1).split())
    if int(fields["errors"]):
        raise SystemExit(f"wrk saw {fields['errors']} errors")
    return int(fields["requests"]) / (int(fields["duration_us"]) / 1e6), int(
        fields["p50_us"]
    ) / 1000


def h2load(
    address: str, body: Path, concurrency: int, seconds: int, log: Path
) -> tuple[float, float]:
    url = f"http://{address}/inference.GRPCInferenceService/ModelInfer"
    command = [
        "h2load",
        "-t1",
        f"-c{max(1, concurrency // 4)}",
        f"-m{min(4, concurrency)}",
        "-D",
        str(seconds),
        "-d",
        str(body),
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        f"--log-file={log}",
        url,
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out).group(1))
    latencies = [
        int(line.split("\t")[2]) for line in log.read_text().splitlines() if line.count("\t") >= 2
    ]
    return rate, float(np.percentile(latencies, 50)) / 1000


def perf(
    protocol: str, address: str, concurrency: int, seconds: int, out: Path
) -> tuple[float, float]:
    command = [
        sys.executable,
        "-m",
        "tritonfast",
        "perf",
        "-m",
        "identity",
        "-i",
        protocol,
        "-u",
        address,
        "--shape",
        "INPUT0:16",
        "--concurrency-range",
        str(concurrency),
        "-p",
        str(max(500, seconds * 1000 // 3)),
        "-f",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"tritonfast perf failed:\n{done.stdout[-2000:]}\n{done.stderr}")
    with out.open() as f:
        row = next(csv.DictReader(f))
    return float(row["Inferences/Second"]), int(row["p50 latency"]) / 1000


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    concurrency = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    http, grpc, metrics = free_port(), free_port(), free_port()
    server = start_server(http, grpc, metrics)
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as scratch:
            directory = Path(scratch)
            http_address, grpc_address = f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"
            http_body, header_length, grpc_body = bodies(directory, http_address)
            for _ in range(rounds):
                results.setdefault("HTTP wrk", []).append(
                    wrk(http_address, http_body, header_length, concurrency, seconds)
                )
                results.setdefault("HTTP perf", []).append(
                    perf("http", http_address, concurrency, seconds, directory / "p.csv")
                )
                results.setdefault("gRPC h2load", []).append(
                    h2load(grpc_address, grpc_body, concurrency, seconds, directory / "h2.log")
                )
                results.setdefault("gRPC perf", []).append(
                    perf("grpc", grpc_address, concurrency, seconds, directory / "p.csv")
                )
    finally:
        server.terminate()
        server.wait()
    print(f"c={concurrency}, {rounds} rounds of {seconds} s; req/s and p50 ms by round")
    for protocol, peer in (("HTTP", "wrk"), ("gRPC", "h2load")):
        theirs, ours = results[f"{protocol} {peer}"], results[f"{protocol} perf"]
        rate_ratio = statistics.median(o[0] / t[0] for o, t in zip(ours, theirs, strict=True))
        p50_ratio = statistics.median(o[1] / t[1] for o, t in zip(ours, theirs, strict=True))
        print(f"{protocol:5} {peer:7} " + "  ".join(f"{r:8.0f} {p:5.2f}" for r, p in theirs))
        print(f"{protocol:5} {'perf':7} " + "  ".join(f"{r:8.0f} {p:5.2f}" for r, p in ours))
        print(
            f"{protocol:5} perf / {peer}: throughput {rate_ratio:.2f}x,"
            f" p50 {p50_ratio:.2f}x (medians)"
        )


if __name__ == "__main__":
    main()
