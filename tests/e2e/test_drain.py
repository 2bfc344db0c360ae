"""SIGTERM drains without losing a request a client has sent: open HTTP connections keep being
answered (each answer then closes its connection) instead of being reset under a request on
its way, as Triton finishes its open connections; gRPC calls received are answered and later
ones refused with UNAVAILABLE, none cancelled; an open gRPC stream is answered to its end."""

from __future__ import annotations

import itertools
import json
import signal
import socket
import threading
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException
from tritonfast.frontends.grpc.servicer import DRAINING_REFUSALS

from tests.conftest import TEST_MODELS, start_server
from tests.waiting import wait_for

STOPPING = DRAINING_REFUSALS["/inference.GRPCInferenceService/ModelInfer"]
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
).encode()
REQUEST = (
    b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
)


def _client(port: int, started: threading.Event, tally: dict[str, int]) -> None:
    """Requests back to back on one keep-alive connection until the server closes it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    reader = sock.makefile("rb")
    try:
        while True:
            sock.sendall(REQUEST)
            status = reader.readline()
            if not status:  # the connection closed under a request that was sent: lost
                tally["lost"] += 1
                return
            headers = {}
            while line := reader.readline().rstrip(b"\r\n"):
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip().lower()
            reader.read(int(headers.get(b"content-length", b"0")))
            assert status.startswith(b"HTTP/1.1 200"), status
            tally["answered"] += 1
            started.set()
            if headers.get(b"connection") == b"close":
                return
    except ConnectionResetError:
        tally["lost"] += 1
    finally:
        reader.close()
        sock.close()


def test_sigterm_loses_no_request_sent_on_an_open_connection(tmp_path) -> None:
    for attempt in range(3):
        server = start_server([TEST_MODELS], tmp_path / f"server{attempt}.log")
        tallies = [{"answered": 0, "lost": 0} for _ in range(4)]
        started = [threading.Event() for _ in tallies]
        clients = [
            threading.Thread(target=_client, args=(server.http_port, s, t))
            for s, t in zip(started, tallies, strict=True)
        ]
        for client in clients:
            client.start()
        for event in started:
            assert event.wait(30)
        server.proc.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(60)
        assert server.wait_exit(60) == 0
        assert sum(t["lost"] for t in tallies) == 0, tallies
        assert all(t["answered"] > 0 for t in tallies)


def _refused(call: Any) -> bool:
    try:
        call()
    except InferenceServerException as error:
        assert error.status() == "StatusCode.UNAVAILABLE" and error.message() == "Server exiting"
        return True
    return False


def _grpc_client(url: str, index: int, started: threading.Event, tally: dict[str, Any]) -> None:
    """Calls one after another on one channel, each with a unique id checked in its answer,
    until the server refuses one."""
    client = grpcclient.InferenceServerClient(url)
    try:
        for sent in itertools.count():
            tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.array([[index, sent]], np.float32))
            try:
                result = client.infer("identity_fp32", [tensor], request_id=f"{index}-{sent}")
            except InferenceServerException as error:
                tally["ended"] = (error.status(), error.message())
                return
            assert result.get_response().id == f"{index}-{sent}"
            assert result.as_numpy("OUTPUT0").tolist() == [[index, sent]]
            tally["answered"] += 1
            started.set()
    finally:
        client.close()


def test_sigterm_answers_every_grpc_call_received_and_refuses_the_rest_cleanly(tmp_path) -> None:
    """Calls on open channels after SIGTERM are refused with UNAVAILABLE (never run), every
    call received before is answered, and none is cancelled under its client."""
    server = start_server([TEST_MODELS], tmp_path / "server.log")
    tallies: list[dict[str, Any]] = [{"answered": 0, "ended": None} for _ in range(4)]
    started = [threading.Event() for _ in tallies]
    clients = [
        threading.Thread(target=_grpc_client, args=(server.grpc_url, index, s, t))
        for index, (s, t) in enumerate(zip(started, tallies, strict=True))
    ]
    for client in clients:
        client.start()
    for event in started:
        assert event.wait(30)
    other = grpcclient.InferenceServerClient(server.grpc_url)
    assert other.is_server_ready()
    server.proc.send_signal(signal.SIGTERM)
    # As on Triton: health calls are refused with "Server exiting" while it drains, metadata
    # is still answered.
    wait_for(lambda: _refused(other.is_server_live), "the server to say it is exiting")
    assert other.get_model_metadata("identity_fp32").name == "identity_fp32"
    other.close()
    for client in clients:
        client.join(60)
    assert server.wait_exit(60) == 0
    for tally in tallies:
        assert tally["answered"] > 0
        assert tally["ended"] == ("StatusCode.UNAVAILABLE", STOPPING), tallies


def test_sigterm_answers_every_request_of_an_open_grpc_stream(tmp_path) -> None:
    """A ModelStreamInfer stream open when SIGTERM comes is drained, not cut: every request
    sent on it, before the signal and after, is answered once (each carries its own id), and
    the server exits 0 once the client ends the stream."""
    server = start_server([TEST_MODELS], tmp_path / "server.log")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: list[tuple[str | None, str | None]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append((None if result is None else result.get_response().id, error and str(error)))
        if len(answers) == 200:
            done.set()

    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.float32))
    client.start_stream(callback=callback)
    try:
        for number in range(100):
            client.async_stream_infer("identity_fp32", [tensor], request_id=f"before-{number}")
        wait_for(lambda: len(answers) >= 10, "the stream to be open and answering")
        server.proc.send_signal(signal.SIGTERM)
        for number in range(100):
            client.async_stream_infer("identity_fp32", [tensor], request_id=f"after-{number}")
        assert done.wait(60), f"{len(answers)} of 200 answered"
    finally:
        client.stop_stream()
        client.close()
    assert server.wait_exit(60) == 0
    assert [error for _, error in answers if error] == []
    expected = {f"{when}-{n}" for when in ("before", "after") for n in range(100)}
    assert sorted(request_id for request_id, _ in answers) == sorted(expected)
