"""Decoupled models on the core's path against the reference path: the same generated
``ModelStreamInfer`` streams (requests to models in worker processes that send their responses
from ``execute``, from threads after it returned, or from coroutines; valid and refused ones,
with and without empty final replies) sent to a server whose core runs the models and
serializes their responses, and to one with ``--backend-config=python,core-path=off``: each
request must get the same replies, byte for byte, in the same order (the replies of different
requests interleave as their models send them). The same for ``generate_stream``, whose
events the core's reader threads write on the connection themselves: the same status, head
fields and events, one request after another on one keep-alive connection."""

from __future__ import annotations

import http.client
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._proto import grpc_service_pb2 as pb

from tests.conftest import ROOT, RunningServer
from tests.e2e.corepair import server_pair

STREAMING_MODELS = ROOT / "tests" / "models_streaming"
# repeat_proc: responses from a thread after execute returned; async_repeat_proc: from a
# coroutine (a negative value: an error response; no value: no final flag ever, so never
# sent); square_proc: from execute itself.
MODELS = ("repeat_proc", "async_repeat_proc", "square_proc")
# typed_events_proc: responses of FP32, BYTES and BOOL outputs with parameters of every kind
# (generate_stream only).
EVENT_MODELS = (*MODELS, "typed_events_proc")
# queued_stream_proc: one instance held HOLD seconds per request, behind a queue whose requests
# time out after 50 ms.
QUEUED_MODEL = "queued_stream_proc"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    repository = tmp_path_factory.mktemp("decoupled_models")
    for model in (*EVENT_MODELS, QUEUED_MODEL):
        shutil.copytree(STREAMING_MODELS / model, repository / model)
    yield from server_pair([repository], tmp_path_factory.mktemp("core_streams"))


@pytest.fixture(scope="module")
def channels(servers: tuple[RunningServer, ...]) -> Iterator[tuple[Any, Any]]:
    opened = tuple(grpc.insecure_channel(s.grpc_url) for s in servers)
    yield opened
    for channel in opened:
        channel.close()


@st.composite
def stream_request(draw: Any, index: int) -> bytes:
    model = draw(st.sampled_from(MODELS))
    least = 0 if model == "repeat_proc" else 1
    count = 1 if model == "square_proc" else draw(st.integers(least, 5))
    if draw(st.integers(0, 9)) == 0:  # a shape the model refuses
        count += 1 if count == 1 else 0
    datatype = "INT64" if draw(st.integers(0, 14)) == 0 else "INT32"  # (refused too)
    values = np.array(
        draw(st.lists(st.integers(-1, 50), min_size=count, max_size=count)),
        np.int32 if datatype == "INT32" else np.int64,
    )
    message = pb.ModelInferRequest(model_name=model, id=f"r{index}")
    message.inputs.add(name="IN", datatype=datatype, shape=[count])
    message.raw_input_contents.append(values.tobytes())
    if draw(st.integers(0, 3)) == 0:
        message.parameters["triton_enable_empty_final_response"].bool_param = True
    if draw(st.booleans()):
        message.outputs.add(name=draw(st.sampled_from(["OUT", "OUT", "IDX"])))
    return message.SerializeToString()


@st.composite
def streams(draw: Any) -> list[bytes]:
    size = draw(st.integers(1, 5))
    return [draw(stream_request(index)) for index in range(size)]


def _replies_by_request(channel: Any, messages: list[bytes]) -> dict[str, list[bytes]]:
    """Every reply of one stream that sends ``messages``, as sent, by the request it
    answers."""
    call = channel.stream_stream(STREAM_INFER, request_serializer=None, response_deserializer=None)
    replies: dict[str, list[bytes]] = {}
    for reply in call(iter(messages), timeout=60):
        request_id = pb.ModelStreamInferResponse.FromString(reply).infer_response.id
        replies.setdefault(request_id, []).append(reply)
    return replies


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(streams())
def test_decoupled_streams_get_the_reference_paths_replies(
    channels: tuple[Any, Any], messages: list[bytes]
) -> None:
    core, reference = channels
    assert _replies_by_request(core, messages) == _replies_by_request(reference, messages)


