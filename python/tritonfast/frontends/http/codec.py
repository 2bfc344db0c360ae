"""KServe v2 / Triton HTTP wire format <-> :mod:`tritonfast.data.types`.

An inference request body is a JSON header, optionally followed by binary tensor data (the
binary tensor data extension): the ``Inference-Header-Content-Length`` header gives the JSON
header's size, each binary input says its size in ``parameters.binary_data_size``, and the
inputs' bytes follow the header in input order. Responses mirror this: outputs asked for
with ``parameters.binary_data`` (or every output, with the request-level
``parameters.binary_data_output``) are appended after the JSON, which then carries
``binary_data_size`` for them.

Nothing here touches sockets or the server; errors are raised as
:class:`~tritonfast.errors.TritonError` with Triton's messages, and :data:`HTTP_STATUS` is
the one table turning an error code into an HTTP status.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

import orjson

from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.data.types import (
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
)
from tritonfast.errors import Code, InternalError, InvalidArgumentError, TritonError
from tritonfast.frontends.http import jsonparse, tensordata
from tritonfast.memory import sharedmemory

HEADER_LENGTH = "Inference-Header-Content-Length"
# JSON request headers from this size on are read off the event loop (a low-priority thread).
LARGE_JSON_BYTES = 1 << 20

# Triton's HttpCodeFromError.
HTTP_STATUS: dict[Code, int] = {
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.UNKNOWN: 400,
    Code.INVALID_ARG: 400,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
}

# Request parameters Triton reads itself, with the JSON type each must have.
_TYPED_PARAMETERS = {
    "sequence_start": bool,
    "sequence_end": bool,
    "priority": int,
    "timeout": int,
}
_TYPE_ERRORS = {
    bool: "attempt to access JSON non-boolean as boolean",
    dict: "attempt to access JSON non-object as object",
    int: "attempt to access JSON non-unsigned-integer as unsigned-integer",
    str: "attempt to access JSON non-string as string",
    list: "attempt to access JSON non-array as array",
}
_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# The data of an input that lives in shared memory, until the data plane maps it.
NO_DATA = sharedmemory.NO_DATA


def error_body(message: str) -> bytes:
    """The JSON body of an error response."""
    try:
        return orjson.dumps({"error": message})
    except TypeError:  # lone surrogates, from invalid UTF-8 the client sent
        text = message.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return orjson.dumps({"error": text})


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=_DUMPS_OPTIONS)


def _unable(what: str, problem: str) -> InternalError:
    """A member of the JSON body Triton could not read: INTERNAL, as Triton answers it."""
    return InternalError(f"Unable to parse '{what}': {problem}")


def _require(value: Any, kind: type, what: str) -> Any:
    """``value`` if it has JSON type ``kind`` (unsigned for int), else Triton's parse error."""
    wrong_type = type(value) is not kind
    if wrong_type or (kind is int and value < 0):
        raise _unable(what, _TYPE_ERRORS[kind])
    return value


def header_length(value: str | None, content_length: int) -> int:
    """Size of the JSON header from ``Inference-Header-Content-Length`` (default: everything;
    0: a raw binary request, no JSON at all)."""
    if value is None:
        return content_length
    # Read as C's strtol reads it, as Triton does: the leading number, 0 when there is none
    # (0 means a raw binary request, see rawrequest).
    number = _LEADING_NUMBER.match(value)
    parsed = int(number.group(1)) if number else 0
    if parsed < 0 or parsed > content_length:
        raise InvalidArgumentError(
            f"inference header size should be in range (0, {content_length}), got: {value}"
        )
    return parsed


# strtol skips C's white space only (Python's \s also takes \x1c-\x1f, which int() refuses).
_LEADING_NUMBER = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


