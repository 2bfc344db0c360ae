"""gRPC wire format <-> the protocol-neutral request and response types.

Decoding turns a ``ModelInferRequest`` into an :class:`~tritonfast.data.types.InferRequest`
whose numeric tensors are numpy views over the request's ``raw_input_contents`` bytes (no
copy), and checks what only the wire format can tell: where each input's data is, whether
there is too little or too much of it, and whether parameters have the types Triton accepts.
Whether the tensors suit the model (names, datatypes, shapes, batch size) is the DataPlane's
business.

Encoding always puts output data in ``raw_output_contents``, as Triton does. The raw layout
itself, and its errors, are :mod:`tritonfast.data.rawtensor`'s, the same as HTTP's.

``ModelInfer`` skips protobuf for the tensors themselves: :func:`parse_infer_request` views
``raw_input_contents`` inside the received bytes and :func:`serialize_infer_response` appends
``raw_output_contents`` to the encoded message (protobuf's own path copies each tensor twice
more, which costs milliseconds per MiB-sized tensor).

The one table from Triton's error codes to gRPC status codes is :data:`GRPC_STATUS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from tritonfast._core import length_delimited_prefix, split_message_field
from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.data import rawtensor
from tritonfast.data.types import (
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
)
from tritonfast.errors import Code, InvalidArgumentError, TritonError
from tritonfast.memory import sharedmemory

# Field numbers of the tensor payloads in ModelInferRequest and ModelInferResponse.
RAW_INPUT_CONTENTS = 7
RAW_OUTPUT_CONTENTS = 6

# Triton's error code -> gRPC status code (Triton's GrpcStatusUtil::CodeToStatus).
GRPC_STATUS: dict[Code, grpc.StatusCode] = {
    Code.UNKNOWN: grpc.StatusCode.UNKNOWN,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
}


def grpc_status(error: TritonError) -> grpc.StatusCode:
    return GRPC_STATUS[error.code]


# -- parameters --------------------------------------------------------------------------------

# Request parameters Triton gives a meaning to, with the InferParameter members each accepts.
_SPECIAL_PARAMETERS: dict[str, tuple[tuple[str, ...], str]] = {
    "sequence_id": (("int64_param", "string_param"), "int64_param or string_param"),
    "sequence_start": (("bool_param",), "bool_param"),
    "sequence_end": (("bool_param",), "bool_param"),
    "priority": (("int64_param", "uint64_param"), "int64_param or uint64_param"),
    "timeout": (("int64_param",), "int64_param"),
}
_GENERIC_PARAMETER_KINDS = ("int64_param", "bool_param", "string_param", "double_param")
_RESERVED_PREFIX = "triton_"
_RESERVED_PARAMETERS = ("triton_enable_empty_final_response",)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _parameter_value(param: pb.InferParameter) -> Any:
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def decode_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A parameter map as plain Python values (no type checks; for tensor parameters)."""
    return {key: _parameter_value(value) for key, value in params.items()}


def decode_request_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """Request-level parameters as plain values, with Triton's gRPC type rules."""
    decoded: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        special = _SPECIAL_PARAMETERS.get(key)
        if special is not None:
            allowed, expected = special
            if kind not in allowed:
                raise InvalidArgumentError(
                    f"invalid value type for '{key}' parameter, expected {expected}."
                )
            if key == "priority" and kind == "int64_param" and param.int64_param < 0:
                raise InvalidArgumentError("invalid value for 'priority', expected value >= 0.")
        elif key.startswith(_RESERVED_PREFIX):
            if key not in _RESERVED_PARAMETERS:
                raise InvalidArgumentError(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. "
                    "Only the following keys starting with 'triton_' are allowed: "
                    + " ".join(_RESERVED_PARAMETERS)
                )
            if kind != "bool_param":
                raise InvalidArgumentError(
                    f"invalid value type for '{key}' parameter, expected bool_param."
                )
        elif kind not in _GENERIC_PARAMETER_KINDS:
            raise InvalidArgumentError(
                f"invalid value type for '{key}' parameter, expected "
                "int64_param, bool_param, or string_param."
            )
        decoded[key] = getattr(param, kind)  # type: ignore[arg-type]
    return decoded


