"""The response stream end to end: requests answered by any number of responses, over gRPC
``ModelStreamInfer`` (tritonclient) and HTTP Server-Sent Events (raw sockets), cancellation
reaching the producer, the generate extension, the Python backend's response sender and
``async def execute``, BLS calls through the server handle, a decoupled model in a worker
process (``repeat_proc``), and our equivalents of python_backend's decoupled examples
(``repeat_example``, ``square_int32``) with what their clients check.

The ``repeat`` backend (tests/plugins) is a test-only backend found through the
``tritonfast.backends`` entry points: one response per element of ``IN``, then a bare final
flag; it counts the requests it saw cancelled in its ``CANCELLED`` output.
"""

from __future__ import annotations

import json
import queue
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, TEST_MODELS, RunningServer, start_server
from tests.waiting import wait_for

STREAMING_MODELS = ROOT / "tests" / "models_streaming"
PLUGINS = ROOT / "tests" / "plugins"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def stream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(
        [TEST_MODELS, STREAMING_MODELS],
        tmp_path_factory.mktemp("stream") / "server.log",
        pythonpath=(PLUGINS,),
    )
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def grpc_client(stream_server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(stream_server.grpc_url)
    yield client
    client.close()


def int32_input(values: list[int], client: Any = grpcclient) -> Any:
    tensor = client.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return tensor


def stream_replies(
    client: grpcclient.InferenceServerClient,
    requests: list[tuple[str, list[int], dict[str, Any]]],
    expected: int,
    **options: Any,
) -> list[tuple[Any, Any]]:
    """Send ``(model, IN values, extra async_stream_infer arguments)`` on one stream and
    collect ``expected`` callbacks ((result, error) pairs) in arrival order."""
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        for index, (model, values, extra) in enumerate(requests):
            client.async_stream_infer(
                model, [int32_input(values)], request_id=f"r{index}", **options, **extra
            )
        return [replies.get(timeout=WAIT_S) for _ in range(expected)]
    finally:
        client.stop_stream()


def final_flag(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


# -- gRPC ModelStreamInfer ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "model", ["repeat_int32", "repeat_py", "repeat_proc", "repeat_warmed_proc"]
)
def test_grpc_stream_carries_every_response_of_each_request(
    grpc_client: grpcclient.InferenceServerClient, model: str
) -> None:
    requests = [(model, [7, 8, 9], {}), (model, [1], {}), (model, [4, 5, 6, 7, 8], {})]
    replies = stream_replies(grpc_client, requests, expected=9)
    assert all(error is None for _, error in replies)
    by_request: dict[str, list[tuple[int, int]]] = {}
    for result, _ in replies:
        request_id = result.get_response().id
        by_request.setdefault(request_id, []).append(
            (int(result.as_numpy("IDX")[0]), int(result.as_numpy("OUT")[0]))
        )
        assert not final_flag(result)  # the final flag comes alone, after the last response
    assert by_request == {
        "r0": [(0, 7), (1, 8), (2, 9)],
        "r1": [(0, 1)],
        "r2": [(0, 4), (1, 5), (2, 6), (3, 7), (4, 8)],
    }


def test_grpc_stream_empty_final_responses_on_request(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    replies = stream_replies(
        grpc_client, [("repeat_int32", [3, 4], {})], expected=3, enable_empty_final_response=True
    )
    results = [result for result, error in replies if error is None]
    assert len(results) == 3
    assert [final_flag(r) for r in results] == [False, False, True]
    last = results[-1].get_response()
    assert (last.id, last.model_name, list(last.outputs)) == ("r0", "repeat_int32", [])


@pytest.mark.parametrize(
    "model", ["async_repeat", "async_repeat_proc"], ids=["in-process", "worker"]
)
def test_grpc_stream_async_execute_and_error_responses(
    grpc_client: grpcclient.InferenceServerClient, model: str
) -> None:
    requests = [(model, [1, 2, 3], {}), (model, [1, -1], {})]
    replies = stream_replies(grpc_client, requests, expected=4)
    errors = [error for _, error in replies if error is not None]
    assert len(errors) == 1 and "negative input" in errors[0].message()
    results = [result for result, error in replies if error is None]
    assert [int(r.as_numpy("OUT")[0]) for r in results] == [10, 20, 30]
    assert [final_flag(r) for r in results] == [False, False, True]


@pytest.mark.parametrize(
    "model", ["sender_default", "sender_default_proc"], ids=["in-process", "worker"]
)
def test_grpc_stream_single_response_models_answer_in_request_order(
    grpc_client: grpcclient.InferenceServerClient, model: str
) -> None:
    """A default model answering through its response sender, on the same stream."""
    requests = [(model, [index, index], {}) for index in range(6)]
    replies = stream_replies(grpc_client, requests, expected=6)
    assert [r.get_response().id for r, _ in replies] == [f"r{i}" for i in range(6)]
    assert [r.as_numpy("OUT").tolist() for r, _ in replies] == [[i + 1, i + 1] for i in range(6)]
    assert all(final_flag(r) for r, _ in replies)
    # Its attempt to send the final flag before a response was refused, in Triton's words.
    assert {r.as_numpy("REFUSAL")[0] for r, _ in replies} == {
        b"Unable to send response. Non-decoupled model cannot send complete final before"
        b" sending a response."
    }


def test_worker_responses_held_back_in_a_burst_arrive_without_the_next_send(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """A worker's small responses sent in a burst travel in groups; the last group is sent
    when due even though the model sends nothing more for a while, and order is kept."""
    count, pause_s = 150, 3.0
    arrivals: queue.Queue[tuple[Any, Any, float]] = queue.Queue()
    grpc_client.start_stream(
        callback=lambda result, error: arrivals.put((result, error, time.monotonic()))
    )
    try:
        inputs = []
        for name, value in (("COUNT", count), ("PAUSE_MS", int(pause_s * 1000))):
            tensor = grpcclient.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            inputs.append(tensor)
        sent = time.monotonic()
        grpc_client.async_stream_infer("burst_proc", inputs)
        replies = [arrivals.get(timeout=WAIT_S) for _ in range(count + 1)]
    finally:
        grpc_client.stop_stream()
    assert all(error is None for _, error, _ in replies)
    assert [int(result.as_numpy("IDX")[0]) for result, _, _ in replies] == list(range(count + 1))
    # The whole burst arrived during the model's pause, the response after it only then.
    assert replies[count - 1][2] - sent < pause_s * 0.5
    assert replies[count][2] - sent >= pause_s


@pytest.mark.parametrize("model", ["send_timing", "send_timing_proc"], ids=["in-process", "worker"])
def test_a_slow_grpc_reader_holds_back_its_models_sends(
    grpc_client: grpcclient.InferenceServerClient, model: str
) -> None:
    """The server buffers a bounded number of a stream's responses: while the client does not
    read, the model's sends wait. (Far fewer than ``count`` responses of 64 KiB fit in every
    buffer on the way, the client's gRPC receive window included.)"""
    count, pad_bytes, hold_s = 1000, 64 * 1024, 2.0
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    first = True

    def arrived(result: Any, error: Any) -> None:
        nonlocal first
        if first:  # the client stops reading for a while
            first = False
            time.sleep(hold_s)
        replies.put((result, error))

    grpc_client.start_stream(callback=arrived)
    try:
        inputs = []
        for name, value in (("COUNT", count), ("PAD_BYTES", pad_bytes)):
            tensor = grpcclient.InferInput(name, [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            inputs.append(tensor)
        grpc_client.async_stream_infer(model, inputs)
        got = [replies.get(timeout=WAIT_S) for _ in range(count + 1)]
    finally:
        grpc_client.stop_stream()
    assert all(error is None for _, error in got)
    assert [int(r.as_numpy("IDX")[0]) for r, _ in got[:count]] == list(range(count))
    sent_ms = int(got[count][0].as_numpy("SENT_MS")[0])
    assert sent_ms >= hold_s * 1000, f"the model sent all {count} responses in {sent_ms} ms"


def test_grpc_unary_infer_refuses_a_decoupled_model(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    malformed = int32_input([1])
    malformed.set_shape([2])  # two elements declared, one sent
    for inputs in ([int32_input([1])], [malformed]):  # refused before its tensors are read
        with pytest.raises(InferenceServerException) as caught:
            grpc_client.infer("repeat_int32", inputs)
        assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
        assert caught.value.message() == (
            "ModelInfer RPC doesn't support models with decoupled transaction policy"
        )


# -- HTTP Server-Sent Events and the generate extension -------------------------------------------
def http_post(server: RunningServer, path: str, body: dict[str, Any] | bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=WAIT_S)
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


class ChunkedReader:
    """Reads one HTTP/1.1 response from a socket: the head, then the chunked body's chunks."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def _fill(self) -> None:
        data = self._sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data

    def _line(self) -> bytes:
        while b"\r\n" not in self._buffer:
            self._fill()
        line, self._buffer = self._buffer.split(b"\r\n", 1)
        return line

    def head(self) -> tuple[int, dict[str, str]]:
        status = int(self._line().split()[1])
        headers = {}
        while line := self._line():
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    def chunk(self) -> bytes:
        size = int(self._line(), 16)
        while len(self._buffer) < size + 2:
            self._fill()
        data, self._buffer = self._buffer[:size], self._buffer[size + 2 :]
        return data


def sse_events(reader: ChunkedReader) -> Iterator[dict[str, Any]]:
    """The events of a Server-Sent Events body, as their JSON ``data``."""
    pending = b""
    while chunk := reader.chunk():
        pending += chunk
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            assert event.startswith(b"data: ")
            yield json.loads(event[len(b"data: ") :])
    assert pending == b""


@pytest.mark.parametrize("model", ["repeat_int32", "repeat_py", "repeat_proc", "async_repeat"])
def test_generate_stream_sends_each_response_as_an_event(
    stream_server: RunningServer, model: str
) -> None:
    with http_post(
        stream_server, f"/v2/models/{model}/generate_stream", {"IN": [2, 3, 4], "id": "g1"}
    ) as sock:
        reader = ChunkedReader(sock)
        status, headers = reader.head()
        assert status == 200
        assert headers["content-type"] == "text/event-stream; charset=utf-8"
        assert headers["transfer-encoding"] == "chunked"
        events = list(sse_events(reader))
    scale = 10 if model == "async_repeat" else 1
    assert [event["OUT"] for event in events] == [2 * scale, 3 * scale, 4 * scale]
    assert all(event["model_name"] == model and event["id"] == "g1" for event in events)


def test_generate_stream_error_response_sets_the_status(stream_server: RunningServer) -> None:
    """As in Triton 2.51: a first response that is an error answers 400, whatever its code."""
    body = {"IN": [-1]}
    with http_post(stream_server, "/v2/models/async_repeat/generate_stream", body) as sock:
        reader = ChunkedReader(sock)
        status, _ = reader.head()
        assert status == 400
        assert list(sse_events(reader)) == [{"error": "negative input"}]


def test_generate_maps_inputs_parameters_and_outputs(stream_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(stream_server.http_url)
    try:
        status, body = post_json(
            stream_server,
            "/v2/models/identity_fp32/generate",
            {"INPUT0": [1.5, 2.0], "parameters": {"note": "x"}},
        )
        assert status == 200
        assert body == {"model_name": "identity_fp32", "model_version": "1", "OUTPUT0": [1.5, 2.0]}
        status, body = post_json(stream_server, "/v2/models/async_repeat/generate", {"IN": 4})
        assert (status, body["OUT"]) == (200, 40)  # one element: a scalar
        status, body = post_json(stream_server, "/v2/models/async_repeat/generate", {"IN": [[5]]})
        assert (status, body["OUT"]) == (200, 50)  # nested arrays are flattened
        status, body = post_json(stream_server, "/v2/models/async_repeat/generate", {"IN": [1, 2]})
        assert body == {
            "error": "generate expects model to produce exactly 1 response, use generate stream"
            " for model that generates various number of responses"
        }
        status, body = post_json(stream_server, "/v2/models/identity_fp32/generate", {"X": 1})
        assert (status, body["error"]) == (
            400,
            "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model"
            " 'identity_fp32'. Got input(s) [], but missing required input(s) ['INPUT0']."
            " Please provide all required input(s).",
        )
        status, body = post_json(
            stream_server, "/v2/models/async_repeat/generate", {"IN": 1, "x": [1]}
        )
        assert (status, body["error"]) == (
            400,
            "parameter 'x' has invalid type. It should be either 'int', 'bool', or 'string'.",
        )
        status, body = post_json(stream_server, "/v2/models/async_repeat/generate", b"{bad")
        assert (status, body["error"]) == (
            500,
            "failed to parse the request JSON buffer: Missing a name for object member. at 1",
        )
        # An input named twice in one object is refused (JSON would keep the last one); an
        # error in the nested object names it (Triton 2.51's answers, checked side by side).
        twice = "[request id: <id_unknown>] input 'IN' already exists in request"
        for body_text, prefix in (
            (b'{"IN": 1, "IN": 2}', ""),
            (b'{"parameters": {"IN": 1, "IN": 2}}', "Converting keyword: 'parameters': "),
            (b'{"IN": 1, "parameters": {"IN": 2}}', "Converting keyword: 'parameters': "),
        ):
            status, body = post_json(stream_server, "/v2/models/async_repeat/generate", body_text)
            assert (status, body["error"]) == (400, prefix + twice)
        not_int = (
            "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"
        )
        refusals = {
            b'{"IN": 1, "id": 5}': "Unable to parse 'id': attempt to access JSON non-string as"
            " string",
            b'{"IN": 1, "parameters": 5}': "Expected JSON object for keyword: 'parameters':"
            " attempt to access JSON non-object as object",
            b'{"IN": {"a": 1}}': not_int,
            b'{"parameters": {"IN": [1, {"a": 1}]}}': "Converting keyword: 'parameters': "
            + not_int,
        }
        for body_text, message in refusals.items():
            status, body = post_json(stream_server, "/v2/models/async_repeat/generate", body_text)
            assert (status, body["error"]) == (500, message)
        # The id is the request's, and a parameter the model sees too; members named like the
        # protocol's parameters are the model's, and schedule nothing (as in Triton 2.51).
        status, body = post_json(
            stream_server,
            "/v2/models/params/generate",
            {
                "INPUT0": [1],
                "id": "abc",
                "note": "x",
                "priority": 3,
                "timeout": 1,
                "parameters": {"k": True, "sequence_id": 4, "binary_data_output": True},
            },
        )
        assert (status, body["seen_request_id"], body["id"]) == (200, "abc", "abc")
        assert (body["note"], body["k"], body["priority"], body["timeout"]) == ("x", True, 3, 1)
        assert (body["sequence_id"], body["binary_data_output"]) == (4, True)
        # An id that is not valid UTF-8 has its bytes replaced (Triton passes them through).
        for path, latin1 in (
            ("/v2/models/async_repeat/generate", b'{"IN": 1, "id": "\xe9t\xe9"}'),
            (
                "/v2/models/identity_fp32/infer",
                b'{"id": "\xe9", "inputs": [{"name": "INPUT0", "datatype": "FP32",'
                b' "shape": [1, 1], "data": [1]}]}',
            ),
        ):
            status, body = post_json(stream_server, path, latin1)
            assert (status, body["id"]) == (
                200,
                "\ufffdt\ufffd" if "generate" in path else "\ufffd",
            )
        # A nested id is a parameter only (the model's parameters come back in the answer).
        status, body = post_json(
            stream_server, "/v2/models/params/generate", {"INPUT0": [1], "parameters": {"id": "in"}}
        )
        assert (status, body["seen_request_id"], body["id"]) == (200, "", "in")
        status, body = post_json(
            stream_server, "/v2/models/identity_bytes/generate", {"INPUT0": {"USER": "hi"}}
        )
        assert (status, body["error"]) == (
            500,
            "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
        )
    finally:
        client.close()


@pytest.mark.parametrize("shape", [[1], [2]])  # [2]: malformed, refused before it is read
def test_http_infer_refuses_a_decoupled_model(
    stream_server: RunningServer, shape: list[int]
) -> None:
    status, body = post_json(
        stream_server,
        "/v2/models/repeat_int32/infer",
        {"inputs": [{"name": "IN", "datatype": "INT32", "shape": shape, "data": [1]}]},
    )
    assert (status, body) == (
        501,
        {"error": "HTTP end point doesn't support models with decoupled transaction policy"},
    )


def post_json(server: RunningServer, path: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    with http_post(server, path, body) as sock:
        reader = ChunkedReader(sock)
        status, headers = reader.head()
        length = int(headers["content-length"])
        while len(reader._buffer) < length:
            reader._fill()
        return status, json.loads(reader._buffer[:length])


# -- cancellation reaches the producer ------------------------------------------------------------
def cancelled_count(client: grpcclient.InferenceServerClient) -> int:
    replies = stream_replies(client, [("repeat_int32", [0], {})], expected=1)
    result, error = replies[0]
    assert error is None
    return int(result.as_numpy("CANCELLED")[0])


def wait_for_cancelled(client: grpcclient.InferenceServerClient, at_least: int) -> int:
    deadline = time.monotonic() + WAIT_S
    while (count := cancelled_count(client)) < at_least:
        assert time.monotonic() < deadline, f"the producer saw {count} cancellations"
    return count


def test_a_client_leaving_cancels_its_stream(
    stream_server: RunningServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    before = cancelled_count(grpc_client)
    # HTTP: read the first event, then close the connection.
    long_request = {"IN": list(range(200)), "delay_ms": 20}
    with http_post(stream_server, "/v2/models/repeat_int32/generate_stream", long_request) as sock:
        reader = ChunkedReader(sock)
        assert reader.head()[0] == 200
        assert next(sse_events(reader))["IDX"] == 0
    after_http = wait_for_cancelled(grpc_client, before + 1)
    # gRPC: stop the stream with its requests still sending.
    first: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: first.put(result))
    grpc_client.async_stream_infer(
        "repeat_int32", [int32_input(list(range(200)))], parameters={"delay_ms": 20}
    )
    assert first.get(timeout=WAIT_S) is not None
    grpc_client.stop_stream(cancel_requests=True)
    wait_for_cancelled(grpc_client, after_http + 1)


def mode_input(mode: int) -> Any:
    tensor = grpcclient.InferInput("MODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return tensor


def test_a_worker_models_stream_sees_its_client_leave(
    stream_server: RunningServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    first: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: first.put(result))
    grpc_client.async_stream_infer("stream_fate_proc", [mode_input(0)], request_id="leaver")
    assert first.get(timeout=WAIT_S) is not None
    grpc_client.stop_stream(cancel_requests=True)
    wait_for(
        lambda: "stream leaver saw its cancellation" in stream_server.log(),
        "the worker's model to see its stream cancelled",
    )


def test_a_stream_whose_batch_returned_sees_its_client_leave(
    stream_server: RunningServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """repeat_proc's execute returns at once, its thread sends the responses: the client
    leaving reaches the worker's sender after the batch (the server names the stream to the
    worker)."""
    first: queue.Queue[Any] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: first.put(result))
    many = int32_input(list(range(1_000_000)))
    grpc_client.async_stream_infer("repeat_proc", [many], request_id="long-gone")
    assert first.get(timeout=WAIT_S) is not None
    grpc_client.stop_stream(cancel_requests=True)
    wait_for(
        lambda: "repeat long-gone saw its cancellation" in stream_server.log(),
        "the worker's thread to see its stream cancelled",
    )


def test_a_worker_dying_mid_stream_ends_it_with_an_error_and_restarts(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    replies = stream_replies_of(grpc_client, "stream_fate_proc", [mode_input(1)], expected=3)
    assert [int(result.as_numpy("IDX")[0]) for result, _ in replies[:2]] == [0, 1]
    error = replies[2][1]
    assert error is not None and error.message() == (
        "the worker process of model instance 'stream_fate_proc_0' exited before it sent"
        " the final response"
    )
    # The worker is started again: the next request is served.
    again = stream_replies_of(grpc_client, "stream_fate_proc", [mode_input(1)], expected=2)
    assert [int(result.as_numpy("IDX")[0]) for result, _ in again] == [0, 1]


def test_a_worker_dying_mid_generate_stream_ends_it_with_an_error_event(
    stream_server: RunningServer,
) -> None:
    """The same through ``generate_stream``, whose events the core's reader thread writes
    itself: the two events, then the error as an event, and the body's end."""
    path = "/v2/models/stream_fate_proc/generate_stream"
    for _ in range(2):  # and once more, on the restarted worker
        with http_post(stream_server, path, {"MODE": 1}) as sock:
            reader = ChunkedReader(sock)
            status, headers = reader.head()
            assert status == 200 and headers["content-type"].startswith("text/event-stream")
            events = list(sse_events(reader))
        assert [event.get("IDX") for event in events[:2]] == [0, 1]
        assert events[2:] == [
            {
                "error": "the worker process of model instance 'stream_fate_proc_0' exited"
                " before it sent the final response"
            }
        ]


def stream_replies_of(
    client: grpcclient.InferenceServerClient, model: str, inputs: list[Any], expected: int
) -> list[tuple[Any, Any]]:
    """Send one request with ``inputs`` on a new stream; its first ``expected`` callbacks."""
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        client.async_stream_infer(model, inputs)
        return [replies.get(timeout=WAIT_S) for _ in range(expected)]
    finally:
        client.stop_stream(cancel_requests=True)


# -- BLS through the server handle ----------------------------------------------------------------
def test_bls_calls_another_model_in_process(stream_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(stream_server.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.5], dtype=np.float32))
        result = client.infer("bls_double", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [4.5]
        # As Triton 2.51's Python backend words a call refused before it ran (checked side by
        # side); the callee's own errors come back as they are.
        with pytest.raises(InferenceServerException) as caught:
            client.infer("bls_double", [tensor], parameters={"callee": "no_such_model"})
        assert caught.value.message() == (
            "Model no_such_model - Error when running inference: Failed for execute the"
            " inference request. Model 'no_such_model' is not ready."
        )
        with pytest.raises(InferenceServerException) as caught:
            client.infer("bls_double", [tensor], parameters={"callee": "repeat_py"})
        assert caught.value.message() == (
            "Model repeat_py - Error when running inference: Model repeat_py is using the"
            " decoupled. The current BLS request call doesn't support models using the decoupled"
            " transaction policy. Please use 'decoupled=True' argument to the 'exec' or"
            " 'async_exec' calls for decoupled models.'"
        )
        with pytest.raises(InferenceServerException) as caught:
            client.infer("bls_double", [tensor], parameters={"callee": "identity_int32"})
        assert caught.value.message() == (
            "Model identity_int32 - Error when running inference: [request id: <id_unknown>]"
            " inference input 'INPUT0' data-type is 'FP32', but model 'identity_int32' expects"
            " 'INT32'"
        )
        stats = client.get_inference_statistics("identity_fp32")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] >= 3  # the callee's own scheduler
    finally:
        client.close()


def test_a_bls_call_timeout_is_the_callee_queues_business(stream_server: RunningServer) -> None:
    """As in Triton, a BLS request's timeout is the request's queue timeout: a callee without
    a queue policy that lets it apply runs the call however long it takes, one whose policy
    does (REJECT, a default timeout that allow_timeout_override lets it shorten) refuses a call
    that waited in its queue too long."""
    client = httpclient.InferenceServerClient(stream_server.http_url, concurrency=2)
    try:
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        # sleeper takes 0.5 s, far past the 1 µs asked for: no queue policy, no timeout.
        result = client.infer("bls_timeout", [tensor], parameters={"timeout_us": 1})
        assert result.as_numpy("SEEN_PARALLEL").shape == (1,)

        # queued_sleeper has one instance, 0.5 s per call: of two calls made at once (by the
        # two instances of bls_timeout) with a 20 ms timeout, one runs and the other expires
        # in its queue, whichever comes first.
        calls = [
            client.async_infer(
                "bls_timeout",
                [tensor],
                parameters={"callee": "queued_sleeper", "timeout_us": 20_000},
            )
            for _ in range(2)
        ]
        outcomes = []
        for call in calls:
            try:
                outcomes.append(call.get_result().as_numpy("SEEN_PARALLEL").tolist())
            except InferenceServerException as error:
                outcomes.append(error.message())
        assert sorted(outcomes, key=str) == ["Request timeout expired", [1]]
    finally:
        client.close()


# -- python_backend's decoupled examples, and the custom_repeat example client --------------------
def uint32_input(name: str, values: list[int]) -> Any:
    tensor = grpcclient.InferInput(name, [len(values)], "UINT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.uint32))
    return tensor


def test_custom_repeat_client_gets_every_response_in_order(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """What tritonclient's ``simple_grpc_custom_repeat.py`` checks, with shorter delays: ten
    responses OUT = IN[i], in order, and no empty final reply (it did not ask for one)."""
    values = list(range(100, 110))
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        grpc_client.async_stream_infer(
            "repeat_example",
            [int32_input(values), uint32_input("DELAY", [5] * 10), uint32_input("WAIT", [20])],
        )
        received = [replies.get(timeout=WAIT_S) for _ in values]
    finally:
        grpc_client.stop_stream()  # waits for the stream's end: nothing else came
    assert all(error is None for _, error in received)
    assert [int(r.as_numpy("OUT")[0]) for r, _ in received] == values
    assert [int(r.as_numpy("IDX")[0]) for r, _ in received] == list(range(10))
    assert [final_flag(r) for r, _ in received] == [False] * 10
    assert replies.empty()


def test_repeat_example_errors_keep_the_stream_open(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        grpc_client.async_stream_infer(
            "repeat_example",
            [int32_input([1, 2]), uint32_input("DELAY", [1]), uint32_input("WAIT", [0])],
            request_id="bad",
        )
        _, error = replies.get(timeout=WAIT_S)
        assert error is not None and "IN and DELAY must have the same shape" in error.message()
        grpc_client.async_stream_infer(
            "repeat_example",
            [int32_input([7]), uint32_input("DELAY", [0]), uint32_input("WAIT", [0])],
        )
        result, error = replies.get(timeout=WAIT_S)
        assert error is None and int(result.as_numpy("OUT")[0]) == 7
    finally:
        grpc_client.stop_stream()


def test_square_example_sends_in_responses_then_a_final_flag(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """As python_backend's square client checks: IN responses of OUT = IN for each request
    (none for 0), then one empty final reply each when asked for."""
    counts = [4, 2, 0, 1, 3]
    replies = stream_replies(
        grpc_client,
        [("square_int32", [count], {}) for count in counts],
        expected=sum(counts) + len(counts),
        enable_empty_final_response=True,
    )
    assert all(error is None for _, error in replies)
    by_request: dict[str, list[Any]] = {}
    for result, _ in replies:
        by_request.setdefault(result.get_response().id, []).append(result)
    for index, count in enumerate(counts):
        results = by_request[f"r{index}"]
        assert [final_flag(r) for r in results] == [False] * count + [True]
        assert [int(r.as_numpy("OUT")[0]) for r in results[:-1]] == [count] * count
        assert results[-1].as_numpy("OUT") is None


@pytest.mark.parametrize("model", ["square_int32", "square_proc"], ids=["in-process", "worker"])
def test_square_example_failing_execute_answers_with_its_error(
    grpc_client: grpcclient.InferenceServerClient, model: str
) -> None:
    replies = stream_replies(grpc_client, [(model, [-1], {})], expected=1)
    ((_, error),) = replies
    assert error is not None and "IN must be non-negative" in error.message()
