"""Dynamo's tensor messages and the data plane's requests and responses (no Dynamo needed):
every datatype's values survive the trip in and back out, as an identity model would return
them; what a message cannot mean is refused with a clear error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tritonfast.data.types import InferResponse, OutputTensor, RequestedOutput
from tritonfast.errors import InvalidArgumentError
from tritonfast.frontends.dynamo.messages import (
    DYNAMO_DATATYPES,
    forwarded_message,
    message_of,
    request_of,
    response_of,
)

_INTS = {"UINT8": (0, 255), "UINT16": (0, 65535), "UINT32": (0, 2**32 - 1),
         "UINT64": (0, 2**64 - 1), "INT8": (-128, 127), "INT16": (-32768, 32767),
         "INT32": (-(2**31), 2**31 - 1), "INT64": (-(2**63), 2**63 - 1)}  # fmt: skip


@st.composite
def tensors(draw: Any) -> tuple[str, list[Any]]:
    datatype = draw(st.sampled_from(sorted(DYNAMO_DATATYPES)))
    count = draw(st.integers(0, 5))
    if datatype in _INTS:
        low, high = _INTS[datatype]
        element = st.integers(low, high)
    elif datatype == "BOOL":
        element = st.booleans()
    elif datatype in ("FP16", "BF16"):
        element = st.integers(0, 0x7BFF)  # 16-bit patterns of finite numbers
    elif datatype == "BYTES":
        element = st.lists(st.integers(0, 255), max_size=6)
    else:
        width = 32 if datatype == "FP32" else 64
        element = st.floats(allow_nan=False, width=width)
    return datatype, draw(st.lists(element, min_size=count, max_size=count))


def _message(datatype: str, values: list[Any]) -> dict[str, Any]:
    dynamo = DYNAMO_DATATYPES[datatype]
    return {
        "id": "q",
        "model": "m",
        "tensors": [
            {
                "metadata": {"name": "X", "shape": [len(values)], "data_type": dynamo},
                "data": {"data_type": dynamo, "values": values},
            }
        ],
        "parameters": {"n": {"Int64": 3}, "flag": True},
    }


@settings(max_examples=200, deadline=None)
@given(tensors())
@example(("UINT64", [0, 2**63 + 1]))  # above int64: must not pass through float64
def test_every_datatype_comes_back_as_it_went(tensor: tuple[str, list[Any]]) -> None:
    datatype, values = tensor
    message = _message(datatype, values)
    request = request_of(message, "m")
    assert (request.id, request.parameters) == ("q", {"n": 3, "flag": True})
    (given_input,) = request.inputs
    assert (given_input.datatype, given_input.shape) == (datatype, (len(values),))
    echoed = InferResponse(
        "m", "1", "q", [OutputTensor("X", datatype, given_input.shape, given_input.data)]
    )
    answer = message_of(echoed)
    assert answer["id"] == "q" and answer["model"] == "m"
    (tensor_out,) = answer["tensors"]
    assert tensor_out["metadata"] == message["tensors"][0]["metadata"]
    assert tensor_out["data"]["values"] == values


def test_bytes_may_come_as_text_and_outputs_may_be_named() -> None:
    message = _message("BYTES", ["héllo"])  # type: ignore[list-item]
    message["outputs"] = [{"name": "Y"}]
    request = request_of(message, "m")
    assert request.inputs[0].data.tolist() == ["héllo".encode()]
    assert [o.name for o in request.outputs or []] == ["Y"]


def test_an_unknown_datatype_is_refused() -> None:
    message = _message("FP32", [1.0])
    message["tensors"][0]["metadata"]["data_type"] = "Complex64"
    with pytest.raises(InvalidArgumentError, match="unknown datatype 'Complex64'"):
        request_of(message, "m")


def test_response_parameters_travel_and_half_floats_keep_their_bits() -> None:
    data = np.array([1.5, -2.0], dtype=np.float16)
    answer = message_of(
        InferResponse("m", "1", "", [OutputTensor("H", "FP16", (2,), data)], {"k": "v"})
    )
    assert answer["parameters"] == {"k": "v"}
    assert answer["tensors"][0]["data"]["values"] == data.view(np.uint16).tolist()


@settings(max_examples=200, deadline=None)
@given(tensors())
def test_a_routes_request_reaches_the_worker_and_its_answer_comes_back(
    tensor: tuple[str, list[Any]],
) -> None:
    """The route's side (``forwarded_message``, ``response_of``) and the worker's
    (``request_of``, ``message_of``) carry every datatype both ways unchanged."""
    datatype, values = tensor
    at_route = request_of(_message(datatype, values), "m")
    at_route.outputs = [RequestedOutput("X")]
    at_worker = request_of(forwarded_message(at_route), "m")
    assert (at_worker.id, at_worker.parameters) == (at_route.id, at_route.parameters)
    assert [o.name for o in at_worker.outputs or []] == ["X"]
    (sent,) = at_worker.inputs
    assert (sent.datatype, sent.shape) == (datatype, (len(values),))
    answered = message_of(
        InferResponse("m", "1", "q", [OutputTensor("X", datatype, sent.shape, sent.data)])
    )
    back = response_of(answered, at_route)
    (output,) = back.outputs
    assert (back.id, output.datatype, output.shape) == ("q", datatype, (len(values),))
    assert message_of(back)["tensors"][0]["data"]["values"] == values
