"""Comparing a server whose core takes requests with one that answers them on the reference
path (``--backend-config=python,core-path=off``): a raw keep-alive HTTP connection whose
answers compare byte for byte, and a gRPC call's outcome. A test module that defines a
``servers`` fixture (the core's server, then the reference one) gets their clients from the
``connections`` and ``grpc_calls`` fixtures (tests/e2e/conftest.py)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from tests.conftest import RunningServer, start_server

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"

# The headers a client reads (the date and server lines are not part of the comparison).
COMPARED = (b"content-type", b"content-length", b"inference-header-content-length", b"connection")


class Connection:
    """One keep-alive HTTP/1.1 connection, a request at a time."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._reader = self._sock.makefile("rb")

    def ask(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, dict, bytes]:
        lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        status = self._reader.readline().rstrip(b"\r\n")
        fields = {}
        while line := self._reader.readline().rstrip(b"\r\n"):
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        answer = self._reader.read(int(fields.get(b"content-length", b"0")))
        return status, {k: v for k, v in fields.items() if k in COMPARED}, answer

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


# An HTTP request as Connection.ask takes it: (path, body, headers).
Request = tuple[str, bytes, dict[str, str]]


def binary_request(
    model: str, inputs: list[tuple[str, str, np.ndarray]], outputs: list[dict[str, Any]]
) -> Request:
    """An ``infer`` request to ``model`` whose ``inputs`` (name, datatype, array) travel as
    binary data, asking for ``outputs`` (the JSON header's entries)."""
    entries = [
        {
            "name": name,
            "datatype": datatype,
            "shape": list(values.shape),
            "parameters": {"binary_data_size": values.nbytes},
        }
        for name, datatype, values in inputs
    ]
    header = json.dumps({"inputs": entries, "outputs": outputs}).encode()
    body = header + b"".join(values.tobytes() for _, _, values in inputs)
    return (
        f"/v2/models/{model}/infer",
        body,
        {"Inference-Header-Content-Length": str(len(header))},
    )


def same_answers(connections: tuple[Connection, Connection], request: Request) -> Any:
    """``request``'s answer from the core's server, a success and the reference's too."""
    core, reference = connections
    answer = core.ask(*request)
    assert answer[0] == b"HTTP/1.1 200 OK", answer
    assert answer == reference.ask(*request)
    return answer


def grpc_answer(call: Any, message: bytes) -> tuple[str, Any]:
    """A call's outcome: ``("ok", reply bytes)`` or its status code and details."""
    try:
        return "ok", call(message, timeout=30)
    except grpc.RpcError as error:
        return str(error.code()), error.details()


def server_pair(
    repositories: list[Path], logs: Path, backend: str = "python"
) -> Iterator[tuple[RunningServer, ...]]:
    """For a module's ``servers`` fixture: a server on ``repositories`` whose core takes the
    requests, and one on the reference path (``backend``'s core path off); both stopped
    cleanly at the end."""
    core = start_server(repositories, logs / "core.log")
    reference = start_server(
        repositories, logs / "reference.log", f"--backend-config={backend},core-path=off"
    )
    yield core, reference
    assert core.stop() == 0, core.log()
    assert reference.stop() == 0, reference.log()
