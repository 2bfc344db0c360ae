"""The core's request path against the reference path, whole answers compared: the same
requests, generated for every datatype (HTTP: JSON and binary data, outputs named or not,
binary or JSON answers; gRPC: raw contents, typed contents; ids, priorities, valid and
invalid), sent over real sockets to a server whose core answers them and to one with
``--backend-config=python,core-path=off``, must get the same status, headers and bytes."""

from __future__ import annotations

import concurrent.futures
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._proto import grpc_service_pb2 as pb

from tests.conftest import TEST_MODELS, RunningServer
from tests.e2e.corepair import (
    Connection,
    binary_request,
    grpc_answer,
    same_answers,
    server_pair,
)

DATATYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "fp16",
    "FP32": "fp32",
    "FP64": "fp64",
    "BF16": "bf16",
    "BYTES": "bytes",
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    logs = tmp_path_factory.mktemp("core_path")
    yield from server_pair([TEST_MODELS], logs)


def _values(datatype: str, count: int, draw: Any) -> Any:
    if datatype == "BYTES":
        return draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
    if datatype == "BOOL":
        return np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)))
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        width = {"FP16": 16, "FP32": 32, "FP64": 64, "BF16": 32}[datatype]
        floats = st.floats(width=width, allow_nan=False)
        values = np.array(draw(st.lists(floats, min_size=count, max_size=count)), np.float64)
        if datatype == "BF16":  # representable values only: the raw bits' top half
            bits = values.astype(np.float32).view(np.uint32) & 0xFFFF0000
            return bits.view(np.float32)
        return values.astype(f"float{width}")
    dtype = np.dtype(datatype.lower())
    info = np.iinfo(dtype)
    ints = st.integers(int(info.min), int(info.max))
    return np.array(draw(st.lists(ints, min_size=count, max_size=count)), dtype)


def _raw(datatype: str, values: Any) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    if datatype == "BF16":
        return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    return np.asarray(values).tobytes()


def _json(datatype: str, values: Any) -> list[Any]:
    if datatype == "BYTES":
        return [v.decode("latin-1") for v in values]
    return np.asarray(values, np.float64 if datatype == "BF16" else None).tolist()


@st.composite
def requests(draw: Any) -> tuple[str, bytes, dict[str, str]]:
    """A request to one of the identity models, as its path, body and headers."""
    datatype = draw(st.sampled_from(sorted(DATATYPES)))
    shape = [draw(st.integers(1, 3)), draw(st.integers(0, 4))]
    if draw(st.integers(0, 15)) == 0:  # a shape the model refuses
        shape = [shape[1]]
    values = _values(datatype, int(np.prod(shape)), draw)
    entry: dict[str, Any] = {"name": "INPUT0", "datatype": datatype, "shape": shape}
    binary = draw(st.booleans())
    tail = b""
    if binary:
        tail = _raw(datatype, values)
        entry["parameters"] = {"binary_data_size": len(tail)}
    else:
        entry["data"] = _json(datatype, values)
    doc: dict[str, Any] = {"inputs": [entry]}
    if draw(st.booleans()):
        doc["id"] = draw(st.sampled_from(["1", "request-7", 'quote"d']))
    parameters: dict[str, Any] = {}
    if draw(st.booleans()):
        parameters["binary_data_output"] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        parameters["priority"] = draw(st.integers(0, 3))
    if parameters:
        doc["parameters"] = parameters
    if draw(st.booleans()):
        output: dict[str, Any] = {"name": draw(st.sampled_from(["OUTPUT0", "OUTPUT0", "NOPE"]))}
        if draw(st.booleans()):
            output["parameters"] = {"binary_data": draw(st.booleans())}
        doc["outputs"] = [output]
    header = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers = {"Inference-Header-Content-Length": str(len(header))}
    path = f"/v2/models/identity_{DATATYPES[datatype]}/infer"
    return path, header + tail, headers


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(requests())
def test_the_core_answers_as_the_reference_path(
    connections: tuple[Connection, Connection], request: tuple[str, bytes, dict[str, str]]
) -> None:
    core, reference = connections
    assert core.ask(*request) == reference.ask(*request)


