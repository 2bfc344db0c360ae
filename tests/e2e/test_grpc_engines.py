"""Both gRPC engines (``--grpc-engine``): ``core`` (the default, calls driven on grpcio's core by
``frontends.grpc.core``) and ``aio`` (grpc.aio). The rest of the gRPC tests run on the default;
these run the behaviours the engine itself owns on both: answers and errors, streams, unknown
methods, compressed requests, calls cancelled while queued (stopping with calls in flight:
test_lifecycle)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, TEST_MODELS, RunningServer, start_server
from tests.e2e.test_cancellation import mode_input, seen
from tests.e2e.test_metrics import scrape


@pytest.fixture(scope="module")
def aio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log_path = tmp_path_factory.mktemp("aio") / "server.log"
    running = start_server([EXAMPLES, TEST_MODELS], log_path, "--grpc-engine=aio")
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(params=["core", "aio"])
def engine_server(request: pytest.FixtureRequest) -> RunningServer:
    name = "server" if request.param == "core" else "aio_server"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]


def fp32_input(values: list[float]) -> grpcclient.InferInput:
    data = np.array([values], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def test_answers_and_errors(engine_server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(engine_server.grpc_url)
    try:
        result = client.infer("identity_fp32", [fp32_input([1.5, -2.0])], request_id="a1")
        assert result.as_numpy("OUTPUT0").tolist() == [[1.5, -2.0]]
        assert result.get_response().id == "a1"
        assert client.get_model_metadata("identity_fp32").name == "identity_fp32"
        with pytest.raises(InferenceServerException) as info:
            client.infer("no_such_model", [fp32_input([1.0])])
        assert info.value.status() == "StatusCode.NOT_FOUND"
        assert "no_such_model" in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            client.infer("identity_fp32", [grpcclient.InferInput("INPUT0", [1, 2], "INT32")])
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.close()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(engine_server: RunningServer, algorithm: str) -> None:
    client = grpcclient.InferenceServerClient(engine_server.grpc_url)
    try:
        values = [float(i) for i in range(1000)]  # compressible
        result = client.infer(
            "identity_fp32", [fp32_input(values)], compression_algorithm=algorithm
        )
        assert result.as_numpy("OUTPUT0").tolist() == [values]
    finally:
        client.close()


def test_a_stream_answers_in_order(engine_server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(engine_server.grpc_url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        for i in range(20):
            client.async_stream_infer("identity_fp32", [fp32_input([float(i)])], request_id=f"{i}")
        got = [replies.get(timeout=60) for _ in range(20)]
    finally:
        client.stop_stream()
        client.close()
    assert all(error is None for _, error in got)
    assert [r.get_response().id for r, _ in got] == [str(i) for i in range(20)]
    assert [r.as_numpy("OUTPUT0")[0, 0] for r, _ in got] == list(range(20))


def test_an_unknown_method_is_unimplemented(engine_server: RunningServer) -> None:
    channel = grpc.insecure_channel(engine_server.grpc_url)
    try:
        call = channel.unary_unary("/inference.GRPCInferenceService/NoSuchMethod")
        with pytest.raises(grpc.RpcError) as info:
            call(b"", timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # The server still serves.
        client = grpcclient.InferenceServerClient(engine_server.grpc_url)
        assert client.is_server_live()
        client.close()
    finally:
        channel.close()


def test_a_request_given_up_while_queued_never_runs(engine_server: RunningServer) -> None:
    """Both cancel_watch instances wait on calls with a 1.5 s deadline; a third call, queued
    behind them, gives up after 0.3 s. It leaves the queue as a CANCELED failure; each waiter
    counts its cancellation, and the third would count one too had it run after them."""
    client = grpcclient.InferenceServerClient(engine_server.grpc_url)
    try:
        before = seen(client)
        canceled_before = canceled_failures(engine_server)
        errors: list[str] = []

        def wait_for_cancel(timeout: float) -> None:
            waiter = grpcclient.InferenceServerClient(engine_server.grpc_url)
            try:
                waiter.infer("cancel_watch", [mode_input(0)], client_timeout=timeout)
            except InferenceServerException as error:
                errors.append(error.message())
            finally:
                waiter.close()

        waiters = [threading.Thread(target=wait_for_cancel, args=(1.5,)) for _ in range(2)]
        for thread in waiters:
            thread.start()
        time.sleep(0.5)  # both instances are busy
        wait_for_cancel(0.3)
        for thread in waiters:
            thread.join(30)
        assert len(errors) == 3 and all("Deadline" in e for e in errors), errors
        deadline = time.monotonic() + 10
        while seen(client) < before + 2:
            assert time.monotonic() < deadline, "the waiters never saw their cancellation"
            time.sleep(0.05)
        time.sleep(0.3)  # room for the queued call to run, had it stayed queued
        assert seen(client) == before + 2
        assert canceled_failures(engine_server) == canceled_before + 1
    finally:
        client.close()


def canceled_failures(server: RunningServer) -> float:
    labels = frozenset({("model", "cancel_watch"), ("version", "1"), ("reason", "CANCELED")})
    return scrape(server)[1].get(("nv_inference_request_failure", labels), 0.0)
