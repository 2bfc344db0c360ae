"""Raw binary requests: the model's one input deduced from its configuration, as Triton does."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2
from tritonfast.errors import InvalidArgumentError
from tritonfast.frontends.http import rawrequest


def config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_fixed_dims_without_batching() -> None:
    request = rawrequest.decode(
        np.arange(6, dtype=np.int32).tobytes(),
        config('input [ { name: "X" data_type: TYPE_INT32 dims: [ 2, 3 ] } ]'),
        "m",
    )
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", "INT32", (2, 3))
    np.testing.assert_array_equal(tensor.data, np.arange(6).reshape(2, 3))


def test_a_bytes_input_of_one_element_is_the_whole_body() -> None:
    request = rawrequest.decode(
        b"\x00raw\xff",
        config('max_batch_size: 4 input [ { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]'),
        "m",
    )
    (tensor,) = request.inputs
    assert (tensor.datatype, tensor.shape) == ("BYTES", (1, 1))
    assert tensor.data.tolist() == [[b"\x00raw\xff"]]


def test_two_variable_sized_dimensions_cannot_be_deduced() -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        rawrequest.decode(
            bytes(8), config('input [ { name: "X" data_type: TYPE_FP16 dims: [ -1, -1 ] } ]'), "m"
        )
    assert caught.value.message == (
        "[request id: <id_unknown>] The shape of the raw input 'X' can not be deduced because"
        " there are more than one variable-sized dimension"
    )
