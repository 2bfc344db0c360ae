"""Our equivalents of python_backend's BLS examples (``bls_sync``, ``bls_async``,
``bls_decoupled`` in tests/models_streaming), checked the way their clients check them,
against the bundled ``add_sub`` example model and the decoupled ``square_int32``."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, ROOT, RunningServer, start_server

STREAMING_MODELS = ROOT / "tests" / "models_streaming"
PLUGINS = ROOT / "tests" / "plugins"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running: RunningServer = start_server(
        [EXAMPLES, STREAMING_MODELS],
        tmp_path_factory.mktemp("bls") / "server.log",
        pythonpath=(PLUGINS,),
    )
    yield running
    assert running.stop() == 0, running.log()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpclient.InferenceServerClient]:
    http = httpclient.InferenceServerClient(server.http_url)
    yield http
    http.close()


def add_sub_inputs(model_name: str) -> tuple[list[Any], np.ndarray, np.ndarray]:
    first = np.arange(4, dtype=np.float32)
    second = np.full(4, 10, dtype=np.float32)
    name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([model_name.encode()], dtype=object))
    tensors = [name]
    for input_name, values in (("INPUT0", first), ("INPUT1", second)):
        tensor = httpclient.InferInput(input_name, [4], "FP32")
        tensor.set_data_from_numpy(values)
        tensors.append(tensor)
    return tensors, first, second


@pytest.mark.parametrize("model", ["bls_sync", "bls_async", "bls_sync_proc"])
def test_a_bls_model_answers_with_the_model_it_calls(
    client: httpclient.InferenceServerClient, model: str
) -> None:
    tensors, first, second = add_sub_inputs("add_sub")
    result = client.infer(model, tensors)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), first + second)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), first - second)
    tensors, _, _ = add_sub_inputs("no_such_model")
    with pytest.raises(InferenceServerException) as error:
        client.infer(model, tensors)
    assert (
        "Model no_such_model - Error when running inference: Failed for execute the inference"
        " request. Model 'no_such_model' is not ready." in error.value.message()
    )


@pytest.mark.parametrize(
    "model",
    ["bls_decoupled", "bls_decoupled_proc", "bls_decoupled_async", "bls_decoupled_async_proc"],
)
@pytest.mark.parametrize("count", [0, 1, 5])
def test_bls_reads_every_response_of_a_decoupled_model(
    client: httpclient.InferenceServerClient, model: str, count: int
) -> None:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], dtype=np.int32))
    result = client.infer(model, [tensor])
    assert result.as_numpy("COUNT").tolist() == [count]
    assert result.as_numpy("SUM").tolist() == [count * count]


def test_a_call_that_could_never_run_is_refused_not_left_hanging(
    client: httpclient.InferenceServerClient,
) -> None:
    """The rule: a call from a model is refused (UNAVAILABLE, at once) when every instance of
    the model it calls is itself waiting on a call to the server; otherwise it waits its turn.
    bls_loop has two instances: one level of calling itself works, two would need a third."""

    def loop(x: int) -> Any:
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([x], dtype=np.int32))
        return client.infer("bls_loop", [tensor]).as_numpy("Y").tolist()

    assert loop(1) == [1]
    with pytest.raises(InferenceServerException) as error:
        loop(2)
    assert (
        "model 'bls_loop' cannot take this call: every instance of it is waiting on a call to"
        " the server (a model calling itself, or a cycle of calls), so it would wait forever"
        in error.value.message()
    )
    assert loop(1) == [1]  # nothing is left stuck


def test_a_decoupled_models_threads_call_the_server_after_execute_returned(
    server: RunningServer,
) -> None:
    """bls_threads_proc answers from threads that call two models after its execute returned:
    its worker must not take their answers for batches, nor a batch for an answer."""

    def generate(value: int) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
        try:
            body = json.dumps({"IN": value})
            conn.request("POST", "/v2/models/bls_threads_proc/generate", body=body)
            reply = conn.getresponse()
            return reply.status, json.loads(reply.read())
        finally:
            conn.close()

    for value in (0, 3):  # one after another: the calls come between batches
        status, body = generate(value)
        assert status == 200, body
        assert body["ALL"] == value + 1  # the responses, and the final flag's empty one
        assert body["ADDED"] == [value + 1.0] * 4
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # and while others run
        replies = list(pool.map(generate, range(8)))
    assert [body["ALL"] for _, body in replies] == [value + 1 for value in range(8)]
