"""The gRPC frontend against a real server, driven by tritonclient.grpc (and raw stubs)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as tc_pb
from tritonclient.grpc import service_pb2_grpc as tc_pb_grpc
from tritonclient.utils import InferenceServerException
from tritonfast._proto import health_pb2, health_pb2_grpc

ml_dtypes = pytest.importorskip("ml_dtypes")

# Datatype -> (identity model, numpy dtype the client sends).
DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
    "BYTES": np.object_,
}

BIG = 2**31 - 1  # message size limit for raw stubs


@pytest.fixture(scope="module")
def channel(server: Any) -> Iterator[grpc.Channel]:
    options = [("grpc.max_send_message_length", BIG), ("grpc.max_receive_message_length", BIG)]
    with grpc.insecure_channel(server.grpc_url, options=options) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> tc_pb_grpc.GRPCInferenceServiceStub:
    return tc_pb_grpc.GRPCInferenceServiceStub(channel)


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        items = [b"", b"\x00", b"a\x00b", b"\xff\xfe\x80", "é".encode(), b"plain"]
        data = np.array([items[i % len(items)] for i in range(count)], dtype=np.object_)
        return data.reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    dtype = np.dtype(DATATYPES[datatype])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(size=shape).astype(dtype)


def identity(
    grpc_client: grpcclient.InferenceServerClient, datatype: str, data: np.ndarray, **kwargs: Any
) -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return grpc_client.infer(f"identity_{datatype.lower()}", [tensor], **kwargs)


def assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    if expected.dtype == np.object_:
        assert got.ravel().tolist() == expected.ravel().tolist()
    else:
        assert got.dtype == expected.dtype
        assert got.tobytes() == expected.tobytes()


# -- health, metadata, configuration -----------------------------------------------------------


def test_server_live_and_ready(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()


def test_model_ready(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_model_ready("identity_fp32")
    assert grpc_client.is_model_ready("identity_fp32", "1")
    assert not grpc_client.is_model_ready("no_such_model")


def test_server_metadata(grpc_client: grpcclient.InferenceServerClient) -> None:
    metadata = grpc_client.get_server_metadata()
    assert metadata.name == "triton"
    assert metadata.version
    assert "model_configuration" in metadata.extensions


def test_model_metadata(grpc_client: grpcclient.InferenceServerClient) -> None:
    metadata = grpc_client.get_model_metadata("identity_fp32")
    assert metadata.name == "identity_fp32"
    assert list(metadata.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "FP32", [-1, -1])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("OUTPUT0", "FP32", [-1, -1])
    ]
    add_sub = grpc_client.get_model_metadata("add_sub", as_json=True)
    assert [i["shape"] for i in add_sub["inputs"]] == [["4"], ["4"]]  # int64 -> JSON string


def test_model_config(grpc_client: grpcclient.InferenceServerClient) -> None:
    config = grpc_client.get_model_config("identity_fp32").config
    assert config.name == "identity_fp32"
    assert config.max_batch_size == 8
    assert config.backend == "python"
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("INPUT0", tc_pb.model__config__pb2.TYPE_FP32, [-1])
    ]
    as_json = grpc_client.get_model_config("identity_bytes", as_json=True)["config"]
    assert as_json["input"][0]["data_type"] == "TYPE_STRING"


def test_metadata_and_config_of_unknown_model(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    for call in (grpc_client.get_model_metadata, grpc_client.get_model_config):
        with pytest.raises(InferenceServerException) as info:
            call("no_such_model")
        assert "no_such_model" in info.value.message()
        assert info.value.status() == "StatusCode.NOT_FOUND"


def test_grpc_health_check(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_unimplemented_rpc_says_so(server: Any) -> None:
    # Health/Watch (a stream of status changes) is the one RPC not implemented.
    channel = grpc.insecure_channel(server.grpc_url)
    try:
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        with pytest.raises(grpc.RpcError) as info:
            next(iter(stream))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "Health/Watch" in (info.value.details() or "")
    finally:
        channel.close()


# -- inference ---------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_round_trips(
    grpc_client: grpcclient.InferenceServerClient, datatype: str
) -> None:
    data = sample(datatype, (2, 5))
    if datatype == "BF16":
        data = np.arange(-5, 5, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 5)
    result = identity(grpc_client, datatype, data)
    output = result.get_output("OUTPUT0")
    assert output.datatype == datatype
    assert list(output.shape) == [2, 5]
    assert_same(result.as_numpy("OUTPUT0"), data)
    # Outputs always travel in raw_output_contents, as Triton sends them.
    response = result.get_response()
    assert len(response.raw_output_contents) == 1
    assert not response.outputs[0].HasField("contents")


def test_bytes_with_nul_and_invalid_utf8(grpc_client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[b"\x00\x00", b"\xc3\x28", b"", b"ok\x00\xff"]], dtype=np.object_)
    result = identity(grpc_client, "BYTES", data)
    assert result.as_numpy("OUTPUT0").tolist() == data.tolist()


def test_request_id_is_echoed(grpc_client: grpcclient.InferenceServerClient) -> None:
    result = identity(grpc_client, "INT32", sample("INT32", (1, 3)), request_id="my-id-42")
    assert result.get_response().id == "my-id-42"
    assert result.get_response().model_name == "identity_int32"
    assert result.get_response().model_version == "1"


def test_tensors_larger_than_4_mib(grpc_client: grpcclient.InferenceServerClient) -> None:
    data = np.arange(3_000_000, dtype=np.float32).reshape(1, -1)  # 12 MB each way
    assert_same(identity(grpc_client, "FP32", data).as_numpy("OUTPUT0"), data)
    text = np.array([[b"x" * (5 * 1024 * 1024), b"\x00" * 7]], dtype=np.object_)
    assert identity(grpc_client, "BYTES", text).as_numpy("OUTPUT0").tolist() == text.tolist()


def test_requested_output_subset(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[1.5, 2.5]], dtype=np.float32))
    everything = grpc_client.infer("batching", [tensor])
    assert {o.name for o in everything.get_response().outputs} == {"OUTPUT0", "BATCH_REQUESTS"}
    only = grpc_client.infer(
        "batching", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")]
    )
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT0"]
    assert only.as_numpy("OUTPUT0").tolist() == [[1.5, 2.5]]


def test_request_parameters_reach_the_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    params = {"flag": True, "count": 7, "name": "zed", "ratio": 0.25}
    result = grpc_client.infer("params", [tensor], request_id="p1", parameters=params)
    echoed = result.get_response(as_json=True)["parameters"]
    assert echoed["flag"] == {"bool_param": True}
    assert echoed["count"] == {"int64_param": "7"}
    assert echoed["name"] == {"string_param": "zed"}
    assert echoed["ratio"] == {"double_param": 0.25}
    assert echoed["seen_request_id"] == {"string_param": "p1"}


def test_protocol_parameters_do_not_reach_the_model(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """As in Triton 2.51: the server acts on these; the model's parameters() holds the rest."""
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    result = grpc_client.infer(
        "params",
        [tensor],
        sequence_id=5,
        sequence_start=True,
        sequence_end=True,
        priority=1,
        timeout=100000,
        parameters={"custom": "kept"},
    )
    echoed = result.get_response(as_json=True)["parameters"]
    assert set(echoed) == {"custom", "seen_request_id"}


