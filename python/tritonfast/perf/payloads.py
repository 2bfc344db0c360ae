"""Requests as bytes on the wire, made once before the load starts: a whole HTTP/1.1 request
with the binary tensor extension, or a serialized gRPC ``ModelInferRequest`` with raw input
contents (what tritonclient sends either way)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np

from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.perf.inputs import Tensor

GRPC_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"

# A request's parameters (sequence controls, the stream's final-response flag).
Parameters = dict[str, bool | int | str]


@dataclass(frozen=True)
class Placement:
    """Inputs and outputs in shared memory: name -> (region, byte size)."""

    inputs: dict[str, tuple[str, int]] = field(default_factory=dict)
    outputs: dict[str, tuple[str, int]] = field(default_factory=dict)


def tensor_bytes(tensor: Tensor) -> bytes:
    """The tensor's raw contents; BYTES elements each with a 4-byte little-endian length."""
    if tensor.datatype == "BYTES":
        assert isinstance(tensor.values, list)
        return b"".join(struct.pack("<I", len(item)) + item for item in tensor.values)
    assert isinstance(tensor.values, np.ndarray)
    return (
        np.ascontiguousarray(tensor.values)
        .astype(tensor.values.dtype.newbyteorder("<"), copy=False)
        .tobytes()
    )


def _region(placed: tuple[str, int]) -> Parameters:
    return {"shared_memory_region": placed[0], "shared_memory_byte_size": placed[1]}


def http_request(
    address: str,
    model: str,
    version: str,
    tensors: list[Tensor],
    outputs: list[str],
    parameters: Parameters | None = None,
    placed: Placement | None = None,
) -> bytes:
    """A whole HTTP/1.1 inference request: JSON header, then the inputs' bytes (but those of
    inputs ``placed`` in shared memory; outputs placed there are written there)."""
    placed = placed or Placement()
    raws = [b"" if t.name in placed.inputs else tensor_bytes(t) for t in tensors]

    def input_parameters(tensor: Tensor, raw: bytes) -> Parameters:
        if tensor.name in placed.inputs:
            return _region(placed.inputs[tensor.name])
        return {"binary_data_size": len(raw)}

    def output_parameters(name: str) -> Parameters:
        return _region(placed.outputs[name]) if name in placed.outputs else {"binary_data": True}

    header: dict[str, object] = {
        "inputs": [
            {
                "name": t.name,
                "shape": t.shape,
                "datatype": t.datatype,
                "parameters": input_parameters(t, raw),
            }
            for t, raw in zip(tensors, raws, strict=True)
        ],
        "outputs": [{"name": name, "parameters": output_parameters(name)} for name in outputs],
    }
    if parameters:
        header["parameters"] = parameters
    head = json.dumps(header, separators=(",", ":")).encode()
    body_length = len(head) + sum(len(raw) for raw in raws)
    path = f"/v2/models/{quote(model, safe='')}"
    if version:
        path += f"/versions/{quote(version, safe='')}"
    start = (
        f"POST {path}/infer HTTP/1.1\r\n"
        f"Host: {address}\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\n"
        f"Content-Length: {body_length}\r\n\r\n"
    ).encode()
    return b"".join([start, head, *raws])


def _set(target: Any, values: Parameters) -> None:
    """``values`` into a protobuf map of ``InferParameter``."""
    for key, value in values.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        else:
            target[key].string_param = value


def grpc_request(
    model: str,
    version: str,
    tensors: list[Tensor],
    outputs: list[str],
    parameters: Parameters | None = None,
    placed: Placement | None = None,
) -> bytes:
    """A serialized ``ModelInferRequest``; inputs and outputs ``placed`` in shared memory name
    their regions instead of carrying bytes."""
    placed = placed or Placement()
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    _set(request.parameters, parameters or {})
    for tensor in tensors:
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if tensor.name in placed.inputs:
            _set(entry.parameters, _region(placed.inputs[tensor.name]))
        else:
            request.raw_input_contents.append(tensor_bytes(tensor))
    for name in outputs:
        entry = request.outputs.add(name=name)
        if name in placed.outputs:
            _set(entry.parameters, _region(placed.outputs[name]))
    return request.SerializeToString()
