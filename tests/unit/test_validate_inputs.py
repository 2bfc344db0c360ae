"""Missing-input refusals, worded as Triton's core words them."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2
from tritonfast.errors import InvalidArgumentError
from tritonfast.runtime.types import InferRequest, InputTensor
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