def _typed_request(model: str, datatype: str, shape: list[int]) -> tc_pb.ModelInferRequest:
    request = tc_pb.ModelInferRequest(model_name=model, id="typed")
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    return request


@pytest.mark.parametrize(
    ("datatype", "field", "values"),
    [
        ("FP32", "fp32_contents", [1.5, -2.0, 3.25]),
        ("FP64", "fp64_contents", [1e300, -0.5, 2.0]),
        ("INT8", "int_contents", [-128, 0, 127]),
        ("INT16", "int_contents", [-32768, 1, 32767]),
        ("INT32", "int_contents", [-(2**31), 0, 2**31 - 1]),
        ("INT64", "int64_contents", [-(2**63), 0, 2**63 - 1]),
        ("UINT8", "uint_contents", [0, 128, 255]),
        ("UINT16", "uint_contents", [0, 1, 65535]),
        ("UINT32", "uint_contents", [0, 1, 2**32 - 1]),
        ("UINT64", "uint64_contents", [0, 1, 2**64 - 1]),
        ("BOOL", "bool_contents", [True, False, True]),
        ("BYTES", "bytes_contents", [b"a\x00", b"\xff", b""]),
    ],
)
def test_typed_contents(
    stub: tc_pb_grpc.GRPCInferenceServiceStub, datatype: str, field: str, values: list[Any]
) -> None:
    request = _typed_request(f"identity_{datatype.lower()}", datatype, [1, 3])
    getattr(request.inputs[0].contents, field).extend(values)
    response = stub.ModelInfer(request, timeout=30)
    result = grpcclient.InferResult(response)
    got = result.as_numpy("OUTPUT0")
    assert got.ravel().tolist() == values
    assert response.id == "typed"


