"""A heavy request body does not stall other clients: inflating a small compressed body into
megabytes, and parsing (or refusing) megabytes of JSON, happen off the event loop."""

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


def _send_heavy(server: RunningServer, body: bytes, outcome: list[object]) -> None:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/identity_fp32/infer",
        data=body,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            outcome.append(answer.status)
    except urllib.error.HTTPError as error:
        outcome.append(error.code)


def _slowest_while(heavy: threading.Thread, client_module: Any, url: str) -> float:
    """Start ``heavy``; until it ends, send identity requests from another client (of
    ``client_module``, tritonclient's http or grpc); the longest one took this many seconds."""
    client = client_module.InferenceServerClient(url)
    tensor = client_module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        heavy.start()
        slowest = 0.0
        while heavy.is_alive():
            started = time.monotonic()
            client.infer("identity_fp32", [tensor])
            slowest = max(slowest, time.monotonic() - started)
        heavy.join()
    finally:
        client.close()
    return slowest


def test_a_compressed_json_bomb_leaves_other_clients_served(server: RunningServer) -> None:
    # 16 MiB of blanks and then junk: about 16 KB compressed, and a slow refusal to parse.
    bomb = gzip.compress(b" " * (16 << 20) + b"x")
    outcome: list[object] = []
    heavy = threading.Thread(target=_send_heavy, args=(server, bomb, outcome))
    slowest = _slowest_while(heavy, grpcclient, server.grpc_url)
    assert outcome and outcome[0] in (400, 500)  # the bomb itself is refused
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"


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

    slowest = _slowest_while(threading.Thread(target=send), httpclient, server.http_url)
    assert outcome == [grpc.StatusCode.INVALID_ARGUMENT]
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"
