"""ONNX Runtime models on the core's request path against the reference path: generated
requests (HTTP JSON and binary data, gRPC raw contents; shapes right and wrong, inputs left
out, outputs named or not) to generated ONNX models of several datatypes, optional inputs,
no batching and a run-time failure, sent over real sockets to a server whose core takes them
(each batch handed to the session by a call, backends/inprocesslane.py) and to one with
``--backend-config=onnxruntime,core-path=off``; the status, headers and bytes must be the
same."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._proto import grpc_service_pb2 as pb

from tests.conftest import RunningServer
from tests.e2e.corepair import (
    Connection,
    binary_request,
    grpc_answer,
    same_answers,
    server_pair,
)
from tests.e2e.test_core_path import _driver_ticks

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
onnx_models = pytest.importorskip("tests.onnx_models", reason="the onnx package is not installed")

MLP = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""
CONTROL_ECHO = """
backend: "onnxruntime"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  direct { }
}
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "X_OUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORR" data_type: TYPE_UINT64 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
SMALL_MLP = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""
# The two MLPs in a row: run by the core when both are on its path.
MLP_CHAIN = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [
  { name: "MID" data_type: TYPE_FP32 dims: [ 8 ] },
  { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "mlp"
      model_version: -1
      input_map { key: "INPUT" value: "IN" }
      output_map { key: "OUTPUT" value: "MID" }
    },
    {
      model_name: "small_mlp"
      model_version: -1
      input_map { key: "INPUT" value: "MID" }
      output_map { key: "OUTPUT" value: "OUT" }
    }
  ]
}
"""
OPTIONAL = """
backend: "onnxruntime"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_FP32 dims: [ -1, 2 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 1, 2 ] optional: true }
]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
"""

# Per model: whether it batches, and its inputs (name, datatype, dims past the batch; -1 any).
MODELS: dict[str, tuple[bool, list[tuple[str, str, list[int]]]]] = {
    "mlp": (True, [("INPUT", "FP32", [16])]),
    "mixed": (
        True,
        [
            ("INT64_IN", "INT64", [4]),
            ("BOOL_IN", "BOOL", [4]),
            ("STR_IN", "BYTES", [2]),
            ("FP16_IN", "FP16", [3]),
            ("UINT8_IN", "UINT8", [5]),
        ],
    ),
    "optional": (False, [("A", "FP32", [-1, 2]), ("B", "FP32", [1, 2])]),
    "fixed": (False, [("X", "FP32", [2, 3])]),
    "reshape_to_four": (True, [("X", "FP32", [-1])]),
    "mlp_chain": (True, [("IN", "FP32", [16])]),
}
OUTPUTS = {
    "mlp": ["OUTPUT"],
    "mixed": ["INT64_OUT", "BOOL_OUT", "STR_OUT", "FP16_OUT", "INT32_OUT", "UINT8_OUT"],
    "optional": ["SUM"],
    "fixed": ["Y"],
    "reshape_to_four": ["Y"],
    "mlp_chain": ["MID", "OUT"],
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    repo = tmp_path_factory.mktemp("core_onnx_repo")
    write = onnx_models.write_onnx
    write(repo, "mlp", onnx_models.mlp(), MLP)
    write(repo, "mixed", onnx_models.mixed_types())
    write(repo, "optional", onnx_models.with_optional_input(), OPTIONAL)
    write(repo, "fixed", onnx_models.fixed_shape())
    write(repo, "reshape_to_four", onnx_models.reshape_to_four())
    write(repo, "control_echo", onnx_models.control_echo(), CONTROL_ECHO)
    write(repo, "small_mlp", onnx_models.mlp(8, 16, 4, seed=1), SMALL_MLP)
    (repo / "mlp_chain" / "1").mkdir(parents=True)
    (repo / "mlp_chain" / "config.pbtxt").write_text(MLP_CHAIN)
    yield from server_pair([Path(repo)], tmp_path_factory.mktemp("core_onnx"), "onnxruntime")


def _values(datatype: str, count: int, draw: Any) -> Any:
    if datatype == "BYTES":
        return draw(st.lists(st.binary(max_size=5), min_size=count, max_size=count))
    if datatype == "BOOL":
        return np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)))
    if datatype in ("FP16", "FP32"):
        width = 16 if datatype == "FP16" else 32
        floats = st.floats(width=width, allow_nan=False, allow_infinity=False)
        return np.array(draw(st.lists(floats, min_size=count, max_size=count)), f"float{width}")
    dtype = np.dtype(datatype.lower())
    info = np.iinfo(dtype)
    return np.array(
        draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=count, max_size=count)),
        dtype,
    )


def _raw(datatype: str, values: Any) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in values)
    return np.asarray(values).tobytes()


def _json(datatype: str, values: Any) -> list[Any]:
    if datatype == "BYTES":
        return [v.decode("latin-1") for v in values]
    return np.asarray(values).tolist()


@st.composite
def tensors(draw: Any) -> tuple[str, list[tuple[str, str, list[int], Any]], list[str] | None]:
    """A model, its inputs (name, datatype, shape, values) and the outputs named (None:
    all): mostly right, now and then a wrong shape or an input left out."""
    model = draw(st.sampled_from(sorted(MODELS)))
    batching, specs = MODELS[model]
    rows = draw(st.integers(1, 3))
    inputs = []
    for name, datatype, dims in specs:
        if model == "optional" and name == "B" and draw(st.booleans()):
            continue  # optional: left out
        shape = [draw(st.integers(1, 3)) if d == -1 else d for d in dims]
        if batching:
            shape = [rows, *shape]
        if draw(st.integers(0, 12)) == 0:  # a shape the model refuses
            shape = [*shape[:-1], shape[-1] + 1]
        values = _values(datatype, int(np.prod(shape)), draw)
        inputs.append((name, datatype, shape, values))
    if inputs and draw(st.integers(0, 15)) == 0:
        inputs.pop(draw(st.integers(0, len(inputs) - 1)))  # a required input left out
    outputs = None
    if draw(st.booleans()):
        outputs = draw(
            st.lists(st.sampled_from([*OUTPUTS[model], "NOPE"]), max_size=2, unique=True)
        )
    return model, inputs, outputs


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(tensors(), st.booleans(), st.booleans())
def test_http_requests_get_the_reference_answers(
    connections: tuple[Connection, Connection],
    request: tuple[str, list[tuple[str, str, list[int], Any]], list[str] | None],
    binary: bool,
    binary_output: bool,
) -> None:
    model, inputs, outputs = request
    entries = []
    tail = b""
    for name, datatype, shape, values in inputs:
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if binary:
            raw = _raw(datatype, values)
            entry["parameters"] = {"binary_data_size": len(raw)}
            tail += raw
        else:
            entry["data"] = _json(datatype, values)
        entries.append(entry)
    doc: dict[str, Any] = {"id": "onnx", "inputs": entries}
    if outputs is not None:
        doc["outputs"] = [
            {"name": name, "parameters": {"binary_data": binary_output}} for name in outputs
        ]
    elif binary_output:
        doc["parameters"] = {"binary_data_output": True}
    header = json.dumps(doc).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))} if binary else {}
    message = (f"/v2/models/{model}/infer", header + tail, headers)
    core, reference = connections
    assert core.ask(*message) == reference.ask(*message)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(tensors())
def test_grpc_calls_get_the_reference_answers(
    grpc_calls: tuple[Any, Any],
    request: tuple[str, list[tuple[str, str, list[int], Any]], list[str] | None],
) -> None:
    model, inputs, outputs = request
    message = pb.ModelInferRequest(model_name=model, id="onnx")
    for name, datatype, shape, values in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(_raw(datatype, values))
    for name in outputs or ():
        message.outputs.add(name=name)
    data = message.SerializeToString()
    core, reference = grpc_calls
    assert grpc_answer(core, data) == grpc_answer(reference, data)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.booleans(), st.booleans(), st.floats(-8, 8, width=32)),
        min_size=1,
        max_size=8,
    )
)
def test_sequences_get_the_reference_answers(
    connections: tuple[Connection, Connection], steps: list[tuple[int, bool, bool, float]]
) -> None:
    """A sequence model on the core's path (the core writes its START, READY and CORRID
    inputs): scripts of interleaved sequences (IDs 1-3; START, END, no START) give what the
    reference scheduler gives."""
    core, reference = connections
    for sequence_id, start, end, value in steps:
        doc = {
            "parameters": {
                "sequence_id": sequence_id,
                "sequence_start": start,
                "sequence_end": end,
            },
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [value]}],
        }
        message = ("/v2/models/control_echo/infer", json.dumps(doc).encode(), {})
        assert core.ask(*message) == reference.ask(*message)
    for sequence_id in (1, 2, 3):  # end whatever is still open, alike
        doc = {
            "parameters": {"sequence_id": sequence_id, "sequence_end": True},
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [0]}],
        }
        message = ("/v2/models/control_echo/infer", json.dumps(doc).encode(), {})
        assert core.ask(*message) == reference.ask(*message)


def test_the_core_runs_the_sessions(
    servers: tuple[RunningServer, ...], connections: tuple[Connection, Connection]
) -> None:
    """What the comparisons above compare is the core's work: the ONNX models' batches are
    run from the core's driver threads (the reference server has none)."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    ).encode()
    core, reference = servers
    assert _driver_ticks(reference.proc.pid) == 0
    before = _driver_ticks(core.proc.pid)
    for _ in range(2000):
        status, _, _ = connections[0].ask("/v2/models/mlp/infer", body, {})
        assert status == b"HTTP/1.1 200 OK"
        if _driver_ticks(core.proc.pid) > before:
            return
    raise AssertionError("the core's driver threads never ran")


@pytest.mark.parametrize("rows", [1 << 16, 3 << 16])
def test_large_inputs_read_where_the_body_arrived_get_the_reference_answers(
    connections: tuple[Connection, Connection], rows: int
) -> None:
    """An input large enough to stay in the shared-memory object its body was received into
    (512 KiB and 1.5 MiB): the in-process session reads it there; the same answers, several
    in a row on one connection."""
    for offset in range(2):
        a = (np.arange(rows * 2, dtype=np.float32) + offset).reshape(rows, 2)
        b = np.array([[0.5, -1.0]], np.float32)
        inputs = [("A", "FP32", a), ("B", "FP32", b)]
        outputs = [{"name": "SUM", "parameters": {"binary_data": True}}]
        answer = same_answers(connections, binary_request("optional", inputs, outputs))
        np.testing.assert_array_equal(
            np.frombuffer(answer[2][-a.nbytes :], np.float32), (a + b).ravel()
        )
