"""triton_python_backend_utils as models use it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from tritonfast.backends.python import loader, pb_utils


def test_byte_tensor_round_trip_keeps_nul_and_non_utf8() -> None:
    items = np.array([b"a\x00b", b"\xff\xfe", b"", "text"], dtype=np.object_)
    flat = pb_utils.serialize_byte_tensor(items)
    assert flat is not None
    assert flat.dtype == np.uint8
    back = pb_utils.deserialize_bytes_tensor(flat.tobytes())
    assert list(back) == [b"a\x00b", b"\xff\xfe", b"", b"text"]


def test_tensor_dtype_and_numpy_view() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("T", data)
    assert tensor.name() == "T"
    assert tensor.as_numpy() is data
    assert tensor.triton_dtype() == 11
    assert tensor.shape() == [2, 3]
    assert tensor.is_cpu()


def test_tensor_rejects_unicode_arrays() -> None:
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("T", np.array(["a", "b"]))


def test_dlpack_round_trip_shares_memory() -> None:
    data = np.arange(4, dtype=np.int64)
    tensor = pb_utils.Tensor.from_dlpack("X", pb_utils.Tensor("Y", data))
    assert np.shares_memory(tensor.as_numpy(), data)
    again = pb_utils.Tensor.from_dlpack("Z", tensor.to_dlpack())
    np.testing.assert_array_equal(again.as_numpy(), data)


def test_dtype_helpers() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.numpy_to_triton_type(np.int32) == 8
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13


def test_request_and_response_accessors() -> None:
    t = pb_utils.Tensor("IN", np.zeros(2, dtype=np.int8))
    request = pb_utils.InferenceRequest(
        model_name="m",
        requested_output_names=["OUT"],
        inputs=[t],
        request_id="r1",
        correlation_id=7,
        parameters={"k": 1},
    )
    assert pb_utils.get_input_tensor_by_name(request, "IN") is t
    assert pb_utils.get_input_tensor_by_name(request, "nope") is None
    assert request.requested_output_names() == ["OUT"]
    assert json.loads(request.parameters()) == {"k": 1}
    assert request.correlation_id() == 7
    assert not request.is_cancelled()
    out = pb_utils.Tensor("OUT", np.ones(1))
    response = pb_utils.InferenceResponse([out], parameters={"p": "v"})
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert not response.has_error()
    assert json.loads(response.parameters()) == {"p": "v"}
    failed = pb_utils.InferenceResponse(
        error=pb_utils.TritonError("bad", pb_utils.TritonError.INVALID_ARG)
    )
    assert failed.has_error()
    assert failed.error().code() == pb_utils.TritonError.INVALID_ARG


def test_response_requires_a_list() -> None:
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=(1, 2))  # type: ignore[arg-type]


def test_config_helpers_and_auto_complete_object() -> None:
    config = {
        "name": "m",
        "max_batch_size": 0,
        "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [2]}],
    }
    assert pb_utils.get_input_config_by_name(config, "A")["dims"] == [2]
    assert pb_utils.get_output_config_by_name(config, "A") is None
    auto = pb_utils.ModelConfig(config)
    auto.set_max_batch_size(4)
    auto.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [2]})  # agrees: accepted
    auto.add_output({"name": "B", "data_type": "TYPE_INT32", "dims": [1]})
    auto.set_dynamic_batching()
    assert auto.as_dict()["max_batch_size"] == 4
    assert [o["name"] for o in auto.as_dict()["output"]] == ["B"]
    assert "dynamic_batching" in auto.as_dict()
    with pytest.raises(ValueError, match="data_type"):
        auto.add_input({"name": "A", "data_type": "TYPE_INT8", "dims": [2]})
    with pytest.raises(ValueError, match="max_batch_size"):
        auto.set_max_batch_size(8)


class _Plain:
    def execute(self, requests: list[Any]) -> list[Any]:
        return [pb_utils.InferenceResponse() for _ in requests]


class _Blocking:
    def execute(self, requests: list[Any]) -> list[Any]:
        return [pb_utils.InferenceRequest(model_name="other").exec() for _ in requests]


class _Nested:
    async def execute(self, requests: list[Any]) -> list[Any]:
        async def call(request: Any) -> Any:
            return await request.async_exec()

        return [await call(r) for r in requests]


def test_models_that_call_the_server_are_recognised() -> None:
    assert not loader.calls_server(_Plain)
    assert loader.calls_server(_Blocking)
    assert loader.calls_server(_Nested)


def test_response_sender_refuses_bad_flags_and_a_missing_response() -> None:
    sent: list[Any] = []

    class Sink:
        def send(self, result: Any, final: bool) -> None:
            sent.append((result, final))

    sender = pb_utils.InferenceResponseSender(Sink(), None, lambda origin, response: response)
    with pytest.raises(pb_utils.TritonModelException) as caught:
        sender.send(pb_utils.InferenceResponse(), flags=2)
    assert caught.value.message() == "Unable to send response. Unsupported flag provided."
    with pytest.raises(pb_utils.TritonModelException) as caught:
        sender.send()
    assert caught.value.message() == (
        "Inference Response object must be provided when the response flags is set to zero."
    )
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(None, True)]


def test_a_missing_name_is_reported_under_the_module_name_models_use() -> None:
    with pytest.raises(AttributeError, match="module 'triton_python_backend_utils' has no"):
        pb_utils.COUNTER  # noqa: B018  (python_backend's custom_metrics example once used it)


def test_a_bls_model_name_may_be_bytes() -> None:
    assert pb_utils.InferenceRequest(model_name=b"add_sub").model_name() == "add_sub"


def test_a_response_error_must_be_a_triton_error() -> None:
    with pytest.raises(TypeError, match="'error' must be a TritonError"):
        pb_utils.InferenceResponse(error="not an error")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda t: pb_utils.InferenceRequest(model_name="m", inputs=[None]), "model"),
        (lambda t: pb_utils.InferenceRequest(model_name="m", inputs=None), "type"),
        (lambda t: pb_utils.InferenceRequest(model_name=None, inputs=[t]), "type"),
        (
            lambda t: pb_utils.InferenceRequest(model_name="m", requested_output_names=[None]),
            "type",
        ),
        (lambda t: pb_utils.InferenceRequest(model_name="m", requested_output_names=None), "type"),
        (lambda t: pb_utils.InferenceRequest(model_name="m", correleation_id=None), "type"),
        (lambda t: pb_utils.InferenceRequest(model_name="m", request_id=None), "type"),
        (lambda t: pb_utils.InferenceRequest(model_name="m", model_version=None), "type"),
        (lambda t: pb_utils.InferenceRequest(model_name="m", flags=None), "type"),
        (lambda t: pb_utils.InferenceResponse(output_tensors=[None]), "model"),
        (lambda t: pb_utils.InferenceResponse(output_tensors=None), "type"),
        (lambda t: pb_utils.Tensor(None, np.zeros(2)), "type"),
        (lambda t: pb_utils.Tensor("OUTPUT0", None), "type"),
        (lambda t: pb_utils.Tensor.from_dlpack("OUTPUT0", None), "model"),
        (lambda t: pb_utils.Logger.log("message", None), "type"),
        (lambda t: pb_utils.Logger.log("message", 1), "type"),
        (lambda t: pb_utils.Logger.log_info(None), "type"),
    ],
)
def test_arguments_are_checked_as_tritons_binding_checks_them(make, error) -> None:
    """The checks of Triton's argument_validation QA model: TypeError for a wrong type,
    TritonModelException for what its C++ side refuses."""
    tensor = pb_utils.Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))
    expected = TypeError if error == "type" else pb_utils.TritonModelException
    with pytest.raises(expected):
        make(tensor)


def test_well_formed_arguments_pass() -> None:
    pb_utils.InferenceRequest(requested_output_names=[], inputs=[], model_name="m")
    pb_utils.InferenceResponse(output_tensors=[])
    pb_utils.Logger.log("level unspecified")
    pb_utils.Logger.log("warned", pb_utils.LogLevel.WARNING)


def test_names_of_tritons_binding_that_models_use() -> None:
    # Logger's levels as its attributes, the preferred memory of a BLS call.
    assert pb_utils.Logger.INFO is pb_utils.LogLevel.INFO
    assert pb_utils.Logger.LogLevel.VERBOSE is pb_utils.Logger.VERBOSE
    preferred = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    assert preferred.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_CPU
    request = pb_utils.InferenceRequest(
        model_name="m", inputs=[], requested_output_names=[], preferred_memory=preferred
    )
    assert request.model_name() == "m"
    with pytest.raises(TypeError):
        pb_utils.PreferredMemory("CPU")  # type: ignore[arg-type]


def test_an_error_code_is_an_enum_as_in_tritons_binding_and_an_int() -> None:
    error = pb_utils.TritonError("gone", pb_utils.TritonError.NOT_FOUND)
    assert error.code().name == "NOT_FOUND"
    assert error.code() == pb_utils.TritonError.NOT_FOUND == 2
    assert pb_utils.TritonError("odd", 42).code() == 42  # kept as given