@st.composite
def generate_requests(draw: Any) -> tuple[str, bytes, dict[str, str]]:
    """A ``generate`` request (the generate extension's flat JSON object) to one of the
    identity models, as its path, body and headers: the input as an array, a scalar, nested
    or inside ``parameters``, or missing; parameters of every kind and some of none."""
    datatype = draw(st.sampled_from(sorted(DATATYPES)))
    values = _json(datatype, _values(datatype, draw(st.integers(0, 4)), draw))
    body: dict[str, Any] = {}
    where = draw(st.integers(0, 9))
    if where == 1 and values:
        body["INPUT0"] = values[0]
    elif where == 2:
        body["parameters"] = {"INPUT0": values}
    elif where == 3:
        body["INPUT0"] = [values]
    elif where > 3:
        body["INPUT0"] = values
    if draw(st.booleans()):
        body["id"] = draw(st.sampled_from(["g1", 'q"d', "é"]))
    kinds = st.one_of(
        st.integers(-3, 2**33),
        st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
        st.text("ab é", max_size=2),
        st.none(),
    )
    names = st.sampled_from(["max_tokens", "temperature", "priority", "stop"])
    body.update(draw(st.dictionaries(names, kinds, max_size=2)))
    text = json.dumps(body, ensure_ascii=draw(st.booleans()))
    path = f"/v2/models/identity_{DATATYPES[datatype]}/generate"
    return path, text.encode(), {"Content-Type": "application/json"}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(generate_requests())
def test_generate_requests_get_the_reference_answers(
    connections: tuple[Connection, Connection], request: tuple[str, bytes, dict[str, str]]
) -> None:
    """``generate`` bodies the core decodes itself (and answers with the generate
    extension's JSON) against the reference path's decoder and encoder."""
    core, reference = connections
    assert core.ask(*request) == reference.ask(*request)


@pytest.mark.parametrize("count", [1 << 18, 3 << 18])
def test_large_bodies_get_the_reference_answers(
    connections: tuple[Connection, Connection], count: int
) -> None:
    """Bodies large enough to be received into a buffer of their own (1 and 3 MiB) go to
    the core once they have arrived: the same answers, several in a row on one connection."""
    values = np.arange(count, dtype=np.float32)
    for named in (False, True):
        doc: dict[str, Any] = {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, count],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
        if named:
            doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
        header = json.dumps(doc).encode()
        request = (
            "/v2/models/identity_fp32/infer",
            header + values.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))},
        )
        core, reference = connections
        answer = core.ask(*request)
        assert answer[0] == b"HTTP/1.1 200 OK"
        assert answer == reference.ask(*request)


@pytest.mark.parametrize("binary", [True, False])
def test_outputs_that_are_views_of_large_inputs_get_the_reference_answers(
    connections: tuple[Connection, Connection], binary: bool
) -> None:
    """Large inputs are read by the worker where the body was received, and outputs that are
    views of them (the input itself; one without its first element, at an offset) are answered
    from the body: the same answers as the reference path's, binary and JSON, beside an output
    of new memory, several in a row on one connection."""
    for round_ in range(3):
        a = (np.arange(1 << 16, dtype=np.float32) + round_) / 3
        b = (np.arange(150_001 + round_) % 60_000 - 30_000).astype(np.int16)
        inputs = [("A", "FP32", a.reshape(1, -1)), ("B", "INT16", b.reshape(1, -1))]
        outputs = [
            {"name": name, "parameters": {"binary_data": binary}}
            for name in ("TAIL", "SAME", "TWICE")
        ]
        same_answers(connections, binary_request("body_views", inputs, outputs))


def test_concurrent_requests_get_their_own_inputs_back(servers: tuple[RunningServer, ...]) -> None:
    """Requests batched together, each body received into an object of its own: each answer
    holds its own request's tensors (the views answered from the right body)."""
    count = 8

    def ask(index: int) -> None:
        client = httpclient.InferenceServerClient(servers[0].http_url)
        try:
            a = np.full((1, 1 << 16), index, np.float32)
            b = np.arange(index, index + 140_000, dtype=np.int16).reshape(1, -1)
            inputs = [
                httpclient.InferInput("A", a.shape, "FP32"),
                httpclient.InferInput("B", b.shape, "INT16"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            for _ in range(4):
                result = client.infer("body_views", inputs)
                np.testing.assert_array_equal(result.as_numpy("SAME"), a)
                np.testing.assert_array_equal(result.as_numpy("TAIL"), b[:, 1:])
                np.testing.assert_array_equal(result.as_numpy("TWICE"), a * 2)
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        for done in [pool.submit(ask, index) for index in range(count)]:
            done.result()


@pytest.mark.parametrize("count", [1 << 18, 3 << 18])
def test_large_grpc_messages_get_the_reference_answers(
    grpc_calls: tuple[Any, Any], count: int
) -> None:
    """Messages large enough to count against the body budget (1 and 3 MiB) go to the core
    as well: the same replies."""
    message = pb.ModelInferRequest(model_name="identity_fp32", id="large")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, count])
    message.raw_input_contents.append(np.arange(count, dtype=np.float32).tobytes())
    data = message.SerializeToString()
    core, reference = grpc_calls
    answer = grpc_answer(core, data)
    assert answer[0] == "ok"
    assert answer == grpc_answer(reference, data)


