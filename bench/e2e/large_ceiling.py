"""The most a server can answer of the load matrix's 4 MiB rows (``binL-c4``, ``grpcL-c4``) on
this host, against the same load generator (``closedloop.py``, the core's engine).

HTTP: a server that does nothing but what the kernel must do for each request. It answers
each infer request with the request's own tensor as the output, as the identity model does,
without one copy of its own: it receives the body straight into a buffer per connection
(``recv_into``) and sends the answer's header with a view of that buffer (``sendmsg``); one
thread per connection, which holds no GIL while the kernel copies. What it costs per request
is the kernel's loopback work (receive 4 MiB, send 4 MiB), as in any server; what the load
generator costs is the same as against a real one. Its requests/s bound what a server that
also runs a model (at least one copy of the tensor, from input to output) can reach with the
same load.

gRPC: tritonfast's own gRPC server core with no data plane (``grpc_floor.py --echo``), each
call answered with its own tensor, the reply built with one copy of it: what grpcio itself
costs a large message, the least any server on grpcio's Python API pays.

    usage: large_ceiling.py [SECONDS (6)] [ROUNDS (3)]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
from closedloop import closed_loop
from load_matrix import ROWS, request_for
from ports import free_port

MODEL = "identity"


def answer_header(tensor_bytes: int, shape: list[int]) -> bytes:
    header = json.dumps(
        {
            "model_name": MODEL,
            "model_version": "1",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": "FP32",
                    "shape": shape,
                    "parameters": {"binary_data_size": tensor_bytes},
                }
            ],
        },
        separators=(",", ":"),
    ).encode()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(header) + tensor_bytes}\r\n\r\n"
    ).encode()
    return head + header


def serve_connection(connection: socket.socket) -> None:
    body = bytearray()
    pending = b""
    with connection:
        while True:
            while b"\r\n\r\n" not in pending:
                chunk = connection.recv(65536)
                if not chunk:
                    return
                pending += chunk
            head, _, pending = pending.partition(b"\r\n\r\n")
            fields = dict(
                line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
            )
            length = int(fields["Content-Length"])
            json_length = int(fields["Inference-Header-Content-Length"])
            if len(body) != length:
                body = bytearray(length)
            view = memoryview(body)
            view[: len(pending)] = pending
            got, pending = len(pending), b""
            while got < length:
                got += connection.recv_into(view[got:])
            tensor = view[json_length:]
            shape = json.loads(bytes(view[:json_length]))["inputs"][0]["shape"]
            parts = [answer_header(len(tensor), shape), tensor]
            while parts:
                sent = connection.sendmsg(parts)
                while parts and sent >= len(parts[0]):
                    sent -= len(parts[0])
                    parts.pop(0)
                if parts:
                    parts[0] = memoryview(parts[0])[sent:]


def serve(listener: socket.socket) -> None:
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=serve_connection, args=(connection,), daemon=True).start()


def grpc_floor(port: int) -> subprocess.Popen[bytes]:
    """``grpc_floor.py --echo`` on ``port``, once it answers."""
    script = Path(__file__).with_name("grpc_floor.py")
    server = subprocess.Popen([sys.executable, str(script), str(port), "--echo"])
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        while True:
            try:
                grpc.channel_ready_future(channel).result(timeout=1)
                return server
            except grpc.FutureTimeoutError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    raise SystemExit("grpc_floor.py --echo did not start") from None


def report(name: str, index: int, protocol: str, address: str, seconds: float) -> None:
    row = ROWS[name]
    request = request_for(row, address, MODEL)
    measured = closed_loop(
        protocol, address, request, row.concurrency, seconds, connections=row.connections
    )
    print(
        f"ceiling {name} round {index + 1}: req_s {measured.req_s:.0f} "
        f"p50_ms {measured.p50_us / 1000:.2f}",
        flush=True,
    )


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    listener = socket.create_server(("127.0.0.1", 0))
    http_address = f"127.0.0.1:{listener.getsockname()[1]}"
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    port = free_port()
    server = grpc_floor(port)
    try:
        for index in range(rounds):
            report("binL-c4", index, "http", http_address, seconds)
            report("grpcL-c4", index, "grpc", f"127.0.0.1:{port}", seconds)
    finally:
        server.terminate()
        server.wait(os.cpu_count() or 10)


if __name__ == "__main__":
    main()
