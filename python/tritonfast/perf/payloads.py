"""Requests as bytes on the wire, made once before the load starts: a whole HTTP/1.1 request
with the binary tensor extension, or a serialized gRPC ``ModelInferRequest`` with raw input
contents (what tritonclient sends either way)."""

from __future__ import annotations

import json
import struct
from urllib.parse import quote

import numpy as np

from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.perf.inputs import Tensor

GRPC_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"

# A request's parameters (sequence controls, the stream's final-response flag).
Parameters = dict[str, bool | int | str]


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


def http_request(
    address: str,
    model: str,
    version: str,
    tensors: list[Tensor],
    outputs: list[str],
    parameters: Parameters | None = None,
) -> bytes:
    """A whole HTTP/1.1 inference request: JSON header, then the inputs' bytes."""
    raws = [tensor_bytes(t) for t in tensors]
    header = {
        "inputs": [
            {
                "name": t.name,
                "shape": t.shape,
                "datatype": t.datatype,
                "parameters": {"binary_data_size": len(raw)},
            }
            for t, raw in zip(tensors, raws, strict=True)
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
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


def grpc_request(
    model: str,
    version: str,
    tensors: list[Tensor],
    outputs: list[str],
    parameters: Parameters | None = None,
) -> bytes:
    """A serialized ``ModelInferRequest``."""
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for key, value in (parameters or {}).items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        else:
            request.parameters[key].string_param = value
    for tensor in tensors:
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        request.raw_input_contents.append(tensor_bytes(tensor))
    for name in outputs:
        request.outputs.add(name=name)
    return request.SerializeToString()
