"""Both gRPC engines (``--grpc-engine``): ``core`` (the default, calls driven on grpcio's core by
``frontends.grpc.core``) and ``aio`` (grpc.aio). The rest of the gRPC tests run on the default;
these run the behaviours the engine itself owns on both: answers and errors, streams, unknown
methods, compressed requests, calls cancelled while queued, the body budget (stopping with
calls in flight: test_lifecycle)."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, TEST_MODELS, RunningServer, start_server
from tests.e2e.models_on_disk import Marks, write_model
from tests.e2e.test_cancellation import mode_input, seen
from tests.e2e.test_metrics import scrape
from tests.waiting import wait_for

# The aio server's body budget: room for one 4 MiB message, not for two.
AIO_BUDGET = 6 << 20


@dataclass
class Waiters:
    """The repository of the ``waiter`` model, and the file where it marks its runs."""

    repository: Path
    marks: Marks


@pytest.fixture(scope="module")
def waiters(tmp_path_factory: pytest.TempPathFactory) -> Waiters:
    """``waiter``: a copy of tests/models/cancel_watch (MODE 0 runs until the request is
    cancelled, counting the cancellations it sees; MODE 1 answers at once with that count; two
    instances) that marks each MODE 0 run in a file."""
    root = tmp_path_factory.mktemp("waiter")
    marks = Marks(root / "marks")
    source = TEST_MODELS / "cancel_watch"
    path = json.dumps(str(marks.path))
    config = (source / "config.pbtxt").read_text()
    config += f'parameters {{ key: "MARKS" value: {{ string_value: {path} }} }}\n'
    write_model(root / "repository", "waiter", config, (source / "1" / "model.py").read_text())
    return Waiters(root / "repository", marks)


@pytest.fixture(scope="module")
def aio_server(
    tmp_path_factory: pytest.TempPathFactory, waiters: Waiters
) -> Iterator[RunningServer]:
    log_path = tmp_path_factory.mktemp("aio") / "server.log"
    running = start_server(
        [EXAMPLES, TEST_MODELS, waiters.repository],
        log_path,
        "--grpc-engine=aio",
        f"--request-body-budget-bytes={AIO_BUDGET}",
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def core_server(
    tmp_path_factory: pytest.TempPathFactory, waiters: Waiters
) -> Iterator[RunningServer]:
    """A server on the default engine that serves the ``waiter`` model (the session's server
    does not)."""
    log_path = tmp_path_factory.mktemp("core") / "server.log"
    running = start_server([waiters.repository], log_path)
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


@pytest.mark.parametrize("engine", ["core", "aio"])
def test_a_request_given_up_while_queued_never_runs(
    request: pytest.FixtureRequest, engine: str, waiters: Waiters
) -> None:
    """Both waiter instances run calls that last until they are cancelled; a third call, queued
    behind them, gives up after 1 s (time enough to reach the queue on a loaded machine). It
    leaves the queue as a CANCELED failure and never runs (it would mark its run); each waiter
    counts its cancellation."""
    engine_server: RunningServer = request.getfixturevalue(f"{engine}_server")
    client = grpcclient.InferenceServerClient(engine_server.grpc_url)
    waiter = grpcclient.InferenceServerClient(engine_server.grpc_url)
    try:
        before = seen(client, "waiter")
        runs_before = waiters.marks.count()
        canceled_before = canceled_failures(engine_server)
        ended: queue.Queue[str] = queue.Queue()

        def record(result: Any, error: InferenceServerException | None) -> None:
            ended.put("answered" if error is None else error.message())

        calls = [waiter.async_infer("waiter", [mode_input(0)], record) for _ in range(2)]
        try:
            wait_for(lambda: waiters.marks.count() == runs_before + 2, "both instances to be busy")
            with pytest.raises(InferenceServerException, match="Deadline"):
                client.infer("waiter", [mode_input(0)], client_timeout=1.0)
        finally:
            for call in calls:
                call.cancel()
        endings = [ended.get(timeout=30) for _ in calls]
        assert all("cancelled" in ending.lower() for ending in endings), endings
        wait_for(lambda: seen(client, "waiter") == before + 2, "the waiters to see the cancel")
        # Counted as CANCELED when it left the queue: from then on it cannot run.
        wait_for(
            lambda: canceled_failures(engine_server) == canceled_before + 1,
            "the queued call to leave the queue",
        )
        assert waiters.marks.count() == runs_before + 2
        assert seen(client, "waiter") == before + 2
    finally:
        waiter.close()
        client.close()


def canceled_failures(server: RunningServer) -> float:
    labels = frozenset({("model", "waiter"), ("version", "1"), ("reason", "CANCELED")})
    return scrape(server)[1].get(("nv_inference_request_failure", labels), 0.0)


def test_model_infer_messages_count_against_the_body_budget_on_aio(
    aio_server: RunningServer, waiters: Waiters
) -> None:
    """grpc.aio hands ModelInfer its whole message: a large one counts against the body budget
    while its request runs. With a 4 MiB message held by a request that waits (on the
    ``waiter``, with a 4 MiB parameter it ignores), another 4 MiB one is refused UNAVAILABLE;
    once the first is over, the same request is served."""
    big = grpcclient.InferInput("INPUT0", [1, 1 << 20], "FP32")  # 4 MiB
    big.set_data_from_numpy(np.ones((1, 1 << 20), np.float32))
    holder = grpcclient.InferenceServerClient(aio_server.grpc_url)
    held: queue.Queue[Any] = queue.Queue()
    runs_before = waiters.marks.count()
    holder.async_infer(
        "waiter",
        [mode_input(0)],
        parameters={"padding": "x" * (4 << 20)},
        callback=lambda result, error: held.put((result, error)),
        client_timeout=5,
    )
    client = grpcclient.InferenceServerClient(aio_server.grpc_url)
    try:
        # Probes sent before the holder's message is in would take the budget first and have
        # it refused: probe once it runs.
        wait_for(lambda: waiters.marks.count() > runs_before, "the waiter's request to run")
        with pytest.raises(InferenceServerException) as error:
            wait_for(lambda: _refused(client, big), "the waiter's 4 MiB request to hold the budget")
            client.infer("identity_fp32", [big])
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        assert f"past its budget of {AIO_BUDGET} bytes" in error.value.message()
        held.get(timeout=30)  # the waiting request ends with its client's deadline
        wait_for(lambda: not _refused(client, big), "the budget to come back")
        assert client.infer("identity_fp32", [big]).as_numpy("OUTPUT0").shape == (1, 1 << 20)
    finally:
        client.close()
        holder.close()


def _refused(client: grpcclient.InferenceServerClient, tensor: grpcclient.InferInput) -> bool:
    try:
        client.infer("identity_fp32", [tensor])
    except InferenceServerException as error:
        if error.status() != "StatusCode.UNAVAILABLE":
            raise
        return True
    return False