def encode_parameters(values: Mapping[str, Any], target: MutableMapping[str, Any]) -> None:
    """Write plain Python values into a protobuf ``map<string, InferParameter>``."""
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool | np.bool_):
            param.bool_param = bool(value)
        elif isinstance(value, int | np.integer):
            number = int(value)
            if number > _INT64_MAX:
                param.uint64_param = number
            else:
                param.int64_param = number
        elif isinstance(value, float | np.floating):
            param.double_param = float(value)
        elif isinstance(value, bytes):
            param.string_param = value.decode("utf-8", errors="replace")
        else:
            param.string_param = str(value)


# The logging extension's settings and the SettingValue member each takes.
_LOG_SETTINGS = {
    "log_file": "string_param",
    "log_info": "bool_param",
    "log_warning": "bool_param",
    "log_error": "bool_param",
    "log_verbose_level": "uint32_param",
    "log_format": "string_param",
}
_LOG_EXPECT = {"bool_param": "boolean", "uint32_param": "int32", "string_param": "string"}


def decode_log_settings(
    settings: Mapping[str, pb.LogSettingsRequest.SettingValue],
) -> dict[str, Any]:
    """The settings a LogSettings request changes (unset values and unknown keys ignored)."""
    changes: dict[str, Any] = {}
    for key, setting in settings.items():
        member = _LOG_SETTINGS.get(key)
        which = setting.WhichOneof("parameter_choice")
        if member is None or which is None:
            continue
        if which != member:
            raise InvalidArgumentError(f"expect {_LOG_EXPECT[member]} for '{key}'")
        changes[key] = getattr(setting, member)
    return changes


def encode_log_settings(settings: Mapping[str, Any]) -> pb.LogSettingsResponse:
    reply = pb.LogSettingsResponse()
    for key, value in settings.items():
        member = _LOG_SETTINGS.get(key)
        if member is not None:
            setattr(reply.settings[key], member, value)
    return reply


def decode_trace_settings(
    settings: Mapping[str, pb.TraceSettingRequest.SettingValue],
) -> dict[str, Any]:
    """Trace setting changes: an empty value clears the setting (``None``)."""
    changes: dict[str, Any] = {}
    for key, setting in settings.items():
        values = list(setting.value)
        if not values:
            changes[key] = None
        elif key == "trace_level":
            changes[key] = values
        elif len(values) != 1:
            raise InvalidArgumentError(f"expect only 1 value for '{key}'")
        else:
            changes[key] = values[0]
    return changes


def encode_trace_settings(settings: Mapping[str, Any]) -> pb.TraceSettingResponse:
    reply = pb.TraceSettingResponse()
    for key, value in settings.items():
        reply.settings[key].value.extend(value if isinstance(value, list) else [value])
    return reply


def decode_load_parameters(
    parameters: Mapping[str, pb.ModelRepositoryParameter],
) -> dict[str, Any]:
    """A model load's parameters: ``config`` (string_param), ``file:*`` (bytes_param)."""
    decoded: dict[str, Any] = {}
    for key, parameter in parameters.items():
        if key == "config":
            expected = "string_param"
        elif key.startswith("file:"):
            expected = "bytes_param"
        else:
            raise InvalidArgumentError(f"unrecognized load parameter '{key}'.")
        if parameter.WhichOneof("parameter_choice") != expected:
            raise InvalidArgumentError(
                f"invalid value type for load parameter '{key}', expected {expected}."
            )
        decoded[key] = getattr(parameter, expected)
    return decoded


def decode_unload_dependents(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> bool:
    if "unload_dependents" not in parameters:
        return False
    parameter = parameters["unload_dependents"]
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidArgumentError(
            "invalid value type for 'unload_dependents' parameter, expected bool_param."
        )
    return parameter.bool_param


# -- tensors -----------------------------------------------------------------------------------

# Typed-contents members in the order Triton examines them.
_CONTENT_FIELDS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)
# The element type each member carries (int/uint members also carry the narrow types).
_CONTENT_TYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
_NARROW = {"INT8": "int_contents", "INT16": "int_contents", "UINT8": "uint_contents",
           "UINT16": "uint_contents"}  # fmt: skip
# The numpy type the values of each member are parsed as before narrowing.
_CONTENT_DTYPE = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}


