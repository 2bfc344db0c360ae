"""The TensorRT backend's rules that need no GPU (Triton's TensorRT backend: docs/tensorrt.md):
profile selection, the batch size the profiles allow, auto-complete and the load-time checks,
on engine descriptions written out by hand."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2 as mc
from tritonfast.backends.tensorrt.engineio import (
    EngineIO,
    EngineTensor,
    Profile,
    max_batch_size,
    select_profile,
)
from tritonfast.backends.tensorrt.modelconfig import auto_complete, check
from tritonfast.errors import InternalError, InvalidArgumentError

# An engine with two profiles: batches 1-8 (opt 4) and 8-32 (opt 16) of [N, 16] inputs.
SMALL = Profile((1, 16), (4, 16), (8, 16))
LARGE = Profile((8, 16), (16, 16), (32, 16))
ENGINE = EngineIO(
    (
        EngineTensor("INPUT", True, "FLOAT", (-1, 16), (SMALL, LARGE)),
        EngineTensor("OUTPUT", False, "FLOAT", (-1, 8)),
        EngineTensor("INDEX", False, "INT32", (-1,)),
    ),
    profile_count=2,
)


def config(text: str = "") -> mc.ModelConfig:
    parsed = text_format.Parse(text, mc.ModelConfig())
    parsed.name = "m"
    return parsed


GPU_GROUP = "instance_group [ { kind: KIND_GPU } ]"


def test_profile_selection_prefers_the_nearest_optimal_shape_among_those_that_fit() -> None:
    assert select_profile(ENGINE, {"INPUT": (2, 16)}) == 0
    assert select_profile(ENGINE, {"INPUT": (8, 16)}) == 0  # both fit; 4 away from 0's opt
    assert select_profile(ENGINE, {"INPUT": (12, 16)}) == 1
    assert select_profile(ENGINE, {"INPUT": (8, 16)}, allowed=[1]) == 1
    assert select_profile(ENGINE, {"INPUT": (33, 16)}) is None
    assert select_profile(ENGINE, {"INPUT": (4, 15)}) is None


def test_max_batch_size_is_the_largest_over_the_named_profiles() -> None:
    assert max_batch_size(ENGINE) == 8  # profile 0 when none is named
    assert max_batch_size(ENGINE, [0, 1]) == 32
    two_inputs = EngineIO(
        (
            EngineTensor("A", True, "FLOAT", (-1, 2), (Profile((1, 2), (2, 2), (6, 2)),)),
            EngineTensor("B", True, "FLOAT", (-1, 2), (Profile((1, 2), (2, 2), (4, 2)),)),
            EngineTensor("C", False, "FLOAT", (-1, 2)),
        )
    )
    assert max_batch_size(two_inputs) == 4  # the smallest maximum over the inputs


def test_auto_complete_from_the_engine() -> None:
    result = config(GPU_GROUP)
    auto_complete(result, ENGINE)
    assert result.max_batch_size == 8
    assert result.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in result.input] == [
        ("INPUT", mc.TYPE_FP32, [16])
    ]
    outputs = [(t.name, t.data_type, list(t.dims), t.HasField("reshape")) for t in result.output]
    assert outputs == [("OUTPUT", mc.TYPE_FP32, [8], False), ("INDEX", mc.TYPE_INT32, [1], True)]
    check(result, ENGINE, "m_0_0")  # what it writes passes the checks


def test_auto_complete_needs_a_gpu_group_and_respects_a_smaller_max_batch_size() -> None:
    cpu = config("instance_group [ { kind: KIND_CPU } ]")
    auto_complete(cpu, ENGINE)
    assert cpu.max_batch_size == 0 and not cpu.input
    smaller = config("max_batch_size: 2 " + GPU_GROUP)
    auto_complete(smaller, ENGINE)
    assert smaller.max_batch_size == 2
    larger = config("max_batch_size: 64 " + GPU_GROUP)
    with pytest.raises(InternalError) as caught:
        auto_complete(larger, ENGINE)
    assert caught.value.message == (
        "autofill failed for model 'm': configuration specified max-batch 64 but TensorRT"
        " engine only supports max-batch 8"
    )


def test_partial_lists_are_completed_but_not_extended() -> None:
    partial = config(GPU_GROUP + " input [ { name: 'INPUT' } ] output [ { name: 'OUTPUT' } ]")
    auto_complete(partial, ENGINE)
    assert partial.input[0].data_type == mc.TYPE_FP32 and list(partial.input[0].dims) == [16]
    assert [t.name for t in partial.output] == ["OUTPUT"]
    with pytest.raises(InvalidArgumentError) as caught:
        check(partial, ENGINE, "m_0_0")
    assert caught.value.message == "expected configuration for output 'INDEX' for m_0_0"
    unknown = config(GPU_GROUP + " output [ { name: 'NOPE' } ]")
    with pytest.raises(InvalidArgumentError) as caught:
        auto_complete(unknown, ENGINE)
    assert caught.value.message == "binding for 'NOPE' not found in the model."


def test_config_dims_without_a_batch_dimension_mean_no_batching() -> None:
    unbatched = config(GPU_GROUP + " input [ { name: 'INPUT' dims: [ -1, 16 ] } ]")
    auto_complete(unbatched, ENGINE)
    assert unbatched.max_batch_size == 0
    assert not unbatched.HasField("dynamic_batching")
    assert list(unbatched.output[0].dims) == [-1, 8]  # the batch dimension is kept


FULL = (
    "max_batch_size: 8 "
    "input [ { name: 'INPUT' data_type: TYPE_FP32 dims: [ 16 ] } ] "
    "output [ { name: 'OUTPUT' data_type: TYPE_FP32 dims: [ 8 ] },"
    " { name: 'INDEX' data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } } ]"
)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            ("name: 'INPUT' data_type: TYPE_FP32", "name: 'INPUT' data_type: TYPE_FP16"),
            InvalidArgumentError,
            "unexpected datatype TYPE_FP32 for inference input 'INPUT', expecting TYPE_FP16"
            " for m_0_0",
        ),
        (
            ("name: 'INPUT' data_type: TYPE_FP32", "name: 'INPUT' data_type: TYPE_STRING"),
            InternalError,
            "unsupported datatypeTYPE_STRING for input 'INPUT' for model 'm'",
        ),
        (
            ("name: 'INPUT'", "name: 'IMAGE'"),
            InvalidArgumentError,
            "unexpected inference input 'IMAGE', allowed inputs are: INPUT",
        ),
        (
            ("dims: [ 16 ]", "dims: [ 4, 4 ]"),
            InvalidArgumentError,
            "model 'm', tensor 'INPUT': the model expects 2 dimensions (shape [-1,16]) but the"
            " model configuration specifies 3 dimensions (an initial batch dimension because"
            " max_batch_size > 0 followed by the explicit tensor shape, making complete shape"
            " [-1,4,4])",
        ),
        (
            ("dims: [ 8 ]", "dims: [ 9 ]"),
            InvalidArgumentError,
            "model 'm', tensor 'OUTPUT': the model expects 2 dimensions (shape [-1,8]) but the"
            " model configuration specifies 2 dimensions (an initial batch dimension because"
            " max_batch_size > 0 followed by the explicit tensor shape, making complete shape"
            " [-1,9])",
        ),
    ],
)
def test_checks_refuse_with_tritons_messages(
    change: tuple[str, str], error: type, message: str
) -> None:
    text = FULL.replace(*change)
    with pytest.raises(error) as caught:
        check(config(text), ENGINE, "m_0_0")
    assert caught.value.message == message


def test_configured_dims_must_lie_in_the_profile() -> None:
    narrow = EngineIO(
        (
            EngineTensor("X", True, "FLOAT", (-1, -1), (Profile((1, 2), (1, 4), (4, 8)),)),
            EngineTensor("Y", False, "FLOAT", (-1, -1)),
        )
    )
    text = (
        "max_batch_size: 4 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 16 ] } ]"
        " output [ { name: 'Y' data_type: TYPE_FP32 dims: [ -1 ] } ]"
    )
    with pytest.raises(InvalidArgumentError) as caught:
        check(config(text), narrow, "m_0_0")
    assert caught.value.message == (
        "model configuration specified invalid shape for input 'X' for model m. Error details:"
        " model expected the shape of dimension 1 to be between 2 and 8 but received 16"
    )
    check(config(text.replace("dims: [ 16 ]", "dims: [ -1 ]")), narrow, "m_0_0")


def test_what_the_backend_does_not_run_yet_is_refused_at_load() -> None:
    with_shape_tensor = EngineIO(
        (*ENGINE.tensors, EngineTensor("SHAPE", True, "INT32", (2,), (SMALL,), shape_tensor=True)),
        profile_count=2,
    )
    with pytest.raises(InvalidArgumentError) as caught:
        check(config(FULL), with_shape_tensor, "m_0_0")
    assert caught.value.message == (
        "model 'm': shape tensor 'SHAPE' is not supported by tritonfast's TensorRT backend yet"
    )
    optional = FULL.replace("dims: [ 16 ] }", "dims: [ 16 ] optional: true }")
    with pytest.raises(InvalidArgumentError, match="optional input 'INPUT' is not supported"):
        check(config(optional), ENGINE, "m_0_0")


def test_sequence_controls_and_states_are_engine_tensors_the_config_need_not_list() -> None:
    engine = EngineIO(
        (
            *ENGINE.tensors,
            EngineTensor("START", True, "INT32", (-1, 1), (Profile((1, 1), (4, 1), (8, 1)),) * 2),
        ),
        profile_count=2,
    )
    control = (
        " sequence_batching { control_input [ { name: 'START' control [ {"
        " kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }"
    )
    check(config(FULL + control), engine, "m_0_0")
    with pytest.raises(InvalidArgumentError) as caught:
        check(config(FULL), engine, "m_0_0")
    assert caught.value.message == "expected configuration for input 'START' for m_0_0"
