"""The core's decoder of HTTP inference requests against the reference path (the Python
codec and validator): the same requests, generated valid and invalid, JSON and binary, every
datatype, must get the same answer from both wherever the core answers, and the common ones
must be answered by the core."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonfast._core import InferSignature
from tritonfast._proto import model_config_pb2
from tritonfast.data import rawtensor
from tritonfast.data.datatypes import CONFIG_DATATYPES
from tritonfast.errors import TritonError
from tritonfast.frontends.http import codec
from tritonfast.runtime.lane import signature_of
from tritonfast.runtime.validate import RequestValidator

DIFFERENTIAL = settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
DATATYPES = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
]  # fmt: skip
NAMES = ["INPUT0", "INPUT1", "IN", "OUTPUT0", "x y", "é"]


def signature_config(
    max_batch_size: int, inputs: list[tuple[str, str, list[int], bool]], outputs: list[str]
) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name="model", max_batch_size=max_batch_size)
    for name, datatype, dims, optional in inputs:
        config.input.add(
            name=name, data_type=CONFIG_DATATYPES[datatype], dims=dims, optional=optional
        )
    for name in outputs:
        config.output.add(name=name, data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    return config


def core_signature(config: model_config_pb2.ModelConfig) -> InferSignature:
    return signature_of(config)


def reference(config: model_config_pb2.ModelConfig, body: bytes, json_length: int) -> Any:
    """What the server's reference path makes of the body: ``("error", code, message)`` or
    ``("ok", request, binary_default, batch_size)``."""
    try:
        request, binary_default = codec.decode_infer_request(body, json_length, config.name)
        batch_size = RequestValidator(config).check(request)
    except TritonError as error:
        return ("error", error.code.name, error.message)
    return ("ok", request, binary_default, batch_size)


def assert_agree(config: model_config_pb2.ModelConfig, body: bytes, json_length: int) -> bool:
    """Asserts the core and the reference path agree on ``body``; whether the core answered."""
    expected = reference(config, body, json_length)
    try:
        decoded = core_signature(config).decode_http(body, json_length)
    except TritonError as error:
        assert expected == ("error", error.code.name, error.message)
        return True
    if decoded is None:
        return False
    assert expected[0] == "ok", expected
    _, request, binary_default, batch_size = expected
    request_id, inputs, outputs, core_binary_default, priority, timeout, core_batch = decoded
    assert request_id == request.id
    assert core_binary_default == binary_default
    assert core_batch == batch_size
    assert [(n, d, s) for n, d, s, _ in inputs] == [
        (t.name, t.datatype, tuple(t.shape)) for t in request.inputs
    ]
    for (_, datatype, _, raw), tensor in zip(inputs, request.inputs, strict=True):
        assert raw == bytes(rawtensor.to_raw(datatype, tensor.data))
        assert not tensor.parameters
    wanted = None
    if request.outputs is not None:
        wanted = [(o.name, o.parameters.get("binary_data", False) is True) for o in request.outputs]
    assert outputs == wanted
    assert request.parameters == {
        k: v for k, v in (("priority", priority), ("timeout", timeout)) if v is not None
    }
    return True


# -- generated requests ---------------------------------------------------------------------
@st.composite
def signatures(draw: Any) -> model_config_pb2.ModelConfig:
    count = draw(st.integers(1, 3))
    names = draw(st.lists(st.sampled_from(NAMES[:4]), min_size=count, max_size=count, unique=True))
    inputs = [
        (
            name,
            draw(st.sampled_from(DATATYPES)),
            draw(st.lists(st.sampled_from([-1, 1, 2, 3]), min_size=0, max_size=2)),
            draw(st.booleans()) and k > 0,
        )
        for k, name in enumerate(names)
    ]
    return signature_config(draw(st.sampled_from([0, 4])), inputs, ["OUTPUT0", "OUTPUT1"])


def element_values(datatype: str, count: int, draw: Any) -> np.ndarray | list[bytes]:
    if datatype == "BYTES":
        return draw(st.lists(st.binary(max_size=5), min_size=count, max_size=count))
    dtype = np.dtype(np.uint16) if datatype == "BF16" else codec.NUMPY_DTYPES[datatype]
    if dtype.kind == "b":
        return np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype)
    if dtype.kind == "f":
        floats = st.floats(allow_nan=False, allow_infinity=False, width=dtype.itemsize * 8)
        return np.array(draw(st.lists(floats, min_size=count, max_size=count)), dtype)
    info = np.iinfo(dtype)
    ints = st.integers(int(info.min), int(info.max))
    return np.array(draw(st.lists(ints, min_size=count, max_size=count)), dtype)


def raw_of(datatype: str, values: Any) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    return np.asarray(values).tobytes()


def json_of(datatype: str, values: Any) -> list[Any]:
    if datatype == "BYTES":
        return [v.decode("latin-1") for v in values]
    return np.asarray(values).tolist()


@st.composite
def requests(draw: Any, config: model_config_pb2.ModelConfig) -> tuple[bytes, int]:
    """A request for ``config``'s model: mostly right, now and then wrong in one of the ways
    clients get it wrong, as a body and its JSON header's length."""
    batch = draw(st.sampled_from([1, 2])) if config.max_batch_size else None
    entries: list[dict[str, Any]] = []
    binary_parts: list[bytes] = []
    specs = [s for s in config.input if not s.optional or draw(st.booleans())]
    if draw(st.integers(0, 9)) == 0:  # an input too many, or one left out
        specs = specs[1:] if draw(st.booleans()) else [*specs, specs[0]]
    for spec in specs:
        datatype = {v: k for k, v in CONFIG_DATATYPES.items()}[spec.data_type]
        if draw(st.integers(0, 12)) == 0:
            datatype = draw(st.sampled_from(DATATYPES))
        shape = [d if d >= 0 else draw(st.integers(0, 3)) for d in spec.dims]
        if batch is not None:
            shape = [batch, *shape]
        if draw(st.integers(0, 12)) == 0:
            shape = draw(st.lists(st.integers(0, 3), max_size=3))
        count = int(np.prod(shape)) if shape else 1
        values = element_values(datatype, count, draw)
        name = spec.name if draw(st.integers(0, 15)) else draw(st.sampled_from(NAMES))
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if draw(st.booleans()):
            raw = raw_of(datatype, values)
            if draw(st.integers(0, 15)) == 0:
                raw = raw[:-1] if raw else b"\0"
            entry["parameters"] = {"binary_data_size": len(raw)}
            binary_parts.append(raw)
        else:
            entry["data"] = json_of(datatype, values)
        if draw(st.integers(0, 20)) == 0:
            entry.setdefault("parameters", {})["shared_memory_region"] = "r"
        entries.append(entry)
    doc: dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        doc["id"] = draw(st.sampled_from(["", "7", "req-1"]))
    parameters: dict[str, Any] = {}
    for key, values in (
        ("binary_data_output", st.booleans()),
        ("priority", st.integers(0, 3)),
        ("timeout", st.integers(0, 10**6)),
        ("custom", st.integers(-(2**63), 2**63 - 1)),
    ):
        if draw(st.integers(0, 4)) == 0:
            parameters[key] = draw(values)
    if parameters:
        doc["parameters"] = parameters
    if draw(st.booleans()):
        doc["outputs"] = [
            {"name": name, "parameters": {"binary_data": draw(st.booleans())}}
            if draw(st.booleans())
            else {"name": name}
            for name in draw(st.lists(st.sampled_from(["OUTPUT0", "OUTPUT1", "NOPE"]), max_size=2))
        ]
    header = orjson.dumps(doc)
    return header + b"".join(binary_parts), len(header)


