"""Raw binary inference requests (``Inference-Header-Content-Length: 0``): the whole body is
the model's one input, whose name, datatype and shape come from the model configuration, as
Triton deduces them.

A model with one input takes such a body as that input; its batch dimension (if the model
batches) is 1; one variable-sized dimension is deduced from the body's size. A BYTES input must
have shape ``[1]``: the body is its one element. Outputs come back as binary data.
"""

from __future__ import annotations

from tritonfast._proto import model_config_pb2
from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES, WIRE_DATATYPES
from tritonfast.data.types import InferRequest, InputTensor
from tritonfast.errors import InvalidArgumentError

_UNKNOWN_ID = rawtensor.request_prefix("")  # a raw request carries no id


def decode(
    body: bytes | bytearray | memoryview,
    config: model_config_pb2.ModelConfig,
    model_name: str,
    model_version: str = "",
) -> InferRequest:
    """The request a raw body makes for the model ``config`` describes."""
    if len(config.input) != 1:
        raise InvalidArgumentError(
            f"{_UNKNOWN_ID}Raw request must only have 1 input (found 1) to be deduced but got"
            f" {len(config.input)} inputs in '{model_name}' model configuration"
        )
    spec = config.input[0]
    datatype = WIRE_DATATYPES[spec.data_type]
    shape = [1] if config.max_batch_size else []
    variable = -1  # the position of the one variable-sized dimension
    fixed = 1  # elements of the fixed dimensions
    for dim in spec.dims:
        if dim == -1:
            if variable != -1:
                raise InvalidArgumentError(
                    f"{_UNKNOWN_ID}The shape of the raw input '{spec.name}' can not be deduced"
                    " because there are more than one variable-sized dimension"
                )
            variable = len(shape)
        else:
            fixed *= dim
        shape.append(dim)
    view = memoryview(body)
    if datatype == "BYTES":
        if variable != -1 or fixed != 1:
            raise InvalidArgumentError(
                f"{_UNKNOWN_ID}For BYTE datatype raw input '{spec.name}', the model must have"
                " input shape [1]"
            )
        data = rawtensor.bytes_array([view.tobytes()]).reshape(shape)
    else:
        if variable != -1:
            element = fixed * NUMPY_DTYPES[datatype].itemsize
            shape[variable] = len(view) // element if element else 0
        data = rawtensor.from_raw(datatype, tuple(shape), view, spec.name, model_name)
    request = InferRequest(model_name=model_name, model_version=model_version)
    request.inputs.append(InputTensor(spec.name, datatype, tuple(shape), data))
    return request