# -- requests ---------------------------------------------------------------------------------
def decode_infer_request(
    body: bytes | bytearray | memoryview, json_length: int, model_name: str, model_version: str = ""
) -> tuple[InferRequest, bool]:
    """Decode an inference request body.

    ``json_length`` is the size of the JSON header (see :func:`header_length`). Returns the
    request and whether outputs the client did not name come back as binary data
    (``binary_data_output``). Binary inputs are numpy views over ``body``.
    """
    view = memoryview(body)
    doc, left_out = jsonparse.loads_request(view[:json_length])
    if type(doc) is not dict:
        doc = {}
    request = InferRequest(model_name=model_name, model_version=model_version)
    if "id" in doc:
        request.id = jsonparse.valid_text(_require(doc["id"], str, "id"))
    binary_default = False
    if "parameters" in doc:
        request.parameters, binary_default = _request_parameters(doc["parameters"])

    if "inputs" not in doc:
        raise _unable("inputs", "attempt to access non-existing object member 'inputs'")
    inputs = _require(doc["inputs"], list, "inputs")
    offset = json_length
    for index, entry in enumerate(inputs):
        tensor, offset = _decode_input(
            entry, view, offset, model_name, request.id, left_out.get(index)
        )
        if tensor.data is NO_DATA:
            request.uses_shared_memory = True
        request.inputs.append(tensor)
    if offset != len(view):
        raise InvalidArgumentError(f"unexpected additional input data for model '{model_name}'")

    if "outputs" in doc:
        outputs = _require(doc["outputs"], list, "outputs")
        # An empty list names no output: every output comes back, as in Triton.
        request.outputs = [_decode_output(entry) for entry in outputs] or None
        if any(sharedmemory.REGION in o.parameters for o in request.outputs or ()):
            request.uses_shared_memory = True
    return request, binary_default


