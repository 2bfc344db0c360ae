"""The load matrix of the request-path comparison (bench/README.md), sent by tritonfast's own
load generator (``tritonfast._core.LoadRun``, the engine of ``tritonfast perf``: event-loop
threads in the Rust core), against any Triton-compatible server. Needs nothing from the system.

Rows (``ROWS``, space-separated; all by default), closed loop, one load thread:

- ``json-c1``, ``json-c16``: HTTP, a JSON body with 16 FP32 values (shape [1, 16]).
- ``bin-c1``, ``bin-c16``: HTTP, the binary tensor extension, the output asked for as binary.
- ``grpc-c1``, ``grpc-c16``: gRPC ``ModelInfer`` with raw input contents; c=16 is 4 HTTP/2
  connections of 4 streams.
- ``binL-c4``, ``grpcL-c4``: one 4 MiB FP32 input ([1, 1048576]); gRPC over 4 connections.
- ``gen-c1``, ``gen-c16``: HTTP ``generate`` (the generate extension), the 16 FP32 values as
  ``{"INPUT0": [...]}``.

Each row first sends its exact request once and checks the answer (OUTPUT0 == INPUT0), then
runs WARM s of load and measures DUR s. Every answer must be a success, and the server's
success count (the statistics extension) must rise by exactly the number of requests
answered. With ``SERVER_PGID`` (bench/e2e/peer_ab.sh sets it) each row also reports the
server's cores and CPU µs per request, from /proc for that process group.

    usage: load_matrix.py HTTP_HOSTPORT GRPC_HOSTPORT MODEL [LABEL]
    env:   ROWS, DUR (6), WARM (1)
"""

from __future__ import annotations

import http.client
import json
import os
import sys
from dataclasses import dataclass

import grpc
import numpy as np
from closedloop import LoadFailed, closed_loop
from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.perf import payloads
from tritonfast.perf.inputs import Tensor

SMALL, LARGE = 16, 1 << 20  # FP32 values per request


class Failed(Exception):
    pass


@dataclass(frozen=True)
class Row:
    protocol: str  # "json", "bin", "grpc" or "generate"
    concurrency: int
    values: int
    connections: int = 1  # gRPC: HTTP/2 connections


ROWS = {
    "json-c1": Row("json", 1, SMALL),
    "json-c16": Row("json", 16, SMALL),
    "bin-c1": Row("bin", 1, SMALL),
    "bin-c16": Row("bin", 16, SMALL),
    "grpc-c1": Row("grpc", 1, SMALL),
    "grpc-c16": Row("grpc", 16, SMALL, connections=4),
    "binL-c4": Row("bin", 4, LARGE),
    "grpcL-c4": Row("grpc", 4, LARGE, connections=4),
    "gen-c1": Row("generate", 1, SMALL),
    "gen-c16": Row("generate", 16, SMALL),
}


def values(count: int) -> np.ndarray:
    return (np.arange(count, dtype=np.float32) % 1000).reshape(1, count)


