"""Refusals of missing, extra and unknown inputs, worded as Triton's core words them."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2
from tritonfast.data.types import InferRequest, InputTensor
from tritonfast.errors import InvalidArgumentError
from tritonfast.runtime.validate import RequestValidator

CONFIG = """
name: "m"
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "C" data_type: TYPE_FP32 dims: [ 1 ] optional: %s }
]
"""


def refusal(optional: str, given: list[str]) -> str:
    config = text_format.Parse(CONFIG % optional, model_config_pb2.ModelConfig())
    request = InferRequest(model_name="m")
    for name in given:
        request.inputs.append(InputTensor(name, "FP32", (1,), np.zeros(1, np.float32)))
    with pytest.raises(InvalidArgumentError) as caught:
        RequestValidator(config).check(request)
    return caught.value.message


def test_all_inputs_required() -> None:
    assert refusal("false", ["B"]) == (
        "[request id: <id_unknown>] expected 3 inputs but got 1 inputs for model 'm'. Got"
        " input(s) ['B'], but missing required input(s) ['A','C']. Please provide all"
        " required input(s)."
    )


def test_with_an_optional_input() -> None:
    assert refusal("true", []) == (
        "[request id: <id_unknown>] expected number of inputs between 2 and 3 but got 0 inputs"
        " for model 'm'. Got input(s) [], but missing required input(s) ['A','B']. Please"
        " provide all required input(s)."
    )


def test_more_inputs_than_the_model_has_are_counted_before_their_names() -> None:
    # As Triton 2.51 words it, the empty list of missing inputs included.
    assert refusal("false", ["A", "B", "C", "STATE"]) == (
        "[request id: <id_unknown>] expected 3 inputs but got 4 inputs for model 'm'. Got"
        " input(s) ['A','B','C','STATE'], but missing required input(s) ]. Please provide all"
        " required input(s)."
    )


def test_too_few_inputs_are_counted_before_an_unknown_name() -> None:
    assert refusal("false", ["X"]) == (
        "[request id: <id_unknown>] expected 3 inputs but got 1 inputs for model 'm'. Got"
        " input(s) ['X'], but missing required input(s) ['A','B','C']. Please provide all"
        " required input(s)."
    )


def test_an_unknown_name_among_as_many_inputs_as_the_model_has() -> None:
    assert refusal("false", ["A", "B", "X"]) == "unexpected inference input 'X' for model 'm'"