def _decode_typed(
    tensor: pb.ModelInferRequest.InferInputTensor,
    shape: tuple[int, ...],
    model: str,
    request_id: str,
) -> np.ndarray:
    datatype = tensor.datatype
    contents = tensor.contents
    chosen: str | None = None
    for field in _CONTENT_FIELDS:
        if not len(getattr(contents, field)):
            continue
        if chosen is not None:
            raise InvalidArgumentError(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model "
                f"'{model}', binary data was already supplied."
            )
        carried = datatype if _NARROW.get(datatype) == field else _CONTENT_TYPE[field]
        if carried != datatype:
            raise InvalidArgumentError(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model "
                f"'{model}' of type '{carried}', expected datatype '{datatype}'"
            )
        chosen = field

    count = rawtensor.element_count(shape, tensor.name, model, request_id)
    if datatype == "BYTES":
        items = list(contents.bytes_contents)
        if len(items) != count:
            raise rawtensor.string_count_error(tensor.name, model, request_id, count, len(items))
        return rawtensor.bytes_array(items).reshape(shape)

    dtype = rawtensor.numeric_dtype(datatype, tensor.name, model)
    if chosen is None:
        values = np.empty(0, dtype=dtype)
    else:
        values = np.array(getattr(contents, chosen), dtype=_CONTENT_DTYPE[chosen])
        if values.dtype != dtype:
            values = values.astype(dtype)  # narrow ints keep their low bytes, as in Triton
    if values.size != count:
        raise rawtensor.byte_size_error(
            tensor.name, model, request_id, count * dtype.itemsize, values.size * dtype.itemsize
        )
    return values.reshape(shape)


def parse_infer_request(data: bytes) -> tuple[pb.ModelInferRequest, list[memoryview]]:
    """A serialized ``ModelInferRequest``, parsed without its ``raw_input_contents``, and
    those tensors as views of ``data`` (protobuf would copy each one twice)."""
    rest, spans = split_message_field(data, RAW_INPUT_CONTENTS)
    try:
        message = pb.ModelInferRequest.FromString(rest)
    except DecodeError as error:
        raise InvalidArgumentError(f"malformed ModelInferRequest: {error}") from None
    view = memoryview(data)
    return message, [view[start:end] for start, end in spans]


def decode_infer_request(
    message: pb.ModelInferRequest, raw_contents: Sequence[Any] | None = None
) -> InferRequest:
    """Turn a ``ModelInferRequest`` into an :class:`InferRequest`.

    ``raw_contents`` replaces the message's ``raw_input_contents`` (see
    :func:`parse_infer_request`). Raises :class:`InvalidArgumentError` (with Triton's
    message) for wire-level problems.
    """
    model = message.model_name
    request_id = message.id
    parameters = decode_request_parameters(message.parameters)
    if raw_contents is None:
        raw_contents = message.raw_input_contents
    raw_count = len(raw_contents)
    raw_index = 0
    uses_shared_memory = False
    inputs: list[InputTensor] = []
    for tensor in message.inputs:
        shape = tuple(tensor.shape)
        tensor_parameters = decode_parameters(tensor.parameters) if tensor.parameters else {}
        if tensor_parameters and sharedmemory.placement(tensor_parameters, tensor.name):
            if tensor.HasField("contents"):
                raise InvalidArgumentError(
                    "unexpected 'content' provided when using shared memory for input tensor"
                    f" '{tensor.name}' for model '{model}'"
                )
            data = sharedmemory.NO_DATA  # the data plane maps it
            uses_shared_memory = True
        elif tensor.HasField("contents"):
            if raw_count:
                raise InvalidArgumentError(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'"
                )
            data = _decode_typed(tensor, shape, model, request_id)
        elif raw_index < raw_count:
            raw = raw_contents[raw_index]
            data = rawtensor.from_raw(tensor.datatype, shape, raw, tensor.name, model, request_id)
            raw_index += 1
        else:
            raise InvalidArgumentError(
                f"unable to find data for input tensor '{tensor.name}' for model '{model}' "
                "in request."
            )
        inputs.append(
            InputTensor(
                name=tensor.name,
                datatype=tensor.datatype,
                shape=shape,
                data=data,
                parameters=tensor_parameters,
            )
        )
    if raw_index < raw_count:
        # Triton ignores the surplus; we refuse it, since it always means a malformed request.
        raise InvalidArgumentError(
            f"{rawtensor.request_prefix(request_id)}raw_input_contents has {raw_count} entries"
            f" but only {raw_index} inputs of model '{model}' take their data from it"
        )

    outputs: list[RequestedOutput] | None = None
    if message.outputs:
        outputs = []
        for output in message.outputs:
            output_parameters = decode_parameters(output.parameters) if output.parameters else {}
            if output_parameters and sharedmemory.placement(output_parameters, output.name):
                uses_shared_memory = True
            outputs.append(RequestedOutput(output.name, output_parameters))
    return InferRequest(
        model_name=model,
        model_version=message.model_version,
        id=request_id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters,
        uses_shared_memory=uses_shared_memory,
    )