def json_request(address: str, model: str, data: np.ndarray) -> bytes:
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": list(data.shape),
                    "datatype": "FP32",
                    "data": data.ravel().tolist(),
                }
            ],
            "outputs": [{"name": "OUTPUT0"}],
        },
        separators=(",", ":"),
    ).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {address}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def generate_request(address: str, model: str, data: np.ndarray) -> bytes:
    body = json.dumps({"INPUT0": data.ravel().tolist()}, separators=(",", ":")).encode()
    head = (
        f"POST /v2/models/{model}/generate HTTP/1.1\r\nHost: {address}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def request_for(row: Row, address: str, model: str) -> bytes:
    data = values(row.values)
    if row.protocol == "json":
        return json_request(address, model, data)
    if row.protocol == "generate":
        return generate_request(address, model, data)
    tensor = Tensor("INPUT0", "FP32", list(data.shape), data)
    if row.protocol == "grpc":
        return payloads.grpc_request(model, "", [tensor], ["OUTPUT0"])
    return payloads.http_request(address, model, "", [tensor], ["OUTPUT0"])


def check_http(address: str, request: bytes, expected: np.ndarray) -> None:
    """Sends the exact request bytes once and checks OUTPUT0."""
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    path = lines[0].split(" ")[1]
    headers = dict(line.split(": ", 1) for line in lines[1:] if not line.startswith("Host"))
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        data = answer.read()
    finally:
        connection.close()
    if answer.status != 200:
        raise Failed(f"HTTP {answer.status}: {data[:300]!r}")
    header_length = answer.getheader("Inference-Header-Content-Length")
    if header_length is None:
        document = json.loads(data)
        if "outputs" in document:
            [output] = document["outputs"]
            got = np.asarray(output["data"], np.float32)
        else:  # the generate extension's flat object
            got = np.asarray(document["OUTPUT0"], np.float32)
    else:
        got = np.frombuffer(data[int(header_length) :], "<f4")
    if not np.array_equal(got.ravel(), expected.ravel()):
        raise Failed("OUTPUT0 differs from INPUT0")


def check_grpc(address: str, request: bytes, expected: np.ndarray) -> None:
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)]) as ch:
        call = ch.unary_unary(payloads.GRPC_INFER_PATH)
        try:
            answer = pb.ModelInferResponse.FromString(call(request, timeout=60))
        except grpc.RpcError as e:
            raise Failed(f"gRPC {e.code()}: {e.details()}") from None
    got = np.frombuffer(answer.raw_output_contents[0], "<f4")
    if not np.array_equal(got, expected.ravel()):
        raise Failed("OUTPUT0 differs from INPUT0")


def successes(http_address: str, model: str) -> int:
    host, port = http_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("GET", f"/v2/models/{model}/stats")
        stats = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    return sum(e["inference_stats"]["success"]["count"] for e in stats["model_stats"])


def measure(row: Row, http_address: str, grpc_address: str, model: str) -> dict[str, float]:
    address = grpc_address if row.protocol == "grpc" else http_address
    request = request_for(row, address, model)
    check = check_grpc if row.protocol == "grpc" else check_http
    check(address, request, values(row.values))
    before = successes(http_address, model)
    measured = closed_loop(
        "grpc" if row.protocol == "grpc" else "http",
        address,
        request,
        row.concurrency,
        float(os.environ.get("DUR", "6")),
        warm=float(os.environ.get("WARM", "1")),
        connections=row.connections,
        pgid=int(os.environ.get("SERVER_PGID", "0")),
    )
    served = successes(http_address, model) - before
    if served != measured.answered:
        raise Failed(f"the server counted {served} successes for {measured.answered} answers")
    figures = {
        "n": measured.requests,
        "req_s": measured.req_s,
        "p50_ms": measured.p50_us / 1000,
        "p99_ms": measured.p99_us / 1000,
    }
    if measured.server_cpu_s:
        figures["srv_cores"] = measured.server_cpu_s / measured.seconds
        figures["srv_us_per_req"] = measured.server_cpu_s * 1e6 / measured.requests
    return figures


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    http_address, grpc_address, model = sys.argv[1:4]
    label = sys.argv[4] if len(sys.argv) > 4 else ""
    status = 0
    for name in os.environ.get("ROWS", " ".join(ROWS)).split():
        row = ROWS[name]
        try:
            figures = measure(row, http_address, grpc_address, model)
        except (Failed, LoadFailed) as failure:
            print(f"{label} {name} c={row.concurrency} FAILED {failure}", flush=True)
            status = 1
            continue
        text = " ".join(
            f"{key} {value:.0f}"
            if key in ("n", "req_s", "srv_us_per_req")
            else f"{key} {value:.2f}"
            for key, value in figures.items()
        )
        print(f"{label} {name} c={row.concurrency} {text}".strip(), flush=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
