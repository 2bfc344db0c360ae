"""Bad gRPC requests get Triton's status code and message, and the server keeps answering."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as tc_pb
from tritonclient.grpc import service_pb2_grpc as tc_pb_grpc
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def stub(server: Any) -> Iterator[tc_pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield tc_pb_grpc.GRPCInferenceServiceStub(channel)


def fp32_input(shape: list[int], data: np.ndarray | None = None) -> grpcclient.InferInput:
    if data is None:
        data = np.zeros(shape, dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    tensor.set_shape(shape)  # may now disagree with the data, on purpose
    return tensor


def still_serving(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    data = np.array([[3.0, 4.0]], dtype=np.float32)
    result = grpc_client.infer("identity_fp32", [fp32_input([1, 2], data)])
    assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


def infer_error(
    grpc_client: grpcclient.InferenceServerClient, model: str, inputs: list[Any], **kwargs: Any
) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(model, inputs, **kwargs)
    return info.value


def test_unknown_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    error = infer_error(grpc_client, "no_such_model", [fp32_input([1, 2])])
    # Current Triton cores say NOT_FOUND here (releases before ~2021 said UNAVAILABLE).
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'no_such_model' is not found" in error.message()
    still_serving(grpc_client)


def test_wrong_input_name(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("WRONG", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 2), dtype=np.float32))
    error = infer_error(grpc_client, "identity_fp32", [tensor])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected inference input 'WRONG' for model 'identity_fp32'" in error.message()
    still_serving(grpc_client)


def test_wrong_shape(grpc_client: grpcclient.InferenceServerClient) -> None:
    a = grpcclient.InferInput("INPUT0", [5], "FP32")
    a.set_data_from_numpy(np.zeros(5, dtype=np.float32))
    b = grpcclient.InferInput("INPUT1", [4], "FP32")
    b.set_data_from_numpy(np.zeros(4, dtype=np.float32))
    error = infer_error(grpc_client, "add_sub", [a, b])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]" in (
        error.message()
    )
    still_serving(grpc_client)


def test_wrong_datatype(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 2), dtype=np.int32))
    error = infer_error(grpc_client, "identity_fp32", [tensor])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        "inference input 'INPUT0' data-type is 'INT32', but model 'identity_fp32' expects 'FP32'"
        in error.message()
    )
    still_serving(grpc_client)


def test_byte_size_mismatch(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = fp32_input([1, 4], np.zeros((1, 3), dtype=np.float32))
    error = infer_error(grpc_client, "identity_fp32", [tensor], request_id="r9")
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == (
        "[request id: r9] input byte size mismatch for input 'INPUT0' for model "
        "'identity_fp32'. Expected 16, got 12"
    )
    still_serving(grpc_client)


def test_batch_larger_than_max_batch_size(grpc_client: grpcclient.InferenceServerClient) -> None:
    error = infer_error(grpc_client, "identity_fp32", [fp32_input([9, 2])])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "inference request batch-size must be <= 8 for 'identity_fp32'" in error.message()
    still_serving(grpc_client)


def test_bytes_element_count_mismatch(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_))
    tensor.set_shape([1, 3])
    error = infer_error(grpc_client, "identity_bytes", [tensor])
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "expected 3 string elements for inference input 'INPUT0'" in error.message()
    still_serving(grpc_client)


def test_contents_and_raw_contents_together(
    grpc_client: grpcclient.InferenceServerClient, stub: tc_pb_grpc.GRPCInferenceServiceStub
) -> None:
    request = tc_pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    tensor.contents.fp32_contents.append(1.0)
    request.raw_input_contents.append(b"\x00" * 4)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' "
        "for model 'identity_fp32'"
    )
    still_serving(grpc_client)


def test_missing_and_surplus_raw_contents(
    grpc_client: grpcclient.InferenceServerClient, stub: tc_pb_grpc.GRPCInferenceServiceStub
) -> None:
    request = tc_pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "unable to find data for input tensor 'INPUT0' for model 'identity_fp32' in request."
    )
    request.raw_input_contents.extend([b"\x00" * 4, b"\x00" * 4])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents has 2 entries" in info.value.details()
    still_serving(grpc_client)


def test_unknown_model_wins_over_malformed_tensors(
    stub: tc_pb_grpc.GRPCInferenceServiceStub,
) -> None:
    request = tc_pb.ModelInferRequest(model_name="no_such_model")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])  # and no data at all
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert "Request for unknown model: 'no_such_model'" in info.value.details()


def test_bad_parameter_type(
    grpc_client: grpcclient.InferenceServerClient, stub: tc_pb_grpc.GRPCInferenceServiceStub
) -> None:
    request = tc_pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(b"\x00" * 4)
    request.parameters["sequence_start"].int64_param = 1
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "invalid value type for 'sequence_start' parameter, expected bool_param."
    )
    still_serving(grpc_client)


def test_model_errors_map_to_grpc_status(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = fp32_input([1])
    error = infer_error(grpc_client, "raiser", [tensor])
    assert "raiser always fails" in error.message()
    error = infer_error(grpc_client, "err_resp", [tensor])
    assert "custom error from model" in error.message()
    still_serving(grpc_client)


@pytest.mark.parametrize(
    ("version", "status", "message"),
    [
        (
            "wrong_specification",
            "StatusCode.INVALID_ARGUMENT",
            "failed to get model version from specified version string 'wrong_specification'"
            " (details: stol), version should be an integral value > 0",
        ),
        (
            "99999999999999999999",
            "StatusCode.INVALID_ARGUMENT",
            "failed to get model version from specified version string '99999999999999999999'"
            " (details: stol), version should be an integral value > 0",
        ),
        (
            "-1",
            "StatusCode.INVALID_ARGUMENT",
            "invalid model version specified '-1' , version should be an integral value > 0",
        ),
        (
            "0",
            "StatusCode.NOT_FOUND",
            "Request for unknown model: 'identity_fp32' version 0 is not found",
        ),
    ],
)
def test_malformed_version_strings(
    grpc_client: grpcclient.InferenceServerClient, version: str, status: str, message: str
) -> None:
    """As Triton 2.51 reads them (C's stol): checked on every call that names a version."""
    calls = (
        lambda: grpc_client.infer("identity_fp32", [fp32_input([1, 2])], model_version=version),
        lambda: grpc_client.get_model_metadata("identity_fp32", model_version=version),
        lambda: grpc_client.get_model_config("identity_fp32", model_version=version),
    )
    for call in calls:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert (info.value.status(), info.value.message()) == (status, message)
    if status == "StatusCode.NOT_FOUND":  # a version that parses is just not ready
        assert not grpc_client.is_model_ready("identity_fp32", model_version=version)
    else:
        with pytest.raises(InferenceServerException) as info:
            grpc_client.is_model_ready("identity_fp32", model_version=version)
        assert info.value.message() == message
    # stol reads the leading digits and ignores the rest.
    assert grpc_client.get_model_metadata("identity_fp32", model_version="1a").versions == ["1"]
    still_serving(grpc_client)


def test_a_stream_message_that_does_not_parse_fails_alone(server) -> None:
    import grpc
    from tritonclient.grpc import service_pb2

    channel = grpc.insecure_channel(server.grpc_url)
    stream = channel.stream_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=lambda data: data,
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )
    good = service_pb2.ModelInferRequest(model_name="identity_fp32", id="after")
    tensor = good.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend([1, 2])
    good.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    try:
        replies = list(
            stream(iter([b"\xff\xff\xff\x07junk", good.SerializeToString()]), timeout=30)
        )
    finally:
        channel.close()
    assert len(replies) == 2
    assert replies[0].error_message == (
        "failed to parse the request message: Error parsing message with type"
        " 'inference.ModelInferRequest'"
    )
    assert replies[1].error_message == ""
    assert replies[1].infer_response.id == "after"