def encode_infer_response(
    response: InferResponse, requested: Iterable[str] | None = None, request_id: str = ""
) -> pb.ModelInferResponse:
    """Turn an :class:`InferResponse` into a ``ModelInferResponse`` (data always raw).

    ``requested`` limits the outputs to those names (the request's output list, if any);
    ``request_id`` is echoed when the response carries no id of its own.
    """
    message, raws = _response_without_data(response, requested, request_id)
    message.raw_output_contents.extend(bytes(raw) for raw in raws)
    return message


def serialize_infer_response(
    response: InferResponse, requested: Iterable[str] | None = None, request_id: str = ""
) -> bytes:
    """:func:`encode_infer_response`, serialized: the tensors are appended to the encoded
    message as ``raw_output_contents`` fields, each copied once (protobuf copies them twice
    more)."""
    message, raws = _response_without_data(response, requested, request_id)
    parts: list[Any] = [message.SerializeToString()]
    for raw in raws:
        parts.append(length_delimited_prefix(RAW_OUTPUT_CONTENTS, len(raw)))
        parts.append(raw)
    return b"".join(parts)


def _response_without_data(
    response: InferResponse, requested: Iterable[str] | None, request_id: str
) -> tuple[pb.ModelInferResponse, list[Any]]:
    """The response message without ``raw_output_contents``, and those tensors' bytes."""
    message = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or request_id,
    )
    if response.parameters:
        encode_parameters(response.parameters, message.parameters)
    wanted = None if requested is None else set(requested)
    raws: list[Any] = []
    for tensor in response.outputs:
        if wanted is not None and tensor.name not in wanted:
            continue
        output = message.outputs.add(name=tensor.name, datatype=tensor.datatype)
        output.shape.extend(tensor.shape)
        if tensor.parameters:
            encode_parameters(tensor.parameters, output.parameters)
        # An output in shared memory keeps its (empty) place so indices stay aligned.
        if tensor.in_shared_memory:
            raws.append(b"")
        else:
            data = rawtensor.to_raw(tensor.datatype, tensor.data)
            raws.append(data if isinstance(data, bytes) else data.data)
    return message, raws


# The reply parameter that marks a stream request's last reply.
FINAL_PARAMETER = "triton_final_response"


def stream_reply(
    response: InferResponse, requested: list[str] | None, request_id: str, final: bool
) -> pb.ModelStreamInferResponse:
    """The stream message carrying one response of a request, ``final`` if its last."""
    reply = pb.ModelStreamInferResponse(
        infer_response=encode_infer_response(response, requested, request_id)
    )
    reply.infer_response.parameters[FINAL_PARAMETER].bool_param = final
    return reply


def stream_error(message: str, request_id: str) -> pb.ModelStreamInferResponse:
    """The stream message Triton sends for a failed request (the stream stays open)."""
    reply = pb.ModelStreamInferResponse(error_message=message)
    reply.infer_response.id = request_id
    return reply


# -- metadata ----------------------------------------------------------------------------------


def _tensor_metadata(target: Any, tensors: Iterable[Mapping[str, Any]]) -> None:
    for tensor in tensors:
        entry = target.add(name=tensor["name"], datatype=tensor["datatype"])
        entry.shape.extend(int(d) for d in tensor.get("shape", ()))


def encode_model_metadata(metadata: Mapping[str, Any]) -> pb.ModelMetadataResponse:
    message = pb.ModelMetadataResponse(
        name=metadata["name"],
        versions=[str(v) for v in metadata.get("versions", ())],
        platform=metadata.get("platform", ""),
    )
    _tensor_metadata(message.inputs, metadata.get("inputs", ()))
    _tensor_metadata(message.outputs, metadata.get("outputs", ()))
    return message


def encode_server_metadata(metadata: Mapping[str, Any]) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(
        name=metadata["name"],
        version=metadata["version"],
        extensions=list(metadata.get("extensions", ())),
    )


def encode_statistics(stats: Mapping[str, Any]) -> pb.ModelStatisticsResponse:
    """The statistics extension's JSON layout (DataPlane.model_statistics) as protobuf."""
    reply = pb.ModelStatisticsResponse()
    json_format.ParseDict(stats, reply)
    return reply
