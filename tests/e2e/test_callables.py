"""Python callables served in-process: tritonfast's own API (``tritonfast.Server``) and the
PyTriton layer (``tritonfast.pytriton``), each a real server on free ports in this process,
driven over sockets by tritonclient and by the PyTriton-style clients."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from tritonfast import ModelConfig, Server, Tensor, batch
from tritonfast.pytriton.client import (
    AsyncioModelClient,
    DecoupledModelClient,
    FuturesModelClient,
    ModelClient,
)
from tritonfast.pytriton.client.exceptions import (
    PyTritonClientInferenceServerError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientTimeoutError,
)
from tritonfast.pytriton.decorators import (
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    sample,
    triton_context,
)
from tritonfast.pytriton.exceptions import PyTritonUnrecoverableError
from tritonfast.pytriton.model_config import DynamicBatcher
from tritonfast.pytriton.triton import Triton, TritonConfig

from tests.conftest import TEST_MODELS, free_ports
from tests.e2e.loopback import loopback_options
from tests.waiting import wait_for

F32 = np.float32


def vector(name: str, dtype: Any = F32, shape: tuple[int, ...] = (-1,), **kw: Any) -> Tensor:
    return Tensor(shape=shape, dtype=dtype, name=name, **kw)


# -- callables -------------------------------------------------------------------------------
@batch
def add_sub(INPUT_1: np.ndarray, INPUT_2: np.ndarray) -> dict[str, np.ndarray]:
    return {"add": INPUT_1 + INPUT_2, "sub": INPUT_1 - INPUT_2}


@batch
def identity(INPUT0: np.ndarray) -> dict[str, np.ndarray]:
    return {"OUTPUT0": INPUT0}


@sample
def shout(text: np.ndarray) -> dict[str, np.ndarray]:
    return {"loud": np.array([t.upper() + b"!" for t in text.ravel()], dtype=object)}


def with_parameters(requests: list[Any]) -> list[dict[str, np.ndarray]]:
    return [{"scaled": r["x"] * float((r.parameters or {}).get("factor", 1))} for r in requests]


@batch
@group_by_values("mode")
def by_mode(x: np.ndarray, mode: np.ndarray) -> dict[str, np.ndarray]:
    # Each call sees one mode only: 0 doubles, 1 negates.
    assert len(np.unique(mode)) == 1
    return {"y": x * 2 if mode[0, 0] == 0 else -x}


@batch
@first_value("scale")
def first_scale(x: np.ndarray, scale: float) -> dict[str, np.ndarray]:
    return {"y": x * scale}


@fill_optionals(bias=np.array([100.0], dtype=F32))
@group_by_keys
@batch
def optional_bias(x: np.ndarray, bias: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x + bias}


@triton_context
@batch
def knows_its_config(x: np.ndarray, triton_context: Any) -> dict[str, np.ndarray]:
    config = triton_context.model_configs[knows_its_config]
    return {"y": np.full_like(x, config.max_batch_size)}


@batch
def fails(x: np.ndarray) -> dict[str, np.ndarray]:
    raise ValueError("this model always fails")


@batch
def wrong_output(x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x.astype(np.int64)}


def counting_stream(requests: list[Any]) -> Iterator[list[dict[str, np.ndarray]]]:
    for index in range(int(requests[0]["n"][0])):
        yield [{"i": np.array([index], np.int32)} for _ in requests]


async def async_double(requests: list[Any]) -> list[dict[str, np.ndarray]]:
    await asyncio.sleep(0)
    return [{"y": r["x"] * 2} for r in requests]


# -- servers ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pytriton_server() -> Iterator[tuple[Triton, int, int]]:
    config = TritonConfig(**loopback_options())
    http, grpc = config.http_port, config.grpc_port
    triton = Triton(config=config)
    two = [vector("INPUT_1"), vector("INPUT_2")]
    triton.bind(
        "AddSub",
        add_sub,
        inputs=two,
        outputs=[vector("add"), vector("sub")],
        config=ModelConfig(max_batch_size=128),
    )
    triton.bind(
        "Identity",
        [identity, identity],  # two instances
        inputs=[vector("INPUT0")],
        outputs=[vector("OUTPUT0")],
        config=ModelConfig(
            max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=200_000)
        ),
    )
    triton.bind(
        "Shout",
        shout,
        inputs=[vector("text", np.bytes_)],
        outputs=[vector("loud", np.bytes_)],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "Params",
        with_parameters,
        [vector("x")],
        [vector("scaled")],
        config=ModelConfig(batching=False),
    )
    triton.bind(
        "ByMode",
        by_mode,
        [vector("x"), vector("mode", np.int32, (1,))],
        [vector("y")],
        config=ModelConfig(max_batch_size=16),
    )
    triton.bind(
        "FirstScale",
        first_scale,
        [vector("x"), vector("scale", F32, (1,))],
        [vector("y")],
        config=ModelConfig(max_batch_size=16),
    )
    triton.bind(
        "OptionalBias",
        optional_bias,
        [vector("x", shape=(1,)), vector("bias", F32, (1,), optional=True)],
        [vector("y", shape=(1,))],
        config=ModelConfig(max_batch_size=16, batcher=None),  # type: ignore[arg-type]
    )
    triton.bind(
        "KnowsConfig",
        knows_its_config,
        [vector("x")],
        [vector("y")],
        config=ModelConfig(max_batch_size=7),
    )
    triton.bind("Fails", fails, [vector("x")], [vector("y")], config=ModelConfig(max_batch_size=4))
    triton.bind(
        "WrongOutput",
        wrong_output,
        [vector("x")],
        [vector("y")],
        config=ModelConfig(max_batch_size=4),
        strict=True,
    )
    triton.bind(
        "Count",
        counting_stream,
        [vector("n", np.int32, (1,))],
        [vector("i", np.int32, (1,))],
        config=ModelConfig(batching=False, decoupled=True),
    )
    triton.bind(
        "AsyncDouble",
        async_double,
        [vector("x")],
        [vector("y")],
        config=ModelConfig(batching=False),
    )
    triton.run()
    yield triton, http, grpc
    triton.stop()
    assert not triton.is_alive()


def test_pytriton_add_sub_over_both_protocols(pytriton_server: Any) -> None:
    _, http, grpc = pytriton_server
    a = np.random.default_rng(0).random((5, 3), F32)
    b = np.random.default_rng(1).random((5, 3), F32)
    for url in (f"http://127.0.0.1:{http}", f"grpc://127.0.0.1:{grpc}"):
        with ModelClient(url, "AddSub") as client:
            result = client.infer_batch(a, b)
            np.testing.assert_allclose(result["add"], a + b)
            np.testing.assert_allclose(result["sub"], a - b)
            one = client.infer_sample(INPUT_1=a[0], INPUT_2=b[0])
            assert one["add"].shape == (3,)
            np.testing.assert_allclose(one["add"], a[0] + b[0])


def test_tritonclient_sees_an_ordinary_model(pytriton_server: Any) -> None:
    _, http, _ = pytriton_server
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    try:
        config = client.get_model_config("AddSub")
        assert config["max_batch_size"] == 128
        assert [t["name"] for t in config["input"]] == ["INPUT_1", "INPUT_2"]
        tensor = httpclient.InferInput("INPUT0", [2, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((2, 2), F32))
        result = client.infer("Identity", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((2, 2), F32))
    finally:
        client.close()


def test_strings_and_a_model_without_batching(pytriton_server: Any) -> None:
    _, http, _ = pytriton_server
    with ModelClient(f"127.0.0.1:{http}", "Shout") as client:
        result = client.infer_sample(text=np.array([b"abc", b"xy"], dtype=object))
        assert result["loud"].tolist() == [b"ABC!", b"XY!"]
        with pytest.raises(PyTritonClientModelDoesntSupportBatchingError):
            client.infer_batch(text=np.array([[b"a"]], dtype=object))


def test_a_model_that_never_gets_ready_times_out_in_pytritons_words(pytriton_server) -> None:
    _, http, _ = pytriton_server
    with (
        ModelClient(f"127.0.0.1:{http}", "Nope", init_timeout_s=0.5) as client,
        pytest.raises(PyTritonClientTimeoutError) as error,
    ):
        client.infer_sample(x=np.ones(1, F32))
    assert str(error.value) == "Waiting for model Nope/<latest> to be ready timed out."


def test_request_parameters_reach_the_callable(pytriton_server: Any) -> None:
    _, http, _ = pytriton_server
    with ModelClient(f"127.0.0.1:{http}", "Params") as client:
        x = np.array([1.0, 2.0], F32)
        result = client.infer_sample(x=x, parameters={"factor": 3})
        np.testing.assert_allclose(result["scaled"], 3 * x)


def test_concurrent_requests_batch_across_two_instances(pytriton_server: Any) -> None:
    _, http, _ = pytriton_server
    stats_client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    before = stats_client.get_inference_statistics("Identity")["model_stats"][0]
    rows = [np.full((1, 4), i, F32) for i in range(16)]
    with FuturesModelClient(f"127.0.0.1:{http}", "Identity", max_workers=16) as client:
        futures = [client.infer_batch(INPUT0=r) for r in rows]
        results = [f.result() for f in futures]
    for row, result in zip(rows, results, strict=True):
        np.testing.assert_array_equal(result["OUTPUT0"], row)
    after = stats_client.get_inference_statistics("Identity")["model_stats"][0]
    stats_client.close()
    requests = (
        after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    )
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 16
    assert executions < requests  # dynamic batching of the callable's requests


def test_group_by_values_first_value_fill_optionals_triton_context(pytriton_server: Any) -> None:
    _, http, _ = pytriton_server
    x = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], F32)
    with ModelClient(f"127.0.0.1:{http}", "ByMode") as client:
        mode = np.array([[0], [1], [0]], np.int32)
        np.testing.assert_allclose(
            client.infer_batch(x=x, mode=mode)["y"], [[2, 4], [-3, -4], [10, 12]]
        )
    with ModelClient(f"127.0.0.1:{http}", "FirstScale") as client:
        scale = np.full((3, 1), 0.5, F32)
        np.testing.assert_allclose(client.infer_batch(x=x, scale=scale)["y"], x * 0.5)
        with pytest.raises(PyTritonClientInferenceServerError, match="are not equal"):
            client.infer_batch(x=x, scale=np.array([[1], [2], [3]], F32))
    with ModelClient(f"127.0.0.1:{http}", "OptionalBias") as client:
        y = client.infer_batch(x=np.array([[1.0], [2.0]], F32))["y"]
        np.testing.assert_allclose(y, [[101.0], [102.0]])
        given = client.infer_batch(x=np.array([[1.0]], F32), bias=np.array([[5.0]], F32))["y"]
        np.testing.assert_allclose(given, [[6.0]])
    with ModelClient(f"127.0.0.1:{http}", "KnowsConfig") as client:
        assert client.infer_batch(x=np.zeros((2, 1), F32))["y"].tolist() == [[7.0], [7.0]]


def test_a_failing_callable_answers_with_its_traceback(pytriton_server: Any) -> None:
    triton, http, _ = pytriton_server
    with ModelClient(f"127.0.0.1:{http}", "Fails") as client:
        with pytest.raises(PyTritonClientInferenceServerError) as caught:
            client.infer_batch(x=np.zeros((1, 2), F32))
        assert "Traceback (most recent call last)" in caught.value.message
        assert "ValueError: this model always fails" in caught.value.message
    with ModelClient(f"127.0.0.1:{http}", "WrongOutput") as client:
        with pytest.raises(PyTritonClientInferenceServerError) as caught:
            client.infer_batch(x=np.zeros((1, 2), F32))
        assert (
            "Returned output `y` for model `WrongOutput` has invalid type. Returned: int64 (i)."
            in caught.value.message
        )
    assert triton.is_alive()  # the server and the other models keep serving


def test_ragged_inputs_under_batch_fail_their_batch_with_the_reason(pytriton_server: Any) -> None:
    _, http, _ = pytriton_server
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http}", concurrency=2)
    try:
        handles = []
        for width in (2, 3):  # one batch (200 ms window), rows of different widths
            tensor = httpclient.InferInput("INPUT0", [1, width], "FP32")
            tensor.set_data_from_numpy(np.ones((1, width), F32))
            handles.append(client.async_infer("Identity", [tensor]))
        outcomes = []
        for handle in handles:
            try:
                outcomes.append(handle.get_result().as_numpy("OUTPUT0").shape)
            except InferenceServerException as exc:
                outcomes.append(exc.message())
    finally:
        client.close()
    # The dynamic batcher keeps rows of different shapes apart (the input is variable-size),
    # so each request runs alone and succeeds.
    assert outcomes == [(1, 2), (1, 3)]


def test_decoupled_generator_and_async_callable(pytriton_server: Any) -> None:
    _, http, grpc = pytriton_server
    with DecoupledModelClient(f"grpc://127.0.0.1:{grpc}", "Count") as client:
        answers = [r["i"].tolist() for r in client.infer_sample(n=np.array([3], np.int32))]
    assert answers == [[0], [1], [2]]

    async def call() -> dict[str, np.ndarray]:
        async with AsyncioModelClient(f"127.0.0.1:{http}", "AsyncDouble") as client:
            return await client.infer_sample(x=np.array([1.5], F32))

    assert asyncio.run(call())["y"].tolist() == [3.0]


# -- tritonfast's own API ---------------------------------------------------------------------
def test_native_server_binds_while_running_and_serves_a_repository() -> None:
    http, grpc, metrics = free_ports(3)
    with Server(
        TEST_MODELS,
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        http_address="127.0.0.1",
        grpc_address="127.0.0.1",
        metrics_address="127.0.0.1",
    ) as server:
        server.bind("Identity", identity, [vector("INPUT0")], [vector("OUTPUT0")])
        server.run()
        server.bind("Later", identity, [vector("INPUT0")], [vector("OUTPUT0")])
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        try:
            for name in ("Identity", "Later"):
                tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
                tensor.set_data_from_numpy(np.array([[1, 2]], F32))
                assert client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist() == [[1, 2]]
            assert client.is_model_ready("identity_fp32")  # from the repository
        finally:
            client.close()
    assert not server.is_alive()


def test_an_unrecoverable_error_stops_the_server() -> None:
    @batch
    def gives_up(x: np.ndarray) -> dict[str, np.ndarray]:
        raise PyTritonUnrecoverableError("the device is gone")

    http, grpc, metrics = free_ports(3)
    config = TritonConfig(
        http_port=http, grpc_port=grpc, metrics_port=metrics, http_address="127.0.0.1"
    )
    triton = Triton(config=config)
    triton.bind(
        "GivesUp", gives_up, [vector("x")], [vector("y")], config=ModelConfig(max_batch_size=2)
    )
    triton.run()
    with (
        ModelClient(f"127.0.0.1:{http}", "GivesUp") as client,
        pytest.raises(PyTritonClientInferenceServerError, match="the device is gone"),
    ):
        client.infer_batch(x=np.zeros((1, 1), F32))
    wait_for(lambda: not triton.is_alive(), "the server to stop")
    triton.stop()


def test_headers_matching_the_forward_patterns_become_parameters() -> None:
    options = loopback_options()
    http, grpc = options["http_port"], options["grpc_port"]
    with Server(
        **options,
        http_header_forward_pattern="^fac",
        grpc_header_forward_pattern="^fac",
    ) as server:
        server.bind(
            "Params",
            with_parameters,
            [vector("x")],
            [vector("scaled")],
            config=ModelConfig(batching=False),
        )
        server.run()
        x = np.array([1.0, 2.0], F32)
        grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        tensor = grpcclient.InferInput("x", [2], "FP32")
        tensor.set_data_from_numpy(x)
        result = grpc_client.infer("Params", [tensor], headers={"factor": "4", "other": "9"})
        assert result.as_numpy("scaled").tolist() == [4.0, 8.0]
        grpc_client.close()
        http_client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        tensor = httpclient.InferInput("x", [2], "FP32")
        tensor.set_data_from_numpy(x)
        result = http_client.infer("Params", [tensor], headers={"factor": "5"})
        assert result.as_numpy("scaled").tolist() == [5.0, 10.0]
        http_client.close()
