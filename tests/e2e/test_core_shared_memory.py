"""Requests naming system shared-memory regions, through the core and through the reference
path: generated HTTP bodies and gRPC messages whose inputs lie in a region (every datatype,
small and large enough for the worker to read them in the client's object, sizes and offsets
right and wrong, regions unknown) and whose outputs go to one (windows large enough or too
small), sent to a server whose core takes them and to one with
``--backend-config=python,core-path=off``. Both get the same input region; each has its own
output region under the same name. The answers (status, headers, bytes) and what each server
wrote into its output region must be the same."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

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
from tests.e2e.test_core_path import DATATYPES, _raw, _values

# The worker reads and writes tensors from this size on in the client's object itself.
PLACED_BYTES = 256 * 1024
REGION_BYTES = 2 * PLACED_BYTES
# The input region starts this far into its object.
INPUT_OFFSET = 4096
FLOATS = {"FP16": "float16", "FP32": "float32", "FP64": "float64", "BF16": "float32"}


class SharedObject:
    """A POSIX shared-memory object of the test's, read and written as a file."""

    def __init__(self, size: int) -> None:
        self.key = f"/tf-coreshm-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.path = f"/dev/shm{self.key}"
        self.size = size
        with open(self.path, "wb") as file:
            file.truncate(size)

    def write(self, offset: int, data: bytes) -> None:
        with open(self.path, "r+b") as file:
            file.seek(offset)
            file.write(data)

    def read(self) -> bytes:
        with open(self.path, "rb") as file:
            return file.read()

    def clear(self) -> None:
        self.write(0, bytes(self.size))

    def remove(self) -> None:
        os.unlink(self.path)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    logs = tmp_path_factory.mktemp("core_shared_memory")
    yield from server_pair([TEST_MODELS], logs)


@pytest.fixture(scope="module")
def objects(servers: tuple[RunningServer, ...]) -> Iterator[tuple[SharedObject, ...]]:
    """The input object (region "in" on both servers, from INPUT_OFFSET; region "low" is its
    first 64 bytes) and each server's output object (its region "out")."""
    inputs = SharedObject(INPUT_OFFSET + REGION_BYTES)
    outputs = [SharedObject(REGION_BYTES) for _ in servers]
    for server, output in zip(servers, outputs, strict=True):
        client = httpclient.InferenceServerClient(server.http_url)
        client.register_system_shared_memory("in", inputs.key, REGION_BYTES, INPUT_OFFSET)
        client.register_system_shared_memory("low", inputs.key, 64)
        client.register_system_shared_memory("out", output.key, REGION_BYTES)
        client.close()
    yield inputs, *outputs
    for shared in (inputs, *outputs):
        shared.remove()


@st.composite
def tensors(draw: Any) -> tuple[str, list[int], bytes]:
    """An input for one of the identity models: its datatype, shape and wire bytes; now and
    then large enough to be placed."""
    datatype = draw(st.sampled_from(sorted(DATATYPES)))
    if datatype not in ("BYTES", "BOOL") and draw(st.integers(0, 5)) == 0:
        # Too many values for hypothesis to draw: numbers from a drawn seed.
        rng = np.random.default_rng(draw(st.integers(0, 2**32)))
        dtype = np.dtype(FLOATS.get(datatype, datatype.lower()))
        count = PLACED_BYTES // (2 if datatype == "BF16" else dtype.itemsize)
        count += draw(st.integers(0, 3))
        if dtype.kind == "f":
            values: Any = rng.standard_normal(count).astype(dtype)
        else:
            info = np.iinfo(dtype)
            values = rng.integers(info.min, info.max, count, dtype, endpoint=True)
        return datatype, [1, count], _raw(datatype, values)
    shape = [1, draw(st.integers(0, 5))]
    values = _values(datatype, int(np.prod(shape)), draw)
    return datatype, shape, _raw(datatype, values)


@st.composite
def windows(draw: Any, size: int, output: bool) -> tuple[str, int, int]:
    """A region, offset and byte size for a tensor of ``size`` bytes: mostly right; now and
    then too small or too large, out of the region, or in a region nobody registered."""
    region = "out" if output else "in"
    offset = draw(st.sampled_from([0, 8, 100]))
    byte_size = size
    match draw(st.integers(0, 12)):
        case 0:
            byte_size = max(0, size - 1)
        case 1:
            byte_size = size + 4
        case 2:
            region = "nope"
        case 3:
            region = "low"
        case 4:
            offset = REGION_BYTES - 1
    return region, offset, byte_size


def _window_parameters(window: tuple[str, int, int]) -> dict[str, Any]:
    region, offset, byte_size = window
    parameters: dict[str, Any] = {
        "shared_memory_region": region,
        "shared_memory_byte_size": byte_size,
    }
    if offset:
        parameters["shared_memory_offset"] = offset
    return parameters


@st.composite
def exchanges(draw: Any) -> tuple[str, list[int], bytes, tuple | None, tuple | None]:
    """An input (in a region, or not) and where its output goes (a region, or not)."""
    datatype, shape, raw = draw(tensors())
    into = draw(windows(len(raw), False)) if draw(st.integers(0, 5)) else None
    out = draw(windows(len(raw), True)) if draw(st.integers(0, 3)) else None
    return datatype, shape, raw, into, out


