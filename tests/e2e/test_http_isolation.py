"""A heavy request body does not stall other clients (HTTP and gRPC): inflating a small
compressed body into megabytes, and parsing (or refusing) megabytes of JSON, happen off the
event loop; a huge gRPC message is read beside the other calls."""

from __future__ import annotations

import gzip
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import RunningServer


def _send_heavy(
    server: RunningServer, body: bytes, outcome: list[object], compressed: bool = True
) -> None:
    headers = {"Content-Type": "application/json"}
    if compressed:
        headers["Content-Encoding"] = "gzip"
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/identity_fp32/infer",
        data=body,
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            outcome.append(answer.status)
    except urllib.error.HTTPError as error:
        outcome.append(error.code)


def _slowest_while(heavy: threading.Thread, server: RunningServer) -> dict[str, float]:
    """Start ``heavy``; until it ends, two other clients (tritonclient's HTTP and gRPC) send
    identity requests one after another; the longest each waited, in seconds, by protocol."""
    slowest = {"http": 0.0, "grpc": 0.0}

    def victim(kind: str, client_module: Any, url: str) -> None:
        client = client_module.InferenceServerClient(url)
        tensor = client_module.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        try:
            while heavy.is_alive():
                started = time.monotonic()
                client.infer("identity_fp32", [tensor])
                slowest[kind] = max(slowest[kind], time.monotonic() - started)
        finally:
            client.close()

    victims = [
        threading.Thread(target=victim, args=("http", httpclient, server.http_url)),
        threading.Thread(target=victim, args=("grpc", grpcclient, server.grpc_url)),
    ]
    heavy.start()
    for thread in victims:
        thread.start()
    heavy.join()
    for thread in victims:
        thread.join()
    return slowest


def test_a_compressed_json_bomb_leaves_other_clients_served(server: RunningServer) -> None:
    # 16 MiB of blanks and then junk: about 16 KB compressed, and a slow refusal to parse.
    bomb = gzip.compress(b" " * (16 << 20) + b"x")
    outcome: list[object] = []
    heavy = threading.Thread(target=_send_heavy, args=(server, bomb, outcome))
    slowest = _slowest_while(heavy, server)
    assert outcome == [500]  # the bomb itself is refused, as Triton refuses broken JSON
    assert max(slowest.values()) < 1.0, f"other clients waited {slowest} s"


def test_a_large_broken_json_body_leaves_other_clients_served(server: RunningServer) -> None:
    """32 MiB of JSON numbers that break at the very end: received, checked and refused
    while the others' requests go on being answered."""
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":['
    body += b"1," * (16 << 20) + b"]}]"
    outcome: list[object] = []
    heavy = threading.Thread(target=_send_heavy, args=(server, body, outcome, False))
    slowest = _slowest_while(heavy, server)
    assert outcome == [500]
    assert max(slowest.values()) < 1.0, f"other clients waited {slowest} s"


def test_a_huge_malformed_grpc_message_leaves_other_clients_served(server: RunningServer) -> None:
    """64 MiB that do not parse as a ModelInferRequest: refused with INVALID_ARGUMENT while an
    HTTP client's requests go on being answered."""
    junk = b"\x0a\xff\xff\xff\xff\x0f" + b"\xee" * (64 << 20)  # a field longer than the message
    outcome: list[object] = []

    def send() -> None:
        channel = grpc.insecure_channel(
            server.grpc_url, options=[("grpc.max_send_message_length", -1)]
        )
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            infer(junk, timeout=120)
            outcome.append("answered")
        except grpc.RpcError as error:
            outcome.append(error.code())
        finally:
            channel.close()

    slowest = _slowest_while(threading.Thread(target=send), server)
    assert outcome == [grpc.StatusCode.INVALID_ARGUMENT]
    assert max(slowest.values()) < 1.0, f"other clients waited {slowest} s"
