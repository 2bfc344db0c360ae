"""Fault injection: unload and reload under load. Every request queued or running when a model
is unloaded (or reloaded) is answered, by the old version or with an error, within the exit
timeout, over HTTP, gRPC, BLS and ensembles; the clients' connections are released; a model
that hangs is stopped at the end of the timeout; a SIGTERM afterwards does not wait again."""

from __future__ import annotations

import json
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.e2e.faults import SCALE, Calls, census, report, server_sockets
from tests.e2e.models_on_disk import bls_caller, write_model
from tests.waiting import wait_for

EXIT_TIMEOUT_S = 2
# How long past the exit timeout an answer may take (thread hand-overs, a loaded machine).
SLACK_S = 3.0
RUN_S = 0.25  # each request's execution

SLOW_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "MODE" } }
"""

# Sleeps RUN_S a request, or for good with HANG set to 1.
SLOW = """
import json
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            hang = json.loads(request.parameters() or "{}").get("HANG")
            time.sleep(3600 if hang else RUN_S)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
""".replace("RUN_S", str(RUN_S))

CALLERS = 4  # instances of "caller": how many of its requests can wait on "slow" at once
CALLER_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: CALLERS kind: KIND_CPU } ]
"""

ENSEMBLE_CONFIG = """
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [ {
  model_name: "slow" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" }
} ] }
"""


def _repository(tmp_path, mode: str):
    repository = tmp_path / "models"
    write_model(repository, "slow", SLOW_CONFIG.replace("MODE", mode), SLOW)
    write_model(
        repository, "caller", CALLER_CONFIG.replace("CALLERS", str(CALLERS)), bls_caller("slow")
    )
    (repository / "via_ensemble" / "1").mkdir(parents=True)
    (repository / "via_ensemble" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    return repository


def _start(tmp_path, mode: str):
    return start_server(
        [_repository(tmp_path, mode)],
        tmp_path / "server.log",
        "--model-control-mode=explicit",
        "--load-model=slow",
        "--load-model=caller",
        "--load-model=via_ensemble",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
    )


def _http_call(server, model: str, **parameters):
    def call():
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        x = httpclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.ones(1, dtype=np.float32))
        try:
            return client.infer(model, [x], parameters=parameters or None).as_numpy("Y")
        finally:
            client.close()

    return call


def _grpc_call(server, model: str):
    def call():
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("X", [1], "FP32")
        x.set_data_from_numpy(np.ones(1, dtype=np.float32))
        try:
            return client.infer(model, [x], client_timeout=60).as_numpy("Y")
        finally:
            client.close()

    return call


PER_KIND = 4 * SCALE  # calls of each kind
# Of those, the requests that reach "slow" (the BLS callers' wait in their own queue beyond
# CALLERS).
REACHING_SLOW = 3 * PER_KIND + min(PER_KIND, CALLERS)


def _every_kind_of_call(server) -> list:
    """HTTP and gRPC clients of the model, and of the models that reach it through BLS and
    through an ensemble step."""
    per_kind = PER_KIND
    return [
        *(_http_call(server, "slow") for _ in range(per_kind)),
        *(_grpc_call(server, "slow") for _ in range(per_kind)),
        *(_http_call(server, "caller") for _ in range(per_kind)),
        *(_grpc_call(server, "via_ensemble") for _ in range(per_kind)),
    ]


def _check_answers(results: list) -> tuple[int, int]:
    """Every call got the model's answer or an error that says the model went away; returns
    (answered by the model, refused)."""
    answered = refused = 0
    for result in results:
        if isinstance(result, np.ndarray):
            assert result.tolist() == [1.0]
            answered += 1
        else:
            assert isinstance(result, InferenceServerException), repr(result)
            # A call that arrives once the unload is over finds no model (Triton's words).
            assert (
                "unloaded" in result.message()
                or "not ready" in result.message()
                or "not found" in result.message()
                or "has no available versions" in result.message()
            ), result.message()
            refused += 1
    return answered, refused