def _request_parameters(params: Any) -> tuple[dict[str, Any], bool]:
    if type(params) is not dict:
        raise InvalidArgumentError(
            "failed to get request params.: attempt to get members for non-object"
        )
    out: dict[str, Any] = {}
    binary_default = False
    for key, value in params.items():
        if key == "binary_data_output":
            binary_default = _require(value, bool, key)
            continue
        if key == "sequence_id":
            if not (type(value) is str or (type(value) is int and value >= 0)):
                raise _unable("sequence_id", _TYPE_ERRORS[str])
        elif key in _TYPED_PARAMETERS:
            _require(value, _TYPED_PARAMETERS[key], key)
        elif key.startswith("triton_"):
            raise InvalidArgumentError(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        elif type(value) not in (str, int, bool, float):
            raise InvalidArgumentError(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
        out[key] = value
    return out, binary_default


def _content_error(entry: dict[str, Any], params: dict[str, Any]) -> InvalidArgumentError:
    has = [
        f"'{field}'"
        for field, present in (
            ("data", "data" in entry),
            ("binary_data_size", "binary_data_size" in params),
            ("shared_memory_region", "shared_memory_region" in params),
        )
        if present
    ]
    found = " set " + " ".join(has) if has else " no field is set"
    return InvalidArgumentError(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But" + found
    )


def _member(entry: dict[str, Any], key: str, kind: type) -> Any:
    if key not in entry:
        raise _unable(key, f"attempt to access non-existing object member '{key}'")
    return _require(entry[key], kind, key)


def _decode_input(
    entry: Any,
    view: memoryview,
    offset: int,
    model_name: str,
    request_id: str,
    left_out: jsonparse.TensorNumbers | None = None,
) -> tuple[InputTensor, int]:
    """One input; ``left_out``: its ``data`` array, when the parse left it in the bytes."""
    if type(entry) is not dict:
        entry = {}
    params = entry.get("parameters")
    if type(params) is not dict:
        params = {}
    has_data = "data" in entry
    binary = "binary_data_size" in params
    if has_data + binary + ("shared_memory_region" in params) != 1:
        raise _content_error(entry, params)
    name = entry.get("name")
    datatype = entry.get("datatype")
    dims = entry.get("shape")
    if type(name) is not str or type(datatype) is not str or type(dims) is not list:
        # Slow path, only to word the error as Triton does.
        name = _member(entry, "name", str)
        datatype = _member(entry, "datatype", str)
        dims = _member(entry, "shape", list)
    shape = tuple(dims)
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise _unable("shape", _TYPE_ERRORS[int])
    if datatype not in NUMPY_DTYPES:
        raise InvalidArgumentError(f"invalid datatype for input {name}")

    if binary:
        size = _require(params["binary_data_size"], int, "binary_data_size")
        end = offset + size
        if end > len(view):
            raise InvalidArgumentError(
                f"unexpected size for input '{name}', expecting {end - len(view)} additional "
                f"bytes for model '{model_name}'"
            )
        data = rawtensor.from_raw(datatype, shape, view[offset:end], name, model_name, request_id)
        offset = end
        params = (
            {k: v for k, v in params.items() if k != "binary_data_size"} if len(params) > 1 else {}
        )
    elif has_data:
        json_data = entry["data"] if left_out is None else left_out
        data = tensordata.from_json(datatype, shape, json_data, name, model_name, request_id)
    else:
        sharedmemory.placement(params, name)  # complete and well-typed; the data plane reads it
        data = NO_DATA
    return InputTensor(name, datatype, shape, data, params), offset


def _decode_output(entry: Any) -> RequestedOutput:
    if type(entry) is not dict:
        entry = {}
    params = entry.get("parameters")
    if type(params) is not dict:
        params = {}
    if "shared_memory_region" in params:
        if "classification" in params:
            raise InvalidArgumentError(
                "Output can't set both 'shared_memory_region' and 'classification'"
            )
        if params.get("binary_data") is True:
            raise InvalidArgumentError(
                "Output can't set both 'shared_memory_region' and 'binary_data'"
            )
    name = _member(entry, "name", str)
    sharedmemory.placement(params, name)
    if "classification" in params:
        _require(params["classification"], int, "classification")
    if "binary_data" in params:
        _require(params["binary_data"], bool, "binary_data")
    return RequestedOutput(name, dict(params))


# -- the logging extension ----------------------------------------------------------------------
_LOG_SETTING_TYPES = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}


def _setting(value: Any, kind: type) -> Any:
    """``value`` if it has JSON type ``kind``; else INTERNAL with TritonJson's bare words, as
    Triton answers the logging, repository-index and shared-memory bodies."""
    wrong = not isinstance(value, kind)
    if kind is int:  # Triton reads these as unsigned integers, and a bool is none
        wrong = wrong or type(value) is bool or value < 0
    if wrong:
        raise InternalError(_TYPE_ERRORS[kind])
    return value


def decode_log_settings(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """The settings a logging request changes (unknown keys and nulls are ignored)."""
    doc = _object_body(body, "log settings")
    return {
        key: _setting(value, _LOG_SETTING_TYPES[key])
        for key, value in doc.items()
        if key in _LOG_SETTING_TYPES and value is not None
    }


# -- the trace extension ----------------------------------------------------------------------
def decode_trace_settings(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Trace setting changes: strings (``trace_level``: a list of strings), ``None`` resets."""
    doc = _object_body(body, "trace setting")
    changes: dict[str, Any] = {}
    for key, value in doc.items():
        if value is None:
            changes[key] = None
        elif key == "trace_level":
            changes[key] = [_require(v, str, key) for v in _require(value, list, key)]
        else:
            changes[key] = _require(value, str, key)
    return changes


# -- the model repository extension -----------------------------------------------------------
def _object_body(body: bytes | bytearray | memoryview, what: str) -> dict[str, Any]:
    """A request body that is empty or a JSON object."""
    if not len(body):
        return {}
    doc = jsonparse.loads(memoryview(body))
    if type(doc) is not dict:
        raise InvalidArgumentError(f"{what} request must be a JSON object")
    return doc


def decode_index_request(body: bytes | bytearray | memoryview) -> bool:
    """Whether a repository index request asks for ready models only."""
    doc = _object_body(body, "repository index")
    return bool(_setting(doc["ready"], bool)) if "ready" in doc else False


def _repository_parameters(doc: dict[str, Any]) -> dict[str, Any]:
    params = doc.get("parameters", {})
    if type(params) is not dict:
        raise _unable("parameters", _TYPE_ERRORS[dict])
    return params


def decode_load_request(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """A model load request's parameters: ``config`` as text, ``file:<path>`` as bytes
    (base64 on the wire)."""
    params = _repository_parameters(_object_body(body, "model load"))
    decoded: dict[str, Any] = {}
    for key, value in params.items():
        if key.startswith("file:"):
            try:
                decoded[key] = base64.b64decode(_require(value, str, key), validate=True)
            except binascii.Error:
                raise InvalidArgumentError(
                    f"failed to decode the base64 content of parameter '{key}'"
                ) from None
        elif key == "config":
            decoded[key] = _require(value, str, key)
        else:
            decoded[key] = value
    return decoded


def decode_unload_request(body: bytes | bytearray | memoryview) -> bool:
    """Whether a model unload request also unloads the model's dependents."""
    params = _repository_parameters(_object_body(body, "model unload"))
    flag = params.get("unload_dependents", False)
    return bool(_require(flag, bool, "unload_dependents"))


# -- shared-memory registration ---------------------------------------------------------------
def _register_field(doc: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    if key not in doc:
        if default is not None:
            return default
        raise InvalidArgumentError(f"Shared memory register request has no '{key}' field")
    return _setting(doc[key], kind)


def decode_system_register(body: bytes | bytearray | memoryview) -> tuple[str, int, int]:
    """``(key, offset, byte_size)`` from a system shared-memory register body."""
    doc = _object_body(body, "Shared memory register")
    key = _register_field(doc, "key", str)
    offset = _uint64(_register_field(doc, "offset", int, 0), "offset")
    return key, offset, _uint64(_register_field(doc, "byte_size", int), "byte_size")


def _uint64(value: int, what: str) -> int:
    if value >= 1 << 64:
        raise _unable(what, "value does not fit in an unsigned 64-bit integer")
    return value


def decode_cuda_register(body: bytes | bytearray | memoryview) -> tuple[bytes, int, int]:
    """``(raw_handle, device_id, byte_size)`` from a CUDA shared-memory register body."""
    doc = _object_body(body, "Shared memory register")
    handle = _register_field(doc, "raw_handle", dict)
    try:
        raw_handle = base64.b64decode(_require(handle.get("b64"), str, "b64"), validate=True)
    except (binascii.Error, TritonError):
        raise InvalidArgumentError(
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
        ) from None
    device_id = _uint64(_register_field(doc, "device_id", int), "device_id")
    return raw_handle, device_id, _uint64(_register_field(doc, "byte_size", int), "byte_size")


# -- responses --------------------------------------------------------------------------------
def encode_infer_response(
    response: InferResponse, request: InferRequest, binary_default: bool
) -> tuple[bytes, int | None]:
    """Encode the response to ``request``; return (body, JSON header length).

    The header length is None when no output travels as binary data (a pure JSON body).
    Only the outputs the request asked for are written, when it named any.
    """
    header, buffers = encode_infer_response_parts(response, request, binary_default)
    if not buffers:
        return header, None
    return b"".join([header, *buffers]), len(header)


def encode_infer_response_parts(
    response: InferResponse, request: InferRequest, binary_default: bool
) -> tuple[bytes, list[Any]]:
    """The JSON header and the binary outputs (buffers, not copied) that follow it.

    No buffers means a pure JSON body: like Triton, zero-sized binary outputs add no bytes.
    """
    wanted: dict[str, bool] | None = None
    if request.outputs is not None:
        wanted = {o.name: o.parameters.get("binary_data", False) is True for o in request.outputs}
    buffers: list[Any] = []
    outputs: list[dict[str, Any]] = []
    for tensor in response.outputs:
        if wanted is None:
            binary = binary_default
        elif tensor.name in wanted:
            binary = wanted[tensor.name]
        else:
            continue
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": [int(d) for d in tensor.shape],
        }
        if tensor.in_shared_memory:  # the data is in the client's region: metadata only
            pass
        elif binary:
            raw = rawtensor.to_raw(tensor.datatype, tensor.data)
            size = len(raw)
            entry["parameters"] = {**tensor.parameters, "binary_data_size": size}
            if size:
                buffers.append(raw)
        else:
            if tensor.parameters:
                entry["parameters"] = tensor.parameters
            entry["data"] = tensordata.to_json(tensor.datatype, tensor.data)
        outputs.append(entry)

    doc: dict[str, Any] = {}
    response_id = response.id or request.id
    if response_id:
        doc["id"] = response_id
    doc["model_name"] = response.model_name
    doc["model_version"] = str(response.model_version)
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    return orjson.dumps(doc, option=_DUMPS_OPTIONS), buffers