# -- streaming ---------------------------------------------------------------------------------


def test_stream_with_an_error_in_the_middle(grpc_client: grpcclient.InferenceServerClient) -> None:
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        data = np.array([[1.0, 2.0]], dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(data)
        grpc_client.async_stream_infer("identity_fp32", [tensor], request_id="s1")
        grpc_client.async_stream_infer("no_such_model", [tensor], request_id="s2")
        grpc_client.async_stream_infer("identity_fp32", [tensor], request_id="s3")
        got = [replies.get(timeout=60) for _ in range(3)]
        # The stream is still open after the error: one more round trip.
        grpc_client.async_stream_infer("identity_fp32", [tensor], request_id="s4")
        got.append(replies.get(timeout=60))
    finally:
        grpc_client.stop_stream()

    (r1, e1), (r2, e2), (r3, e3), (r4, e4) = got
    assert e1 is None and e3 is None and e4 is None
    assert [r.get_response().id for r in (r1, r3, r4)] == ["s1", "s3", "s4"]
    assert r3.as_numpy("OUTPUT0").tolist() == data.tolist()
    assert r2 is None
    assert isinstance(e2, InferenceServerException)
    assert "no_such_model" in e2.message()


def test_raw_stream_error_message_carries_request_id(
    stub: tc_pb_grpc.GRPCInferenceServiceStub,
) -> None:
    good = _typed_request("identity_fp32", "FP32", [1, 1])
    good.inputs[0].contents.fp32_contents.append(4.0)
    bad = tc_pb.ModelInferRequest(model_name="identity_fp32", id="bad")
    bad.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    bad.raw_input_contents.append(b"\x00" * 4)  # half the bytes
    replies = list(stub.ModelStreamInfer(iter([good, bad, good]), timeout=60))
    assert [r.error_message == "" for r in replies] == [True, False, True]
    assert replies[1].infer_response.id == "bad"
    assert "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'" in (
        replies[1].error_message
    )
    assert grpcclient.InferResult(replies[2].infer_response).as_numpy("OUTPUT0").tolist() == [[4.0]]


def test_classification_extension(grpc_client: grpcclient.InferenceServerClient) -> None:
    scores = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    scores.set_data_from_numpy(np.array([[0.1, 0.7, 0.15, 0.05]], np.float32))
    result = grpc_client.infer(
        "classify_fp32",
        [scores],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)],
    )
    assert result.as_numpy("OUTPUT0").tolist() == [
        [b"0.700000:1:dog", b"0.150000:2:bird", b"0.100000:0:cat"]
    ]
    values = grpcclient.InferInput("INPUT0", [5], "INT32")
    values.set_data_from_numpy(np.array([4, 9, -1, 9, 2], np.int32))
    result = grpc_client.infer(
        "classify_int32",
        [values],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)],
    )
    assert result.as_numpy("OUTPUT0").tolist() == [b"9:1", b"9:3"]
