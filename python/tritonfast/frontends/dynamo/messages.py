"""Dynamo's tensor messages and tritonfast's requests and responses, one into the other.

A request reaches a worker as ``{"id", "model", "tensors": [...], "outputs"?: [{"name"}],
"parameters"?: {...}}``; each tensor is ``{"metadata": {"name", "shape", "data_type"},
"data": {"data_type", "values": [...]}}``: its values as a flat list, its datatype by Dynamo's
name (``Float32``, ``Int64``, ``Bytes``, ...). BYTES elements travel as lists of byte values
(or as strings), FP16 and BF16 elements as their 16-bit patterns. A response is ``{"id",
"model", "tensors": [...], "parameters"?: {...}}`` in the same form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.data.types import (
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    RequestedOutput,
)
from tritonfast.errors import InvalidArgumentError

# Triton's datatype names and Dynamo's.
DYNAMO_DATATYPES = {
    "BOOL": "Bool",
    "UINT8": "Uint8",
    "UINT16": "Uint16",
    "UINT32": "Uint32",
    "UINT64": "Uint64",
    "INT8": "Int8",
    "INT16": "Int16",
    "INT32": "Int32",
    "INT64": "Int64",
    "FP16": "Float16",
    "BF16": "BFloat16",
    "FP32": "Float32",
    "FP64": "Float64",
    "BYTES": "Bytes",
}
TRITON_DATATYPES = {dynamo: triton for triton, dynamo in DYNAMO_DATATYPES.items()}

# The datatypes whose elements travel as 16-bit patterns.
_HALVES = ("FP16", "BF16")


def request_of(message: dict[str, Any], model_name: str) -> InferRequest:
    """The data plane's request for a Dynamo request message to ``model_name``."""
    inputs = [_input_of(tensor, model_name) for tensor in message.get("tensors") or []]
    outputs = message.get("outputs")
    return InferRequest(
        model_name=model_name,
        id=message.get("id") or "",
        inputs=inputs,
        outputs=[RequestedOutput(o["name"]) for o in outputs] if outputs else None,
        parameters=_plain(message.get("parameters") or {}),
    )


def _input_of(tensor: dict[str, Any], model_name: str) -> InputTensor:
    return InputTensor(*_tensor_of(tensor, model_name))


def _tensor_of(
    tensor: dict[str, Any], model_name: str
) -> tuple[str, str, tuple[int, ...], np.ndarray]:
    """A tensor message's name, datatype, shape and data."""
    metadata = tensor["metadata"]
    name = metadata["name"]
    datatype = TRITON_DATATYPES.get(metadata["data_type"])
    if datatype is None:
        raise InvalidArgumentError(
            f"input '{name}' of model '{model_name}': unknown datatype '{metadata['data_type']}'"
        )
    shape = tuple(int(d) for d in metadata["shape"])
    values = tensor["data"]["values"]
    if datatype == "BYTES":
        elements = [v.encode() if isinstance(v, str) else bytes(v) for v in values]
        raw = rawtensor.serialize_bytes(np.array(elements, dtype=object))
    elif datatype in _HALVES:
        raw = np.asarray(values, dtype=np.uint16).tobytes()
    else:
        # Typed at once: a list of Python ints above 2**63 would otherwise pass through
        # float64 and lose its low bits.
        try:
            typed = np.asarray(values, dtype=NUMPY_DTYPES[datatype])
        except (OverflowError, ValueError, TypeError) as error:
            raise InvalidArgumentError(
                f"input '{name}' of model '{model_name}': values that are not {datatype}: {error}"
            ) from None
        raw = rawtensor.wire_bytes(datatype, typed)
    data = rawtensor.from_raw(datatype, shape, raw, name, model_name)
    return name, datatype, shape, data


def _plain(parameters: dict[str, Any]) -> dict[str, Any]:
    """Request parameters as plain values (Dynamo may send each as a one-member typed variant,
    ``{"Int64": 3}``)."""
    plain = {}
    for key, value in parameters.items():
        if isinstance(value, dict) and len(value) == 1:
            (value,) = value.values()
        plain[key] = value
    return plain


def message_of(response: InferResponse) -> dict[str, Any]:
    """The Dynamo response message for a response of the data plane."""
    tensors = [_tensor_message(t.name, t.datatype, t.shape, t.data) for t in response.outputs]
    message: dict[str, Any] = {"id": response.id, "model": response.model_name, "tensors": tensors}
    if response.parameters:
        message["parameters"] = dict(response.parameters)
    return message


def _tensor_message(name: str, datatype: str, shape: Any, data: Any) -> dict[str, Any]:
    dynamo_type = DYNAMO_DATATYPES[datatype]
    return {
        "metadata": {"name": name, "shape": list(shape), "data_type": dynamo_type},
        "data": {"data_type": dynamo_type, "values": _values(datatype, data)},
    }


def forwarded_message(request: InferRequest) -> dict[str, Any]:
    """The Dynamo request message that carries a request of the data plane to a worker (the
    route's side of :func:`request_of`)."""
    tensors = [_tensor_message(t.name, t.datatype, t.shape, t.data) for t in request.inputs]
    message: dict[str, Any] = {"id": request.id, "model": request.model_name, "tensors": tensors}
    if request.outputs is not None:
        message["outputs"] = [{"name": output.name} for output in request.outputs]
    if request.parameters:
        message["parameters"] = dict(request.parameters)
    return message


def response_of(message: dict[str, Any], request: InferRequest) -> InferResponse:
    """The data plane's response to ``request`` for a worker's response message."""
    outputs = [
        OutputTensor(*_tensor_of(tensor, request.model_name))
        for tensor in message.get("tensors") or []
    ]
    return InferResponse(
        request.model_name,
        request.model_version,
        message.get("id") or request.id,
        outputs,
        _plain(message.get("parameters") or {}),
    )


def _values(datatype: str, data: Any) -> list[Any]:
    if datatype == "BYTES":
        flat = np.asarray(data, dtype=object).reshape(-1)
        return [list(e if isinstance(e, bytes) else str(e).encode()) for e in flat]
    if datatype in _HALVES:
        raw = rawtensor.to_raw(datatype, data)
        return np.frombuffer(bytes(raw), dtype=np.uint16).tolist()
    values: list[Any] = np.asarray(data).reshape(-1).tolist()
    return values
