"""The generate extension's JSON: ``POST .../generate`` and ``.../generate_stream``.

A request is one flat JSON object. A member named like one of the model's inputs is that input
(a scalar, or an array, flattened, its shape taken from the model's dims: fixed dimensions as they
are, the innermost variable one holding the rest, other variable ones 1); any other member is a
request parameter (string, integer, boolean or number), ``id`` too, which (a string, else
INTERNAL) is also the request id. The member ``parameters`` is an object (else INTERNAL) whose
members follow the same rule; an error among them names it ("Converting keyword:
'parameters': ..."). As in Triton, no member is the protocol's own: ``priority``, ``timeout``
or ``sequence_id`` set nothing about how the request is scheduled, and the model sees them
among its parameters (:data:`~tritonfast.data.types.MODEL_PARAMETERS_ONLY` marks them so).

A response is one flat JSON object with its members sorted by name, as Triton writes it:
``id`` (when the request had one), ``model_name``, ``model_version``, the response's
parameters, and each output by name, a single element as a scalar and more as a flat array.
``generate_stream`` sends each response as a Server-Sent Event (``data: <json>`` and a blank
line); an error response as ``data: {"error": ...}``. A body that does not parse is answered
with INTERNAL (500), an error response with 400, as Triton 2.51 does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from tritonfast.data import rawtensor
from tritonfast.data.types import MODEL_PARAMETERS_ONLY, InferRequest, InferResponse, InputTensor
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError
from tritonfast.frontends.http import jsonparse, tensordata

if TYPE_CHECKING:
    from tritonfast.runtime.responses import Result

JSON = "application/json"
EVENT_STREAM = "text/event-stream; charset=utf-8"
# The status of a generate answer whose (first) response is an error, whatever its code.
ERROR_RESPONSE_STATUS = 400
# Triton's answer when ``generate`` meets a model that does not send exactly one response.
NOT_ONE_RESPONSE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that"
    " generates various number of responses"
)
_NESTED = "parameters"
_PARAMETER_TYPES = (str, int, bool, float)


def decode_request(
    body: bytes | bytearray | memoryview,
    model_name: str,
    model_version: str,
    metadata: Mapping[str, Any],
) -> InferRequest:
    """The inference request a generate body describes, for the model ``metadata`` names."""
    document, repeated = _parse(body)
    if type(document) is not dict:
        raise InvalidArgumentError("the generate request must be a JSON object")
    specs = {spec["name"]: spec for spec in metadata["inputs"]}
    if _NESTED in specs:
        raise InvalidArgumentError(
            "Keyword 'parameters' for nested schema also given as input tensor name"
        )
    request = InferRequest(model_name=model_name, model_version=model_version)
    request.parameters[MODEL_PARAMETERS_ONLY] = True
    if "id" in document:  # (read before anything else, as Triton reads it)
        if type(document["id"]) is not str:
            raise InternalError("Unable to parse 'id': attempt to access JSON non-string as string")
        request.id = jsonparse.valid_text(document["id"])
    _take_members(document, specs, request, repeated, nested=True)
    return request


def _parse(body: bytes | bytearray | memoryview) -> tuple[Any, dict[int, str]]:
    """The body's JSON, and the first name each object repeats (by the object's id): a JSON
    object may name a member twice, and a generate body may not name an input twice."""
    repeated: dict[int, str] = {}

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found and id(found) not in repeated:
                repeated[id(found)] = key
            found[key] = value
        return found

    try:
        return json.loads(bytes(body), object_pairs_hook=members), repeated
    except (ValueError, RecursionError):  # not JSON: Triton's words for what is wrong
        return jsonparse.loads(body), {}


def _take_members(
    members: dict[str, Any],
    specs: dict[str, Any],
    request: InferRequest,
    repeated: dict[int, str],
    *,
    nested: bool,
) -> None:
    again = repeated.get(id(members))
    if again is not None and again in specs:
        raise _named_twice(again, request)
    for key, value in members.items():
        spec = specs.get(key)
        if spec is not None:
            tensor = _tensor(spec, value, request.model_name)  # (read first, as Triton does)
            if any(tensor.name == key for tensor in request.inputs):
                raise _named_twice(key, request)
            request.inputs.append(tensor)
        elif key == _NESTED and nested:
            if type(value) is not dict:
                raise InternalError(
                    f"Expected JSON object for keyword: '{key}': attempt to access JSON"
                    " non-object as object"
                )
            try:
                _take_members(value, specs, request, repeated, nested=False)
            except TritonError as error:
                raise TritonError(
                    f"Converting keyword: '{key}': {error.message}", error.code
                ) from None
        elif type(value) in _PARAMETER_TYPES:
            request.parameters[key] = value
        else:
            raise InvalidArgumentError(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or"
                " 'string'."
            )


def _named_twice(name: str, request: InferRequest) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{rawtensor.request_prefix(request.id)}input '{name}' already exists in request"
    )


def _tensor(spec: Mapping[str, Any], value: Any, model_name: str) -> InputTensor:
    name, datatype = spec["name"], spec["datatype"]
    values = tensordata.flatten(value) if type(value) is list else [value]
    if any(type(item) is dict for item in values):
        # Triton reads the values before it shapes them: its error for the datatype (500).
        tensordata.from_json(datatype, (len(values),), values, name, model_name)
        raise _shape_error(name)  # (not reached: no datatype takes an object)
    shape = _shape(spec["shape"], len(values), name)
    data = tensordata.from_json(datatype, shape, values, name, model_name)
    return InputTensor(name, datatype, shape, data)


def _shape(dims: list[int], count: int, name: str) -> tuple[int, ...]:
    """The shape ``count`` elements take under the model's ``dims``."""
    fixed = math.prod(dim for dim in dims if dim != -1)
    variable = [index for index, dim in enumerate(dims) if dim == -1]
    shape = [1 if dim == -1 else dim for dim in dims]
    if not variable:
        if fixed != count:
            raise _shape_error(name)
        return tuple(shape)
    if fixed == 0 or count % fixed:
        raise _shape_error(name)
    shape[variable[-1]] = count // fixed
    return tuple(shape)


def _shape_error(name: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"The schema can not convert input '{name}' to tensor with proper shape"
    )


def encode_response(response: InferResponse) -> bytes:
    """One response as the generate extension's flat JSON object."""
    document: dict[str, Any] = {}
    if response.id:
        document["id"] = response.id
    document["model_name"] = response.model_name
    document["model_version"] = response.model_version
    document.update(response.parameters)
    for tensor in response.outputs:
        values = tensordata.to_json(tensor.datatype, tensor.data)
        flat = values.tolist() if hasattr(values, "tolist") else values
        document[tensor.name] = flat[0] if len(flat) == 1 else flat
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


def error_body(error: TritonError | str) -> bytes:
    message = error.message if isinstance(error, TritonError) else error
    return orjson.dumps({"error": message})


def event(data: bytes) -> bytes:
    """``data`` as one Server-Sent Event."""
    return b"data: " + data + b"\n\n"


def result_event(result: Result) -> bytes:
    """A response, or an error response, as its Server-Sent Event."""
    if isinstance(result, TritonError):
        return event(error_body(result))
    return event(encode_response(result))
