"""Iterative sequences: a model with ``sequence_batching { iterative_sequence: true }`` runs a
request again for as long as it reschedules it (``set_release_flags``), as Triton does."""

from __future__ import annotations

import http.client
import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.e2e.models_on_disk import write_model

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  iterative_sequence: true
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                              int32_false_true: [ 0, 1 ] } ] } ]
}
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "MODE" } }
"""

# Counts down from IN, one response per execution: rescheduled until it reaches 0 (Triton's
# QA iterative_sequence model, keyed by the request's correlation ID). OUT: what is left.
COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0]
            if start:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.left[key] -= 1
            out = pb_utils.Tensor("OUT", np.array([self.left[key]], np.int32))
            sender = request.get_response_sender()
            if self.left[key] <= 0:
                del self.left[key]
                sender.send(
                    pb_utils.InferenceResponse([out]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(pb_utils.InferenceResponse([out]))
        return None
"""

# One response per request: runs IN times (None in the returned list while rescheduled), then
# answers how many times it ran and how many of those saw START.
COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        returned = []
        for request in requests:
            key = request.correlation_id()
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0])
            runs, starts = self.runs.get(key, (0, 0))
            runs, starts = runs + 1, starts + start
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if runs < wanted:
                self.runs[key] = (runs, starts)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                returned.append(None)
            else:
                self.runs.pop(key, None)
                out = np.array([runs * 10 + starts], np.int32)
                returned.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return returned
"""


NOT_ITERATIVE_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "MODE" } }
"""
RESCHEDULER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return [None] * len(requests)
"""


# Two executions of 0.3 s each, with an idle time of 0.1 s: the sequence outlives it.
SLOW_CONFIG = CONFIG.replace(
    "  iterative_sequence: true\n",
    "  iterative_sequence: true\n  max_sequence_idle_microseconds: 100000\n",
)
SLOW_COUNTER = COUNTER.replace(
    "    def execute(self, requests):\n",
    "    def execute(self, requests):\n        import time\n        time.sleep(0.3)\n",
    1,
)


@pytest.fixture(params=["process", "thread"], scope="module")
def server(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("iterative")
    mode = request.param
    write_model(
        repo,
        "countdown",
        CONFIG.replace("MODE", mode) + "model_transaction_policy { decoupled: true }\n",
        COUNTDOWN,
    )
    write_model(repo, "counter", CONFIG.replace("MODE", mode), COUNTER)
    write_model(repo, "not_iterative", NOT_ITERATIVE_CONFIG.replace("MODE", mode), RESCHEDULER)
    write_model(repo, "slow_counter", SLOW_CONFIG.replace("MODE", mode), SLOW_COUNTER)
    running = start_server([repo], repo / "server.log")
    yield running
    assert running.stop() == 0, running.log()


def in_tensor(module, value: int):
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [tensor]


def test_a_rescheduled_request_streams_a_response_per_execution(server) -> None:
    """No correlation ID needed; two requests at once each get their own countdown."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("countdown", in_tensor(grpcclient, 3), request_id="a")
        client.async_stream_infer("countdown", in_tensor(grpcclient, 2), request_id="b")
        seen: dict[str, list[int]] = {"a": [], "b": []}
        for _ in range(5):
            result, error = got.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            seen[response.id].append(int(result.as_numpy("OUT")[0]))
        assert seen == {"a": [2, 1, 0], "b": [1, 0]}
    finally:
        client.stop_stream()
        client.close()


def test_a_caller_leaving_in_the_middle_of_a_countdown_leaves_the_model_serving(server) -> None:
    """The caller goes away while its request is being rescheduled: it is not run again, and
    the next caller's request runs. (Each execution drops the previous one's response
    sender, whose finalizer may run while the worker sends a response; it used to deadlock
    the worker there, and the sequence kept the model's one slot for good.)"""
    gone = grpcclient.InferenceServerClient(server.grpc_url)
    first: queue.Queue = queue.Queue()
    gone.start_stream(callback=lambda result, error: first.put((result, error)))
    http = httpclient.InferenceServerClient(server.http_url)
    before = http.get_inference_statistics("countdown")["model_stats"][0]["execution_count"]
    gone.async_stream_infer("countdown", in_tensor(grpcclient, 1_000_000), request_id="gone")
    first.get(timeout=30)
    gone.stop_stream(cancel_requests=True)
    gone.close()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("countdown", in_tensor(grpcclient, 2), request_id="next")
        left = []
        for _ in range(2):
            result, error = got.get(timeout=30)
            assert error is None, error
            left.append(int(result.as_numpy("OUT")[0]))
        assert left == [1, 0]
        # A request whose caller left is not rescheduled again (as Triton drops it when its
        # turn comes): the million-step countdown stopped within a few executions.
        after = http.get_inference_statistics("countdown")["model_stats"][0]["execution_count"]
        assert after - before < 1000
    finally:
        client.stop_stream()
        client.close()
        http.close()


def test_a_rescheduled_request_is_answered_once_after_its_last_execution(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        before = client.get_inference_statistics("counter")["model_stats"][0]["execution_count"]
        result = client.infer("counter", in_tensor(httpclient, 4))
        # Four executions, START seen on the first only.
        assert result.as_numpy("OUT").tolist() == [41]
        after = client.get_inference_statistics("counter")["model_stats"][0]["execution_count"]
        assert after - before == 4
        # The sequence ended with it: the next request starts afresh.
        assert client.infer("counter", in_tensor(httpclient, 1)).as_numpy("OUT").tolist() == [11]
    finally:
        client.close()


def test_a_generate_request_runs_its_own_sequence(server) -> None:
    """A generate request's parameters are all the model's: the sequence the server gives it
    is kept apart from them, found again at each rescheduling, and ended after its last
    execution (a sequence left live would hold the model's one slot: the next request would
    wait for good)."""
    host, port = server.http_url.rsplit(":", 1)
    for _ in range(3):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            connection.request("POST", "/v2/models/counter/generate", body=b'{"IN": 2}')
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
        assert response.status == 200, answer
        assert answer["OUT"] == 21  # two executions, START seen on the first only


def test_a_model_that_is_no_iterative_sequence_model_cannot_reschedule(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("not_iterative", in_tensor(httpclient, 1))
        assert info.value.message().startswith(
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE"
        )
        assert client.is_server_live()
    finally:
        client.close()


def test_an_execution_longer_than_the_idle_time_does_not_end_the_sequence(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.infer("slow_counter", in_tensor(httpclient, 2)).as_numpy("OUT").tolist() == [
            21
        ]
    finally:
        client.close()