@DIFFERENTIAL
@given(st.data())
def test_the_core_answers_as_the_reference_path(data: st.DataObject) -> None:
    config = data.draw(signatures())
    body, json_length = data.draw(requests(config))
    event("answered by the core" if assert_agree(config, body, json_length) else "reference")


@DIFFERENTIAL
@given(st.binary(max_size=200), st.integers(0, 220))
def test_any_bytes_get_the_reference_paths_answer_or_go_there(
    body: bytes, json_length: int
) -> None:
    config = signature_config(4, [("INPUT0", "FP32", [-1], False)], ["OUTPUT0"])
    assert_agree(config, body, min(json_length, len(body)))


IDENTITY = signature_config(64, [("INPUT0", "FP32", [-1], False)], ["OUTPUT0"])


@pytest.mark.parametrize(
    "doc",
    [
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]},
        {
            "id": "a",
            "parameters": {"binary_data_output": True, "priority": 1, "timeout": 5},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 1], "data": [[1], [2]]}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        },
        {"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1, 1], "data": [1]}]},
        {"inputs": [{"name": "INPUT1", "datatype": "FP32", "shape": [1, 1], "data": [1]}]},
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [65, 1], "data": [1] * 65}]},
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}] * 2},
        {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1]}],
            "outputs": [{"name": "NOPE"}],
        },
    ],
)
def test_the_core_answers_the_common_requests(doc: dict[str, Any]) -> None:
    header = orjson.dumps(doc)
    assert assert_agree(IDENTITY, header, len(header))


def test_the_core_takes_binary_inputs() -> None:
    raw = np.arange(6, dtype=np.float32).tobytes()
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [2, 3],
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    header = orjson.dumps(doc)
    assert assert_agree(IDENTITY, header + raw, len(header))