def _place_input(objects: tuple[SharedObject, ...], raw: bytes, into: tuple | None) -> None:
    if into is not None and into[0] == "in" and into[1] + len(raw) <= REGION_BYTES:
        objects[0].write(INPUT_OFFSET + into[1], raw)


def _outputs_agree(objects: tuple[SharedObject, ...]) -> None:
    core, reference = objects[1], objects[2]
    assert core.read() == reference.read()
    core.clear()
    reference.clear()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(exchanges(), st.booleans(), st.booleans())
def test_http_requests_naming_regions_get_the_reference_answers(
    connections: tuple[Connection, Connection],
    objects: tuple[SharedObject, ...],
    exchange: tuple[str, list[int], bytes, tuple | None, tuple | None],
    binary: bool,
    named_with_id: bool,
) -> None:
    datatype, shape, raw, into, out = exchange
    _place_input(objects, raw, into)
    entry: dict[str, Any] = {"name": "INPUT0", "datatype": datatype, "shape": shape}
    tail = b""
    if into is not None:
        entry["parameters"] = _window_parameters(into)
    else:
        tail = raw
        entry["parameters"] = {"binary_data_size": len(raw)}
    doc: dict[str, Any] = {"inputs": [entry]}
    if named_with_id:
        doc["id"] = "shm-1"
    if out is not None:
        output_parameters = _window_parameters(out)
        if binary:
            output_parameters["binary_data"] = False
        doc["outputs"] = [{"name": "OUTPUT0", "parameters": output_parameters}]
    elif binary:
        doc["parameters"] = {"binary_data_output": True}
    header = json.dumps(doc).encode()
    request = (
        f"/v2/models/identity_{DATATYPES[datatype]}/infer",
        header + tail,
        {"Inference-Header-Content-Length": str(len(header))},
    )
    core, reference = connections
    assert core.ask(*request) == reference.ask(*request)
    _outputs_agree(objects)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(exchanges(), st.booleans())
def test_grpc_calls_naming_regions_get_the_reference_answers(
    grpc_calls: tuple[Any, Any],
    objects: tuple[SharedObject, ...],
    exchange: tuple[str, list[int], bytes, tuple | None, tuple | None],
    named_with_id: bool,
) -> None:
    datatype, shape, raw, into, out = exchange
    _place_input(objects, raw, into)
    message = pb.ModelInferRequest(model_name=f"identity_{DATATYPES[datatype]}")
    if named_with_id:
        message.id = "shm-1"
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    if into is not None:
        region, offset, byte_size = into
        tensor.parameters["shared_memory_region"].string_param = region
        tensor.parameters["shared_memory_byte_size"].int64_param = byte_size
        if offset:
            tensor.parameters["shared_memory_offset"].int64_param = offset
    else:
        message.raw_input_contents.append(raw)
    if out is not None:
        region, offset, byte_size = out
        output = message.outputs.add(name="OUTPUT0")
        output.parameters["shared_memory_region"].string_param = region
        output.parameters["shared_memory_byte_size"].int64_param = byte_size
        if offset:
            output.parameters["shared_memory_offset"].int64_param = offset
    data = message.SerializeToString()
    core, reference = grpc_calls
    assert grpc_answer(core, data) == grpc_answer(reference, data)
    _outputs_agree(objects)


def test_a_request_naming_regions_is_answered_through_them(
    connections: tuple[Connection, Connection], objects: tuple[SharedObject, ...]
) -> None:
    """The everyday case, spelled out: the input read from its region, the output written
    into the core server's region and named in the answer without data."""
    values = np.arange(8, dtype=np.float32)
    objects[0].write(INPUT_OFFSET, values.tobytes())
    window = {"shared_memory_region": "out", "shared_memory_byte_size": 32}
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [1, 8],
                "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 32},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": window}],
    }
    status, _, body = connections[0].ask(
        "/v2/models/identity_fp32/infer", json.dumps(doc).encode(), {}
    )
    assert status == b"HTTP/1.1 200 OK"
    assert json.loads(body)["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 8]}]
    assert objects[1].read()[:32] == values.tobytes()
    objects[1].clear()


def test_an_output_lying_in_its_body_goes_into_its_region(
    connections: tuple[Connection, Connection], objects: tuple[SharedObject, ...]
) -> None:
    """An input large enough to be read where the body was received, and an output that is
    a view of it (input B without its first element), too small for the worker to write into
    the client's object itself: the core copies it from the body into the region, as the
    reference path writes it there."""
    b = (np.arange(PLACED_BYTES // 2) % 60_000 - 30_000).astype(np.int16)
    a = np.arange(4, dtype=np.float32)
    window = {"shared_memory_region": "out", "shared_memory_byte_size": b.nbytes - 2}
    inputs = [("A", "FP32", a.reshape(1, -1)), ("B", "INT16", b.reshape(1, -1))]
    outputs = [{"name": "TAIL", "parameters": window}, {"name": "SAME"}]
    same_answers(connections, binary_request("body_views", inputs, outputs))
    assert objects[1].read()[: b.nbytes - 2] == b[1:].tobytes()
    _outputs_agree(objects)