def test_the_core_streams_them(servers: tuple[RunningServer, ...], channels: Any) -> None:
    """What the comparison above compares is the core's work: the core's server reads its
    workers' responses on reader threads of the core's (the reference server has none)."""
    message = pb.ModelInferRequest(model_name="repeat_proc", id="x")
    message.inputs.add(name="IN", datatype="INT32", shape=[3])
    message.raw_input_contents.append(np.array([1, 2, 3], np.int32).tobytes())
    replies = _replies_by_request(channels[0], [message.SerializeToString()])
    assert len(replies["x"]) == 3
    core, reference = servers
    assert _reader_threads(core.proc.pid) == len(EVENT_MODELS) + 1  # (and QUEUED_MODEL)
    assert _reader_threads(reference.proc.pid) == 0


def _reader_threads(pid: int) -> int:
    """The core's threads reading decoupled models' workers."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return sum((task / "comm").read_text().strip() == "tritonfast-read" for task in tasks)


@st.composite
def generate_body(draw: Any) -> tuple[str, bytes]:
    """A ``generate_stream`` request: (model, JSON body); negative values make
    async_repeat_proc answer with error responses, a first one included."""
    model = draw(st.sampled_from(EVENT_MODELS))
    if model == "typed_events_proc":
        floats = st.floats(allow_nan=False, allow_infinity=False, width=32)
        body: dict[str, Any] = {"X": draw(st.lists(floats, max_size=4))}
        if draw(st.booleans()):
            body["id"] = f"t{draw(st.integers(0, 9))}"
        # Parameters of every kind, some in the nested object, priority among them.
        values = st.one_of(
            st.integers(-5, 2**40), floats, st.booleans(), st.text("ab é", max_size=3)
        )
        names = st.sampled_from(["max_tokens", "temperature", "stop", "priority", "id"])
        for name, value in draw(st.dictionaries(names, values, max_size=3)).items():
            body[name] = value
        nested = draw(st.dictionaries(names, values, max_size=2))
        if nested:
            body["parameters"] = nested
        # Non-ASCII text as UTF-8, escaped, or (not UTF-8 at all) as Latin-1.
        encoding = draw(st.sampled_from(["utf-8", "utf-8", "ascii", "latin-1"]))
        text = json.dumps(body, ensure_ascii=encoding == "ascii")
        return model, text.encode(encoding)
    if model == "square_proc":
        value: Any = draw(st.integers(-1, 4))
    else:
        value = draw(
            st.lists(st.integers(-2, 30), min_size=0 if model == "repeat_proc" else 1, max_size=5)
        )
    body = {"IN": value}
    if draw(st.booleans()):
        body["id"] = f"g{draw(st.integers(0, 9))}"
    return model, json.dumps(body).encode()


def _generate_stream(
    connection: http.client.HTTPConnection, model: str, body: bytes
) -> tuple[Any, ...]:
    connection.request("POST", f"/v2/models/{model}/generate_stream", body)
    reply = connection.getresponse()
    return (
        reply.status,
        reply.getheader("Content-Type"),
        reply.getheader("Transfer-Encoding"),
        reply.read(),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(generate_body(), min_size=1, max_size=4))
def test_generate_streams_get_the_reference_paths_events(
    servers: tuple[RunningServer, ...], requests: list[tuple[str, bytes]]
) -> None:
    answers = []
    for server in servers:
        host, port = server.http_url.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            answers.append([_generate_stream(connection, m, b) for m, b in requests])
        finally:
            connection.close()
    core, reference = answers
    assert core == reference


def test_a_generate_stream_whose_queue_timeout_expires_gets_the_reference_answer(
    servers: tuple[RunningServer, ...],
) -> None:
    """A ``generate_stream`` request that waits behind a held instance past its queue's
    timeout (REJECT) is answered before it ever runs: the core writes that whole answer
    itself, as the reference path words it (and as Triton 2.51 answers it); the held request's
    event comes after."""
    answers = []
    for server in servers:
        host, port = server.http_url.rsplit(":", 1)
        held = http.client.HTTPConnection(host, int(port), timeout=60)
        queued = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            held.request("POST", f"/v2/models/{QUEUED_MODEL}/generate_stream", b'{"HOLD":[0.5]}')
            body = b'{"HOLD":[0.0]}'
            expired = _generate_stream(queued, QUEUED_MODEL, body)
            reply = held.getresponse()
            answers.append((expired, reply.status, reply.read()))
        finally:
            held.close()
            queued.close()
    core, reference = answers
    assert core == reference
    (status, content_type, _, body), held_status, held_events = core
    assert (status, content_type) == (400, "text/event-stream; charset=utf-8")
    assert body == b'data: {"error":"Request timeout expired"}\n\n'
    assert held_status == 200
    assert b'"OUT":0.5' in held_events