def _pending(server, model: str) -> int:
    """The model's requests waiting in its queue (Triton's pending-request metric)."""
    url = f"http://{server.metrics_url}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(f'nv_inference_pending_request_count{{model="{model}"'):
                return int(float(line.rsplit(" ", 1)[1]))
    return 0


def _wait_until_queued(server, count: int) -> None:
    """Until ``count`` requests wait for "slow" (behind the one it runs)."""
    wait_for(lambda: _pending(server, "slow") >= count, f"{count} requests to queue up")


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_unload_under_load_answers_every_request_within_the_exit_timeout(tmp_path, mode) -> None:
    server = _start(tmp_path, mode)
    control = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        wait_for(lambda: control.is_model_ready("via_ensemble"), "the models to load")
        before = census(server.proc.pid)
        kinds = _every_kind_of_call(server)
        calls = Calls(kinds)
        _wait_until_queued(server, REACHING_SLOW - 2)
        started = time.monotonic()
        control.unload_model("slow")
        unloaded_in = time.monotonic() - started
        results = calls.results(EXIT_TIMEOUT_S + SLACK_S)
        answered, refused = _check_answers(results)
        assert unloaded_in < EXIT_TIMEOUT_S + SLACK_S
        assert answered >= 1 and refused >= 1, (answered, refused)
        # The callers' instances are free again: a new call is answered at once.
        with pytest.raises(InferenceServerException):
            _http_call(server, "caller")()
        # The clients' connections are released (none left waiting in CLOSE-WAIT).
        wait_for(lambda: server_sockets(server.proc.pid, server.http_port) <= 1, "HTTP sockets")
        wait_for(lambda: server_sockets(server.proc.pid, server.grpc_port) <= 1, "gRPC sockets")
        grew = census(server.proc.pid).grew_by(before)
        report(
            f"unload under load, {mode} mode",
            calls=len(kinds),
            answered=answered,
            refused=refused,
            unload_s=f"{unloaded_in:.2f}",
            server=grew,
        )
        assert grew.processes <= 0, grew  # the unloaded model's worker is gone
    finally:
        control.close()
        stopping = time.monotonic()
        assert server.stop() == 0, server.log()
    assert time.monotonic() - stopping < EXIT_TIMEOUT_S + SLACK_S  # nothing left to wait for


def test_a_reload_under_load_answers_every_request_by_the_old_version_or_an_error(
    tmp_path,
) -> None:
    server = _start(tmp_path, "process")
    control = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        wait_for(lambda: control.is_model_ready("via_ensemble"), "the models to load")
        calls = Calls([_http_call(server, "slow") for _ in range(12 * SCALE)])
        _wait_until_queued(server, 12 * SCALE - 2)
        changed = {
            "backend": "python",
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
            "parameters": {"RELOADED": {"string_value": "yes"}},
        }
        started = time.monotonic()
        control.load_model("slow", config=json.dumps(changed))
        assert time.monotonic() - started < EXIT_TIMEOUT_S + SLACK_S
        _check_answers(calls.results(EXIT_TIMEOUT_S + SLACK_S))
        config = control.get_model_config("slow")
        assert config["parameters"]["RELOADED"]["string_value"] == "yes"
        assert _http_call(server, "slow")().tolist() == [1.0]  # the new version serves
    finally:
        control.close()
        assert server.stop() == 0, server.log()


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_hanging_model_is_stopped_at_the_end_of_the_exit_timeout(tmp_path, mode) -> None:
    server = _start(tmp_path, mode)
    control = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        wait_for(lambda: control.is_model_ready("slow"), "the model to load")
        calls = Calls(
            [_http_call(server, "slow", HANG=1)]
            + [_http_call(server, "slow") for _ in range(3 * SCALE)]
        )
        _wait_until_queued(server, 3 * SCALE - 1)
        control.unload_model("slow")
        results = calls.results(EXIT_TIMEOUT_S + SLACK_S)
        assert isinstance(results[0], InferenceServerException)
        assert "unloaded" in results[0].message()
        _check_answers(results)
    finally:
        control.close()
        assert server.stop() == 0, server.log()
