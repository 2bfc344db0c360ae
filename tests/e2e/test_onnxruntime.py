"""ONNX models served by the onnxruntime backend: generated models (tests/onnx_models.py) in a
temporary repository, with and without config.pbtxt, driven by tritonclient over HTTP (JSON
and binary), gRPC and system shared memory; every answer compared with onnxruntime run
directly on the same file."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.conftest import RunningServer, start_server

ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
onnx_models = pytest.importorskip("tests.onnx_models", reason="the onnx package is not installed")

MLP_BATCHED = """
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 200000 preferred_batch_size: [ 8 ] }
"""
MLP_TWO = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "execution_mode" value: { string_value: "0" } }
optimization { graph { level: 1 } }
"""
MLP_RESHAPED = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape { shape: [ 16 ] } } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 2, 4 ] reshape { shape: [ 8 ] } } ]
"""
OPTIONAL_INPUT = """
backend: "onnxruntime"
max_batch_size: 0
input [
  { name: "A" data_type: TYPE_FP32 dims: [ -1, 2 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 1, 2 ] optional: true }
]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
"""
WRONG_DTYPE = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
"""
WRONG_DIMS = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 15 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
"""
ACCUMULATOR = """
backend: "onnxruntime"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [
    {
      input_name: "SUM_IN"
      output_name: "SUM_OUT"
      data_type: TYPE_FP32
      dims: [ 1 ]
      initial_state: { data_type: TYPE_FP32 dims: [ 1 ] name: "zero" zero_data: true }
    }
  ]
}
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORR" data_type: TYPE_UINT64 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
FIXED_BATCHING = """
backend: "onnxruntime"
max_batch_size: 4
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("onnx_repo")
    write = onnx_models.write_onnx
    write(repo, "mlp_auto", onnx_models.mlp())
    write(repo, "mlp_batched", onnx_models.mlp(), MLP_BATCHED)
    write(repo, "mlp_two", onnx_models.mlp(), MLP_TWO)
    write(repo, "mlp_reshaped", onnx_models.mlp(), MLP_RESHAPED)
    write(repo, "mixed", onnx_models.mixed_types())
    write(repo, "fixed", onnx_models.fixed_shape())
    write(repo, "optional", onnx_models.with_optional_input(), OPTIONAL_INPUT)
    write(repo, "reshape_to_four", onnx_models.reshape_to_four())
    # Models that must not load, next to the others.
    write(repo, "wrong_dtype", onnx_models.mlp(), WRONG_DTYPE)
    write(repo, "wrong_dims", onnx_models.mlp(), WRONG_DIMS)
    write(repo, "fixed_batching", onnx_models.fixed_shape(), FIXED_BATCHING)
    write(repo, "unknown_op", onnx_models.unknown_operator())
    write(repo, "accumulator", onnx_models.accumulator(), ACCUMULATOR)
    (repo / "garbage" / "1").mkdir(parents=True)
    (repo / "garbage" / "1" / "model.onnx").write_bytes(b"this is not an onnx model")
    return repo


@pytest.fixture(scope="module")
def onnx_server(
    repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    server = start_server(
        [repository], tmp_path_factory.mktemp("onnx") / "server.log", "--exit-on-error=false"
    )
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def http(onnx_server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(onnx_server.http_url, concurrency=16)
    yield client
    client.close()


@pytest.fixture
def grpc(onnx_server: RunningServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(onnx_server.grpc_url)
    yield client
    client.close()


def direct(repository: Path, model: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """What onnxruntime itself computes from the model file."""
    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"))
    return list(session.run(None, feeds))


def http_input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> Any:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def grpc_input(name: str, array: np.ndarray, datatype: str) -> Any:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def rows(count: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 16), np.float32)


# -- auto-complete ------------------------------------------------------------------------------
def test_auto_complete_follows_tritons_onnxruntime_rules(http: Any) -> None:
    config = http.get_model_config("mlp_auto")
    # Every tensor's first dimension is variable: max_batch_size 4 (Triton's default-max-
    # batch-size) and dynamic batching; the batch dimension left out of dims.
    assert config["max_batch_size"] == 4
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT", "TYPE_FP32", [16])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT", "TYPE_FP32", [8])
    ]
    assert config["backend"] == "onnxruntime" and config["platform"] == "onnxruntime_onnx"
    assert config["default_model_filename"] == "model.onnx"
    # Two instances of a CPU group without a count, as Triton starts for this backend.
    assert config["instance_group"][0]["count"] == 2
    assert config["instance_group"][0]["kind"] == "KIND_CPU"

    mixed = http.get_model_config("mixed")
    types = {t["name"]: (t["data_type"], t["dims"]) for t in mixed["input"] + mixed["output"]}
    assert types == {
        "INT64_IN": ("TYPE_INT64", [4]),
        "BOOL_IN": ("TYPE_BOOL", [4]),
        "STR_IN": ("TYPE_STRING", [2]),
        "FP16_IN": ("TYPE_FP16", [3]),
        "UINT8_IN": ("TYPE_UINT8", [5]),
        "INT64_OUT": ("TYPE_INT64", [4]),
        "BOOL_OUT": ("TYPE_BOOL", [4]),
        "STR_OUT": ("TYPE_STRING", [2]),
        "FP16_OUT": ("TYPE_FP16", [3]),
        "INT32_OUT": ("TYPE_INT32", [3]),
        "UINT8_OUT": ("TYPE_UINT8", [5]),
    }

    fixed = http.get_model_config("fixed")  # a fixed first dimension: no batching
    assert fixed["max_batch_size"] == 0
    assert "dynamic_batching" not in fixed
    assert fixed["input"][0]["dims"] == [2, 3] and fixed["output"][0]["dims"] == [2, 3]


def test_config_with_inputs_and_outputs_is_left_as_written(http: Any) -> None:
    config = http.get_model_config("mlp_two")
    assert config["max_batch_size"] == 8
    assert "dynamic_batching" not in config  # auto-complete skipped: nothing added
    assert config["backend"] == "onnxruntime"  # from the platform, as Triton fills it in


# -- answers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("binary", [True, False])
def test_mlp_over_http_matches_onnxruntime(http: Any, repository: Path, binary: bool) -> None:
    batch = rows(3)
    result = http.infer("mlp_auto", [http_input("INPUT", batch, "FP32", binary)])
    (expected,) = direct(repository, "mlp_auto", {"INPUT": batch})
    np.testing.assert_allclose(result.as_numpy("OUTPUT"), expected, rtol=1e-5, atol=1e-5)


def test_mlp_over_grpc_matches_onnxruntime(grpc: Any, repository: Path) -> None:
    batch = rows(2, seed=7)
    result = grpc.infer("mlp_two", [grpc_input("INPUT", batch, "FP32")])
    (expected,) = direct(repository, "mlp_two", {"INPUT": batch})
    np.testing.assert_allclose(result.as_numpy("OUTPUT"), expected, rtol=1e-5, atol=1e-5)


def mixed_feeds() -> dict[str, np.ndarray]:
    return {
        "INT64_IN": np.array([[1, -2, 3, 2**40], [0, 5, 6, 7]], np.int64),
        "BOOL_IN": np.array([[True, False, True, False], [False, False, True, True]]),
        "STR_IN": np.array([[b"alpha", b""], ["\u00e9t\u00e9".encode(), b"z" * 300]], object),
        "FP16_IN": np.array([[0.5, -1.25, 3.0], [7.5, 0.0, -2.0]], np.float16),
        "UINT8_IN": np.array([[0, 1, 2, 254, 255], [9, 8, 7, 6, 5]], np.uint8),
    }


DATATYPES = {"INT64": np.int64, "BOOL": np.bool_, "BYTES": object, "FP16": np.float16}


def _wire(name: str) -> str:
    return {
        "INT64_IN": "INT64",
        "BOOL_IN": "BOOL",
        "STR_IN": "BYTES",
        "FP16_IN": "FP16",
        "UINT8_IN": "UINT8",
    }[name]


def expected_mixed(repository: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ort_feeds = dict(feeds)
    ort_feeds["STR_IN"] = np.vectorize(lambda b: b.decode(), otypes=[object])(feeds["STR_IN"])
    names = ["INT64_OUT", "BOOL_OUT", "STR_OUT", "FP16_OUT", "INT32_OUT", "UINT8_OUT"]
    outputs = dict(zip(names, direct(repository, "mixed", ort_feeds), strict=True))
    outputs["STR_OUT"] = np.vectorize(lambda s: s.encode(), otypes=[object])(outputs["STR_OUT"])
    return outputs


@pytest.mark.parametrize("protocol", ["http-binary", "http-json", "grpc"])
def test_every_datatype_and_bytes_round_trip(
    http: Any, grpc: Any, repository: Path, protocol: str
) -> None:
    feeds = mixed_feeds()
    if protocol == "grpc":
        result = grpc.infer("mixed", [grpc_input(n, a, _wire(n)) for n, a in feeds.items()])
    else:
        binary = protocol == "http-binary"
        tensors = [http_input(n, a, _wire(n), binary) for n, a in feeds.items()]
        result = http.infer("mixed", tensors)
    for name, want in expected_mixed(repository, feeds).items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        assert got.tolist() == want.tolist(), name


def test_requested_outputs_only(http: Any) -> None:
    feeds = mixed_feeds()
    tensors = [http_input(n, a, _wire(n)) for n, a in feeds.items()]
    result = http.infer("mixed", tensors, outputs=[httpclient.InferRequestedOutput("INT32_OUT")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["INT32_OUT"]
    assert result.as_numpy("INT32_OUT").tolist() == [[0, -1, 3], [7, 0, -2]]


def test_fixed_shape_model_without_batching(http: Any) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = http.infer("fixed", [http_input("X", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("Y"), x + 1)


def test_reshape_of_inputs_and_outputs(http: Any, repository: Path) -> None:
    batch = rows(3, seed=3)
    result = http.infer("mlp_reshaped", [http_input("INPUT", batch.reshape(3, 4, 4), "FP32")])
    (expected,) = direct(repository, "mlp_reshaped", {"INPUT": batch})
    got = result.as_numpy("OUTPUT")
    assert got.shape == (3, 2, 4)
    np.testing.assert_allclose(got.reshape(3, 8), expected, rtol=1e-5, atol=1e-5)


def test_optional_input_may_be_left_out(http: Any) -> None:
    a = np.array([[1, 2], [3, 4]], np.float32)
    alone = http.infer("optional", [http_input("A", a, "FP32")])
    np.testing.assert_array_equal(alone.as_numpy("SUM"), a)  # the initializer's zeros
    b = np.array([[10, 20]], np.float32)
    both = http.infer("optional", [http_input("A", a, "FP32"), http_input("B", b, "FP32")])
    np.testing.assert_array_equal(both.as_numpy("SUM"), a + b)


# -- batching and instances ---------------------------------------------------------------------
def infer_concurrently(http: Any, model: str, inputs: list[np.ndarray]) -> list[Any]:
    """All of ``inputs`` in flight at once (the client's connection pool), in order."""
    handles = [http.async_infer(model, [http_input("INPUT", x, "FP32")]) for x in inputs]
    return [handle.get_result() for handle in handles]


def test_concurrent_requests_run_as_one_batch(http: Any, repository: Path) -> None:
    before = http.get_inference_statistics("mlp_batched")["model_stats"][0]
    inputs = [rows(1, seed=100 + i) for i in range(8)]
    results = infer_concurrently(http, "mlp_batched", inputs)
    (expected,) = direct(repository, "mlp_batched", {"INPUT": np.concatenate(inputs)})
    for index, result in enumerate(results):
        np.testing.assert_allclose(
            result.as_numpy("OUTPUT"), expected[index : index + 1], rtol=1e-5, atol=1e-5
        )
    after = http.get_inference_statistics("mlp_batched")["model_stats"][0]
    requests = (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 8
    assert executions < requests  # batched: preferred size 8 within a 200 ms window
    batch_stats = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert max(batch_stats) > 1


def test_two_instances_answer_concurrently_and_exactly(http: Any, repository: Path) -> None:
    inputs = [rows(1 + i % 4, seed=200 + i) for i in range(24)]
    results = infer_concurrently(http, "mlp_two", inputs)
    for batch, result in zip(inputs, results, strict=True):
        (expected,) = direct(repository, "mlp_two", {"INPUT": batch})
        np.testing.assert_allclose(result.as_numpy("OUTPUT"), expected, rtol=1e-5, atol=1e-5)
    stats = http.get_inference_statistics("mlp_two")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 24


# -- shared memory ------------------------------------------------------------------------------
def test_system_shared_memory_inputs_and_outputs(grpc: Any, repository: Path) -> None:
    batch = rows(4, seed=9)
    key = f"onnx_{uuid.uuid4().hex[:8]}"
    in_handle = shm.create_shared_memory_region(f"{key}_in", f"/{key}_in", batch.nbytes)
    out_handle = shm.create_shared_memory_region(f"{key}_out", f"/{key}_out", 4 * 8 * 4)
    try:
        shm.set_shared_memory_region(in_handle, [batch])
        grpc.register_system_shared_memory(f"{key}_in", f"/{key}_in", batch.nbytes)
        grpc.register_system_shared_memory(f"{key}_out", f"/{key}_out", 4 * 8 * 4)
        tensor = grpcclient.InferInput("INPUT", [4, 16], "FP32")
        tensor.set_shared_memory(f"{key}_in", batch.nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT")
        output.set_shared_memory(f"{key}_out", 4 * 8 * 4)
        grpc.infer("mlp_two", [tensor], outputs=[output])
        got = shm.get_contents_as_numpy(out_handle, np.float32, [4, 8])
        (expected,) = direct(repository, "mlp_two", {"INPUT": batch})
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    finally:
        grpc.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


# -- errors -------------------------------------------------------------------------------------
def test_bad_models_are_unavailable_with_the_reason(http: Any) -> None:
    index = {m["name"]: m for m in http.get_model_repository_index()}
    for name in ("mlp_auto", "mixed", "fixed", "optional", "mlp_two"):
        assert index[name]["state"] == "READY", index[name]
    reasons = {
        name: index[name].get("reason", "")
        for name in ("wrong_dtype", "wrong_dims", "fixed_batching", "garbage", "unknown_op")
    }
    # As Triton lists a version that failed to load: "<Code>: <message>".
    assert reasons["wrong_dtype"] == (
        "Invalid argument: unable to load model 'wrong_dtype', configuration expects datatype"
        " TYPE_INT32 for input 'INPUT', model provides TYPE_FP32"
    )
    assert reasons["wrong_dims"] == (
        "Invalid argument: model 'wrong_dims', tensor 'INPUT': the model expects 2 dimensions"
        " (shape [-1,16]) but the model configuration specifies 2 dimensions (an initial batch"
        " dimension because max_batch_size > 0 followed by the explicit tensor shape, making"
        " complete shape [-1,15])"
    )
    assert reasons["fixed_batching"] == (
        "Invalid argument: autofill failed for model 'fixed_batching': model does not support"
        " batching while non-zero max_batch_size is specified"
    )
    assert reasons["garbage"].startswith("Unavailable: model 'garbage': onnxruntime cannot load")
    assert reasons["unknown_op"].startswith(
        "Unavailable: model 'unknown_op': onnxruntime cannot load"
    )
    assert "NoSuchOperator" in reasons["unknown_op"]
    for name in reasons:
        assert index[name]["state"] == "UNAVAILABLE"
    assert http.is_model_ready("mlp_auto")  # the others keep serving


def test_wrong_shape_and_datatype_per_request(http: Any, grpc: Any) -> None:
    with pytest.raises(InferenceServerException) as caught:
        http.infer("mlp_auto", [http_input("INPUT", np.ones((1, 15), np.float32), "FP32")])
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        "[request id: <id_unknown>] unexpected shape for input 'INPUT' for model 'mlp_auto'."
        " Expected [-1,16], got [1,15]. "
    )
    with pytest.raises(InferenceServerException) as caught:
        grpc.infer("mlp_auto", [grpc_input("INPUT", np.ones((1, 16), np.float64), "FP64")])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "data-type is 'FP64', but model 'mlp_auto' expects 'FP32'" in caught.value.message()
    with pytest.raises(InferenceServerException) as caught:
        http.infer("mlp_auto", [http_input("INPUT", np.ones((5, 16), np.float32), "FP32")])
    assert caught.value.message() == (
        "[request id: <id_unknown>] inference request batch-size must be <= 4 for 'mlp_auto'"
    )


def test_an_onnx_runtime_failure_fails_the_request_only(http: Any) -> None:
    with pytest.raises(InferenceServerException) as caught:
        http.infer("reshape_to_four", [http_input("X", np.ones((1, 3), np.float32), "FP32")])
    assert caught.value.status() == "500"
    # Worded as Triton's backend words ORT's errors: "onnx runtime error <code>: <message>"
    # (the code is ORT's: 1, FAIL, in its newer releases; 6, RUNTIME_EXCEPTION, in older ones).
    message = caught.value.message()
    assert re.match(r"onnx runtime error \d+: Non-zero status code returned while running", message)
    assert message.endswith("Input shape:{1,3}, requested shape:{1,2,2}")
    good = http.infer("reshape_to_four", [http_input("X", np.ones((1, 4), np.float32), "FP32")])
    assert good.as_numpy("Y").shape == (1, 2, 2)


def test_strict_model_config_takes_nothing_from_the_model(repository: Path, tmp_path: Path) -> None:
    server = start_server(
        [repository],
        tmp_path / "strict.log",
        "--strict-model-config=true",
        "--exit-on-error=false",
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        client.close()
        assert index["mlp_batched"]["state"] == "READY"  # its config is complete
        # No config.pbtxt: refused while polling, as Triton does, so listed by name only.
        assert index["mlp_auto"] == {"name": "mlp_auto"}
        assert "Poll failed for model directory 'mlp_auto'" in server.log()
        assert "config.pbtxt' does not exist" in server.log()
        assert index["optional"]["state"] == "READY"
    finally:
        assert server.stop() == 0


def test_sequences_with_controls_and_implicit_state(http: Any) -> None:
    def send(sequence: int, value: float, start: bool = False, end: bool = False) -> Any:
        x = http_input("X", np.array([[value]], np.float32), "FP32")
        return http.infer(
            "accumulator", [x], sequence_id=sequence, sequence_start=start, sequence_end=end
        )

    sums = {11: [], 12: []}
    steps = [(11, 1.0, True, False), (12, 10.0, True, False), (11, 2.0, False, False)]
    steps += [(12, 20.0, False, True), (11, 3.0, False, True)]
    for sequence, value, start, end in steps:
        result = send(sequence, value, start, end)
        sums[sequence].append(result.as_numpy("SUM").item())
        assert result.as_numpy("CORR").item() == sequence  # the CORRID control
        # The next state is the server's: it is not in the response.
        assert [o["name"] for o in result.get_response()["outputs"]] == ["SUM", "CORR"]
    assert sums == {11: [1.0, 3.0, 6.0], 12: [10.0, 30.0]}
    assert send(11, 5.0, start=True, end=True).as_numpy("SUM").item() == 5.0  # fresh state
