"""The onnxruntime backend's auto-complete and load-time checks, rule by rule (Triton's ONNX
Runtime backend: docs/onnxruntime.md), on model descriptions written out by hand."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2 as mc
from tritonfast.backends.onnxruntime.modelio import (
    ModelIO,
    ModelTensor,
    auto_complete,
    check,
    wants_completion,
)
from tritonfast.errors import InternalError, InvalidArgumentError

FLOAT = "tensor(float)"


def config(text: str = "") -> mc.ModelConfig:
    parsed = text_format.Parse(text, mc.ModelConfig())
    parsed.name = "m"
    return parsed


def io(inputs: list[ModelTensor], outputs: list[ModelTensor], overridable=()) -> ModelIO:
    return ModelIO(tuple(inputs), tuple(outputs), tuple(overridable))


BATCHED = io([ModelTensor("X", FLOAT, (-1, 3))], [ModelTensor("Y", "tensor(int64)", (-1, -1))])


def completed(text: str, model: ModelIO, default_max_batch_size: int = 4) -> mc.ModelConfig:
    result = config(text)
    if wants_completion(result):
        auto_complete(result, model, default_max_batch_size)
    return result


def test_variable_first_dimensions_give_max_batch_size_and_dynamic_batching() -> None:
    result = completed("", BATCHED)
    assert result.max_batch_size == 4
    assert result.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in result.input] == [("X", mc.TYPE_FP32, [3])]
    assert [(t.name, t.data_type, list(t.dims)) for t in result.output] == [
        ("Y", mc.TYPE_INT64, [-1])
    ]


def test_default_max_batch_size_setting_and_no_batcher_for_one() -> None:
    assert completed("", BATCHED, default_max_batch_size=16).max_batch_size == 16
    one = completed("", BATCHED, default_max_batch_size=1)
    assert one.max_batch_size == 1 and not one.HasField("dynamic_batching")
    with_sequence = completed("sequence_batching {}", BATCHED)
    assert not with_sequence.HasField("dynamic_batching")


def test_configured_max_batch_size_is_kept() -> None:
    result = completed("max_batch_size: 32", BATCHED)
    assert result.max_batch_size == 32 and not result.HasField("dynamic_batching")


def test_a_fixed_first_dimension_means_no_batching() -> None:
    model = io([ModelTensor("X", FLOAT, (2, 3))], [ModelTensor("Y", FLOAT, (-1, 3))])
    result = completed("", model)
    assert result.max_batch_size == 0
    assert list(result.input[0].dims) == [2, 3]
    with pytest.raises(InvalidArgumentError) as caught:
        completed("max_batch_size: 8", model)
    assert caught.value.message == (
        "autofill failed for model 'm': model does not support batching while non-zero"
        " max_batch_size is specified"
    )


def test_scalars_get_dims_one_and_an_empty_reshape_when_batching() -> None:
    model = io([ModelTensor("X", FLOAT, (-1,))], [ModelTensor("Y", FLOAT, (-1,))])
    result = completed("", model)
    assert list(result.input[0].dims) == [1] and result.input[0].HasField("reshape")
    assert list(result.input[0].reshape.shape) == []
    scalar = io([ModelTensor("X", FLOAT, ())], [ModelTensor("Y", FLOAT, ())])
    unbatched = completed("", scalar)
    assert unbatched.max_batch_size == 0
    assert list(unbatched.input[0].dims) == [1] and not unbatched.input[0].HasField("reshape")


def test_partial_lists_are_not_merged_and_full_lists_skip_everything() -> None:
    partial = completed('input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]', BATCHED)
    assert [t.name for t in partial.input] == ["X"]
    assert [t.name for t in partial.output] == ["Y"]  # the empty list is filled
    assert partial.max_batch_size == 4
    full = completed(
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]'
        ' output [ { name: "Y" data_type: TYPE_INT64 dims: [ -1 ] } ]',
        BATCHED,
    )
    assert full.max_batch_size == 0 and not full.HasField("dynamic_batching")


def test_check_accepts_what_auto_complete_writes() -> None:
    check(completed("", BATCHED), BATCHED)


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        (
            "max_batch_size: 4 output [ { name: 'Y' data_type: TYPE_INT64 dims: [ -1 ] } ]",
            InvalidArgumentError,
            "unable to load model 'm', configuration expects 0 inputs, model provides 1",
        ),
        (
            "max_batch_size: 4 input [ { name: 'Z' data_type: TYPE_FP32 dims: [ 3 ] } ]",
            InvalidArgumentError,
            "unexpected inference input 'Z', allowed inputs are: X",
        ),
        (
            "max_batch_size: 4 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 3 ] } ]"
            " output [ { name: 'W' data_type: TYPE_INT64 dims: [ -1 ] } ]",
            InvalidArgumentError,
            "unexpected inference output 'W', allowed outputs are: Y",
        ),
        (
            "max_batch_size: 4 input [ { name: 'X' data_type: TYPE_BF16 dims: [ 3 ] } ]",
            InternalError,
            "unsupported datatype TYPE_BF16 for input 'X' for model 'm'",
        ),
        (
            "max_batch_size: 4 input [ { name: 'X' data_type: TYPE_STRING dims: [ 3 ] } ]",
            InvalidArgumentError,
            "unable to load model 'm', configuration expects datatype TYPE_STRING for input"
            " 'X', model provides TYPE_FP32",
        ),
        (
            # Outputs compare exactly: a variable model dimension must be -1 in the config.
            "max_batch_size: 4 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 3 ] } ]"
            " output [ { name: 'Y' data_type: TYPE_INT64 dims: [ 5 ] } ]",
            InvalidArgumentError,
            "model 'm', tensor 'Y': the model expects 2 dimensions (shape [-1,-1]) but the"
            " model configuration specifies 2 dimensions (an initial batch dimension because"
            " max_batch_size > 0 followed by the explicit tensor shape, making complete shape"
            " [-1,5])",
        ),
        (
            # Inputs compare loosely: a variable model dimension takes any configured one.
            "max_batch_size: 0 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 4, 2 ] } ]",
            InvalidArgumentError,
            "model 'm', tensor 'X': the model expects 2 dimensions (shape [-1,3]) but the"
            " model configuration specifies 2 dimensions (shape [4,2])",
        ),
    ],
)
def test_check_refuses_with_tritons_messages(text: str, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        check(config(text), BATCHED)
    assert caught.value.message == message


def test_batching_needs_a_variable_first_dimension() -> None:
    fixed = io([ModelTensor("X", FLOAT, (2, 3))], [ModelTensor("Y", FLOAT, (2, 3))])
    with pytest.raises(InvalidArgumentError) as caught:
        check(
            config("max_batch_size: 2 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 3 ] } ]"),
            fixed,
        )
    assert caught.value.message == (
        "model 'm', tensor 'X': for the model to support batching the shape should have at"
        " least 1 dimension and the first dimension must be -1; but shape expected by the"
        " model is [2,3]"
    )


def test_optional_inputs_are_initializers_and_only_without_batching() -> None:
    model = io(
        [ModelTensor("A", FLOAT, (-1, 2))],
        [ModelTensor("S", FLOAT, (-1, 2))],
        overridable=[ModelTensor("B", FLOAT, (1, 2))],
    )
    text = (
        "input [ { name: 'A' data_type: TYPE_FP32 dims: [ -1, 2 ] },"
        " { name: 'B' data_type: TYPE_FP32 dims: [ 1, 2 ] optional: true } ]"
        " output [ { name: 'S' data_type: TYPE_FP32 dims: [ -1, 2 ] } ]"
    )
    check(config(text), model)
    batching = config("max_batch_size: 2 " + text.replace("-1, 2", "2"))
    with pytest.raises(InvalidArgumentError) as caught:
        check(batching, model)
    assert caught.value.message == (
        "unable to load model 'm', optional input 'B' is not supported for models that"
        " support batching"
    )


def test_sequence_controls_and_states_must_be_model_inputs() -> None:
    model = io(
        [ModelTensor("X", FLOAT, (-1, 1)), ModelTensor("READY", "tensor(bool)", (-1, 1))],
        [ModelTensor("Y", FLOAT, (-1, 1))],
    )
    text = (
        "max_batch_size: 2 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 1 ] } ]"
        " output [ { name: 'Y' data_type: TYPE_FP32 dims: [ 1 ] } ]"
        " sequence_batching { control_input [ { name: 'READY' control [ {"
        " kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] } ] }"
    )
    check(config(text), model)
    with pytest.raises(InternalError) as caught:
        check(config(text.replace("name: 'READY'", "name: 'GO'")), model)
    assert caught.value.message == (
        "configuration specified sequence control 'GO', but model does not provide that input"
    )
