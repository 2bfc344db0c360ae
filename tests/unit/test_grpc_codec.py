"""The gRPC codec: tensors of every datatype and shape survive the wire exactly.

Requests are built the way tritonclient builds them (raw little-endian bytes, BYTES as
4-byte length prefixes) or with typed ``contents``; responses are read back with
tritonclient's own ``InferResult``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.data.types import InferResponse, OutputTensor
from tritonfast.errors import Code, InvalidArgumentError, TritonError, UnsupportedError
from tritonfast.frontends.grpc import codec
from tritonfast.memory import sharedmemory

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
tc_utils = pytest.importorskip("tritonclient.utils")
tc_service = pytest.importorskip("tritonclient.grpc.service_pb2")

FIXED_TYPES = [name for name in NUMPY_DTYPES if name != "BYTES"]
ALL_TYPES = [*FIXED_TYPES, "BYTES"]

# Which typed-contents member carries each datatype (FP16 and BF16 have none).
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw: st.DrawFn, datatypes: list[str] = ALL_TYPES) -> tuple[str, np.ndarray]:
    datatype = draw(st.sampled_from(datatypes))
    shape = draw(shapes)
    if datatype == "BYTES":
        count = int(np.prod(shape))
        items = draw(st.lists(st.binary(max_size=12), min_size=count, max_size=count))
        array = np.empty(count, dtype=np.object_)
        array[:] = items
        return datatype, array.reshape(shape)
    return datatype, draw(hnp.arrays(NUMPY_DTYPES[datatype], shape))


def same_tensor(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if a.dtype == np.object_ or b.dtype == np.object_:
        return [bytes(x) for x in a.ravel()] == [bytes(x) for x in b.ravel()]
    return a.dtype.itemsize == b.dtype.itemsize and a.tobytes() == b.tobytes()


def raw_request(datatype: str, array: np.ndarray, model: str = "m") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id="r1")
    message.inputs.add(name="INPUT0", datatype=datatype, shape=array.shape)
    if datatype == "BYTES":
        serialized = tc_utils.serialize_byte_tensor(array)
        data = serialized.item() if serialized.size else b""
    else:
        data = array.tobytes()
    message.raw_input_contents.append(data)
    return message


def typed_request(datatype: str, array: np.ndarray) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="INPUT0", datatype=datatype, shape=array.shape)
    tensor.contents.SetInParent()
    values: Any = array.ravel().tolist()
    getattr(tensor.contents, TYPED_FIELD[datatype]).extend(values)
    return message


# -- round trips -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors())
def test_raw_inputs_round_trip(tensor: tuple[str, np.ndarray]) -> None:
    datatype, array = tensor
    # Serialize and parse, as the server receives it.
    message = pb.ModelInferRequest.FromString(raw_request(datatype, array).SerializeToString())
    decoded = codec.decode_infer_request(message)
    (received,) = decoded.inputs
    assert received.datatype == datatype
    assert received.shape == array.shape
    assert received.data.dtype == NUMPY_DTYPES[datatype]
    assert same_tensor(received.data, array)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors([t for t in ALL_TYPES if t in TYPED_FIELD]))
def test_typed_inputs_round_trip(tensor: tuple[str, np.ndarray]) -> None:
    datatype, array = tensor
    message = pb.ModelInferRequest.FromString(typed_request(datatype, array).SerializeToString())
    (received,) = codec.decode_infer_request(message).inputs
    assert received.data.dtype == NUMPY_DTYPES[datatype]
    assert same_tensor(received.data, array)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors())
def test_outputs_round_trip_through_tritonclient(tensor: tuple[str, np.ndarray]) -> None:
    datatype, array = tensor
    response = InferResponse(
        model_name="m",
        model_version="1",
        id="req",
        outputs=[OutputTensor("OUTPUT0", datatype, array.shape, array)],
    )
    wire = codec.encode_infer_response(response).SerializeToString()
    result = tritonclient_grpc.InferResult(tc_service.ModelInferResponse.FromString(wire))
    got = result.as_numpy("OUTPUT0")
    assert result.get_response().id == "req"
    assert same_tensor(np.asarray(got), array)


def test_raw_inputs_are_views_not_copies() -> None:
    array = np.arange(1024, dtype=np.float32)
    message = raw_request("FP32", array)
    (received,) = codec.decode_infer_request(message).inputs
    assert not received.data.flags.owndata
    assert not received.data.flags.writeable


def raw_bytes(datatype: str, data: np.ndarray) -> bytes:
    """A tensor's wire bytes, as a response's raw_output_contents carry them."""
    return bytes(rawtensor.to_raw(datatype, data))


def test_bytes_with_nul_and_invalid_utf8() -> None:
    items = [b"", b"\x00", b"a\x00b", b"\xff\xfe\x80", "é".encode()]
    array = np.array(items, dtype=np.object_)
    (received,) = codec.decode_infer_request(raw_request("BYTES", array)).inputs
    assert list(received.data) == items
    wire = raw_bytes("BYTES", array)
    assert rawtensor.split_bytes(memoryview(wire)) == items
    # str elements are sent as UTF-8.
    assert raw_bytes("BYTES", np.array(["é"], dtype=np.object_)) == (
        b"\x02\x00\x00\x00" + "é".encode()
    )


def test_bf16_outputs_accept_uint16_and_bfloat16() -> None:
    bits = np.array([0x3F80, 0xC000], dtype=np.uint16)  # 1.0, -2.0
    assert raw_bytes("BF16", bits) == bits.tobytes()
    ml_dtypes = pytest.importorskip("ml_dtypes")
    as_bf16 = np.array([1.0, -2.0], dtype=ml_dtypes.bfloat16)
    assert raw_bytes("BF16", as_bf16) == bits.tobytes()


def test_requested_outputs_and_id_echo() -> None:
    response = InferResponse(
        model_name="m",
        model_version="1",
        outputs=[
            OutputTensor("A", "INT32", (1,), np.array([1], dtype=np.int32)),
            OutputTensor("B", "INT32", (1,), np.array([2], dtype=np.int32)),
        ],
        parameters={"flag": True, "n": 3, "big": 2**64 - 1, "x": 0.5, "s": "t"},
    )
    message = codec.encode_infer_response(response, ["B"], request_id="abc")
    assert [o.name for o in message.outputs] == ["B"]
    assert message.raw_output_contents == [np.array([2], dtype=np.int32).tobytes()]
    assert message.id == "abc"
    assert codec.decode_parameters(message.parameters) == response.parameters
    assert message.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"


def test_request_fields_and_parameters() -> None:
    message = raw_request("INT32", np.array([1, 2], dtype=np.int32))
    message.model_version = "3"
    message.parameters["sequence_id"].int64_param = 7
    message.parameters["sequence_start"].bool_param = True
    message.parameters["priority"].uint64_param = 2
    message.parameters["custom"].string_param = "v"
    message.parameters["ratio"].double_param = 0.5
    message.inputs[0].parameters["tag"].int64_param = 4
    out = message.outputs.add(name="OUTPUT0")
    out.parameters["classification"].int64_param = 2
    request = codec.decode_infer_request(message)
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "r1")
    assert request.parameters == {
        "sequence_id": 7,
        "sequence_start": True,
        "priority": 2,
        "custom": "v",
        "ratio": 0.5,
    }
    assert request.inputs[0].parameters == {"tag": 4}
    assert request.outputs is not None
    assert [(o.name, o.parameters) for o in request.outputs] == [("OUTPUT0", {"classification": 2})]
    no_outputs = codec.decode_infer_request(raw_request("INT32", np.array([1], np.int32)))
    assert no_outputs.outputs is None


# -- wire-level errors ---------------------------------------------------------------------------


def _error(message: pb.ModelInferRequest) -> TritonError:
    with pytest.raises(TritonError) as info:
        codec.decode_infer_request(message)
    return info.value


def test_byte_size_mismatch() -> None:
    message = raw_request("FP32", np.zeros(4, dtype=np.float32))
    message.raw_input_contents[0] = b"\x00" * 12
    error = _error(message)
    assert isinstance(error, InvalidArgumentError)
    assert error.message == (
        "[request id: r1] input byte size mismatch for input 'INPUT0' for model 'm'. "
        "Expected 16, got 12"
    )


def test_missing_raw_contents() -> None:
    message = raw_request("FP32", np.zeros(2, dtype=np.float32))
    message.inputs.add(name="INPUT1", datatype="FP32", shape=[2])
    assert _error(message).message == (
        "unable to find data for input tensor 'INPUT1' for model 'm' in request."
    )


def test_surplus_raw_contents() -> None:
    message = raw_request("FP32", np.zeros(2, dtype=np.float32))
    message.raw_input_contents.append(b"\x00" * 8)
    error = _error(message)
    assert error.code is Code.INVALID_ARG
    assert "raw_input_contents has 2 entries but only 1 inputs" in error.message


def test_contents_and_raw_together() -> None:
    message = raw_request("FP32", np.zeros(2, dtype=np.float32))
    message.inputs.add(name="INPUT1", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    assert _error(message).message == (
        "contents field must not be specified when using raw_input_contents for 'INPUT1' "
        "for model 'm'"
    )


def test_typed_contents_of_the_wrong_type() -> None:
    message = typed_request("FP32", np.zeros(2, dtype=np.float32))
    message.inputs[0].datatype = "FP16"
    assert _error(message).message == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'm' of type "
        "'FP32', expected datatype 'FP16'"
    )
    message = typed_request("INT32", np.zeros(2, dtype=np.int32))
    message.inputs[0].contents.fp32_contents.append(1.0)
    assert _error(message).message == (
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'm', "
        "binary data was already supplied."
    )


def test_typed_contents_count_mismatch() -> None:
    message = typed_request("INT64", np.zeros(3, dtype=np.int64))
    message.inputs[0].shape[:] = [4]
    assert _error(message).message == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
        "'m'. Expected 32, got 24"
    )


def test_bytes_element_errors() -> None:
    message = raw_request("BYTES", np.array([b"ab", b"c"], dtype=np.object_))
    message.inputs[0].shape[:] = [3]
    assert _error(message).message == (
        "[request id: r1] expected 3 string elements for inference input 'INPUT0' for model "
        "'m', got 2"
    )
    message.raw_input_contents[0] = b"\x05\x00\x00\x00abc"
    assert "incomplete string data for inference input 'INPUT0'" in _error(message).message
    message.raw_input_contents[0] = b"\x01\x00\x00\x00a\x00\x00"
    assert "element byte size indicator exceeds the end of the buffer" in _error(message).message


def test_negative_dimension() -> None:
    message = raw_request("FP32", np.zeros(2, dtype=np.float32))
    message.inputs[0].shape[:] = [-1]
    assert _error(message).message == (
        "[request id: r1] All input dimensions should be specified for input 'INPUT0' for "
        "model 'm', got [-1]"
    )


def test_unknown_datatype() -> None:
    message = raw_request("FP32", np.zeros(2, dtype=np.float32))
    message.inputs[0].datatype = "FP8"
    error = _error(message)
    assert error.code is Code.INVALID_ARG
    assert "invalid datatype 'FP8' for input tensor 'INPUT0'" in error.message


def _shm_request(**parameters: Any) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    for key, value in parameters.items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value
    return message


def test_shared_memory_input_is_left_for_the_data_plane() -> None:
    message = _shm_request(
        shared_memory_region="r", shared_memory_offset=8, shared_memory_byte_size=4
    )
    message.raw_input_contents.append(b"")  # an shm input takes no raw slot: this is surplus
    assert "raw_input_contents has 1 entries" in _error(message).message
    del message.raw_input_contents[:]
    request = codec.decode_infer_request(message)
    assert request.uses_shared_memory
    assert request.inputs[0].data is sharedmemory.NO_DATA
    assert request.inputs[0].parameters["shared_memory_offset"] == 8


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (
            {"shared_memory_region": "r"},
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region'"
            " parameter for tensor 'INPUT0'",
        ),
        (
            {"shared_memory_offset": 4},
            "'shared_memory_offset' can not be specified without 'shared_memory_region'"
            " parameter for tensor 'INPUT0'",
        ),
        (
            {"shared_memory_region": 3, "shared_memory_byte_size": 4},
            "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0',"
            " expected string_param.",
        ),
    ],
)
def test_incomplete_shared_memory_parameters(parameters: dict[str, Any], expected: str) -> None:
    error = _error(_shm_request(**parameters))
    assert error.code is Code.INVALID_ARG
    assert error.message == expected


def test_shared_memory_input_with_contents_is_refused() -> None:
    message = _shm_request(shared_memory_region="r", shared_memory_byte_size=4)
    message.inputs[0].contents.fp32_contents.append(1.0)
    assert _error(message).message == (
        "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' for"
        " model 'm'"
    )


def test_output_in_shared_memory_keeps_an_empty_raw_slot() -> None:
    response = InferResponse(
        "m",
        "1",
        outputs=[
            OutputTensor("A", "FP32", (1,), sharedmemory.NO_DATA, in_shared_memory=True),
            OutputTensor("B", "FP32", (1,), np.ones(1, np.float32)),
        ],
    )
    message = codec.encode_infer_response(response)
    assert [o.name for o in message.outputs] == ["A", "B"]
    assert list(message.raw_output_contents) == [b"", np.ones(1, np.float32).tobytes()]


@pytest.mark.parametrize(
    ("key", "setter", "expected"),
    [
        ("sequence_id", "double_param", "expected int64_param or string_param."),
        ("sequence_start", "int64_param", "expected bool_param."),
        ("priority", "string_param", "expected int64_param or uint64_param."),
        ("timeout", "bool_param", "expected int64_param."),
        ("custom", "uint64_param", "expected int64_param, bool_param, or string_param."),
    ],
)
def test_parameter_type_errors(key: str, setter: str, expected: str) -> None:
    message = raw_request("FP32", np.zeros(1, dtype=np.float32))
    setattr(message.parameters[key], setter, "x" if setter == "string_param" else 1)
    assert _error(message).message == f"invalid value type for '{key}' parameter, {expected}"


def test_reserved_and_negative_priority_parameters() -> None:
    message = raw_request("FP32", np.zeros(1, dtype=np.float32))
    message.parameters["triton_secret"].bool_param = True
    assert "keys starting with 'triton_' are reserved" in _error(message).message
    message = raw_request("FP32", np.zeros(1, dtype=np.float32))
    message.parameters["priority"].int64_param = -1
    assert _error(message).message == "invalid value for 'priority', expected value >= 0."


def test_every_error_code_has_a_grpc_status() -> None:
    assert set(codec.GRPC_STATUS) == set(Code)
    assert codec.grpc_status(UnsupportedError("x")).name == "UNIMPLEMENTED"
    assert codec.grpc_status(InvalidArgumentError("x")).name == "INVALID_ARGUMENT"


def test_metadata_encoding() -> None:
    metadata = {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
    }
    message = codec.encode_model_metadata(metadata)
    assert message.name == "add_sub" and list(message.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in message.outputs] == [
        ("OUTPUT0", "FP32", [-1, 4])
    ]
    server = codec.encode_server_metadata({"name": "triton", "version": "1", "extensions": ["a"]})
    assert (server.name, server.version, list(server.extensions)) == ("triton", "1", ["a"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tensors=st.lists(st.binary(max_size=300), max_size=4),
    request_id=st.text(max_size=5),
)
def test_tensors_bypass_protobuf_without_changing_the_wire(
    tensors: list[bytes], request_id: str
) -> None:
    # A request parsed by splitting out raw_input_contents equals protobuf's own parse...
    message = pb.ModelInferRequest(model_name="m", id=request_id)
    for index, data in enumerate(tensors):
        message.inputs.add(name=f"I{index}", datatype="UINT8", shape=[len(data)])
        message.raw_input_contents.append(data)
    wire = message.SerializeToString()
    parsed, raws = codec.parse_infer_request(wire)
    assert [bytes(r) for r in raws] == tensors
    parsed.raw_input_contents.extend(bytes(r) for r in raws)
    assert parsed == pb.ModelInferRequest.FromString(wire)
    # ...and a response serialized with appended tensors decodes to the protobuf message.
    response = InferResponse(
        "m",
        "1",
        request_id,
        [
            OutputTensor(f"O{i}", "UINT8", (len(d),), np.frombuffer(d, np.uint8))
            for i, d in enumerate(tensors)
        ],
    )
    serialized = codec.serialize_infer_response(response)
    assert pb.ModelInferResponse.FromString(serialized) == codec.encode_infer_response(response)


def test_malformed_request_bytes() -> None:
    with pytest.raises(InvalidArgumentError, match="malformed"):
        codec.parse_infer_request(b"\x3a\x05ab")  # a field longer than the message
    with pytest.raises(InvalidArgumentError, match="malformed"):
        codec.parse_infer_request(b"\x0a\x02\xff")  # model_name cut short


def test_load_parameters_have_tritons_types() -> None:
    request = pb.RepositoryModelLoadRequest(model_name="m")
    request.parameters["config"].string_param = "{}"
    request.parameters["file:1/model.py"].bytes_param = b"code"
    assert codec.decode_load_parameters(request.parameters) == {
        "config": "{}",
        "file:1/model.py": b"code",
    }
    request.parameters["config"].bytes_param = b"{}"
    with pytest.raises(InvalidArgumentError, match="'config', expected string_param"):
        codec.decode_load_parameters(request.parameters)
    other = pb.RepositoryModelLoadRequest(model_name="m")
    other.parameters["foo"].bool_param = True
    with pytest.raises(InvalidArgumentError, match="unrecognized load parameter 'foo'"):
        codec.decode_load_parameters(other.parameters)
    unload = pb.RepositoryModelUnloadRequest(model_name="m")
    assert codec.decode_unload_dependents(unload.parameters) is False
    unload.parameters["unload_dependents"].string_param = "yes"
    with pytest.raises(InvalidArgumentError, match="expected bool_param"):
        codec.decode_unload_dependents(unload.parameters)