def _driver_ticks(pid: int) -> int:
    """CPU time (clock ticks) of the core's driver threads."""
    ticks = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == "tritonfast-lane":
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks


def test_the_core_answers_them(
    servers: tuple[RunningServer, ...], connections: tuple[Connection, Connection]
) -> None:
    """What the comparison above compares is the core's work: its driver threads run (and
    the reference server has none)."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    ).encode()
    core, reference = servers
    assert _driver_ticks(reference.proc.pid) == 0
    before = _driver_ticks(core.proc.pid)
    deadline = time.monotonic() + 30
    while _driver_ticks(core.proc.pid) == before:  # a tick is 10 ms of CPU
        assert time.monotonic() < deadline, "the core's driver threads never ran"
        for _ in range(200):
            status, _, _ = connections[0].ask("/v2/models/identity_fp32/infer", body, {})
            assert status == b"HTTP/1.1 200 OK"


# -- gRPC ---------------------------------------------------------------------------------------
@st.composite
def grpc_requests(draw: Any) -> bytes:
    """A ModelInferRequest to one of the identity models, serialized."""
    datatype = draw(st.sampled_from(sorted(DATATYPES)))
    shape = [draw(st.integers(1, 3)), draw(st.integers(0, 4))]
    if draw(st.integers(0, 15)) == 0:  # a shape the model refuses
        shape = [shape[1]]
    values = _values(datatype, int(np.prod(shape)), draw)
    message = pb.ModelInferRequest(model_name=f"identity_{DATATYPES[datatype]}")
    if draw(st.booleans()):
        message.id = draw(st.sampled_from(["1", "request-7", "é"]))
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    if draw(st.integers(0, 10)) == 0:  # typed contents: the reference path's
        tensor.contents.int64_contents.extend([1] * int(np.prod(shape)))
    else:
        message.raw_input_contents.append(_raw(datatype, values))
    if draw(st.integers(0, 8)) == 0:
        message.parameters["priority"].uint64_param = 1
    for name in draw(st.lists(st.sampled_from(["OUTPUT0", "NOPE"]), max_size=2)):
        message.outputs.add(name=name)
    return message.SerializeToString()


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(grpc_requests())
def test_grpc_calls_get_the_reference_paths_answers(
    grpc_calls: tuple[Any, Any], message: bytes
) -> None:
    core, reference = grpc_calls
    assert grpc_answer(core, message) == grpc_answer(reference, message)


STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


def _stream_replies(channel: Any, messages: list[bytes]) -> list[bytes]:
    """Every reply of one ModelStreamInfer stream that sends ``messages``, as sent."""
    call = channel.stream_stream(STREAM_INFER, request_serializer=None, response_deserializer=None)
    return list(call(iter(messages), timeout=60))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(grpc_requests(), min_size=1, max_size=6))
def test_stream_requests_get_the_reference_paths_replies(
    stream_channels: tuple[Any, Any], messages: list[bytes]
) -> None:
    """The same requests on a ModelStreamInfer stream: the core serializes the replies of
    those it takes, in request order with the others."""
    core, reference = stream_channels
    assert _stream_replies(core, messages) == _stream_replies(reference, messages)


@pytest.fixture(scope="module")
def stream_channels(servers: tuple[RunningServer, ...]) -> Iterator[tuple[Any, Any]]:
    channels = tuple(grpc.insecure_channel(s.grpc_url) for s in servers)
    yield channels
    for channel in channels:
        channel.close()


def test_the_core_answers_grpc_calls(
    servers: tuple[RunningServer, ...], grpc_calls: tuple[Any, Any]
) -> None:
    """As HTTP above: gRPC calls the core takes run on its driver threads."""
    message = pb.ModelInferRequest(model_name="identity_fp32")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    message.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
    data = message.SerializeToString()
    before = _driver_ticks(servers[0].proc.pid)
    deadline = time.monotonic() + 30
    while _driver_ticks(servers[0].proc.pid) == before:
        assert time.monotonic() < deadline, "the core's driver threads never ran"
        for _ in range(200):
            reply = pb.ModelInferResponse.FromString(grpc_calls[0](data, timeout=30))
            assert reply.raw_output_contents == [np.array([1, 2], np.float32).tobytes()]
