"""Fault injection: worker processes that crash on every request, or cannot be started again.
Each failing request is answered quickly with an error, the server's descriptors, processes and
memory stay flat, and every other model keeps serving."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.e2e.faults import SCALE, census, report, settled_growth
from tests.e2e.models_on_disk import write_model

CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

# Exits on every request; with a mark file next to it, its initialize raises too, so its
# worker can never be started again.
CRASHING = """
import os
import triton_python_backend_utils as pb_utils

MARK = os.path.join(os.path.dirname(__file__), "cannot_restart")


class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(MARK):
            raise RuntimeError("initialize refuses to run again")

    def execute(self, requests):
        os._exit(3)
"""

IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""


def _inputs() -> list[httpclient.InferInput]:
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.ones(1, dtype=np.float32))
    return [x]


@pytest.mark.parametrize("restarts", ["succeed", "fail"])
def test_a_worker_dying_on_every_request_costs_one_error_each_and_nothing_else(
    tmp_path, restarts
) -> None:
    repository = tmp_path / "models"
    write_model(repository, "crashing", CONFIG, CRASHING)
    write_model(repository, "identity", CONFIG, IDENTITY)
    if restarts == "fail":  # the first worker starts; every later one fails in initialize
        mark = repository / "crashing" / "1" / "cannot_restart"
    server = start_server([repository], tmp_path / "server.log")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        if restarts == "fail":
            mark.touch()
        requests = 40 * SCALE
        warm = 5  # the first failures start what every later one reuses (threads, buffers)
        slowest = 0.0
        before = None
        for index in range(requests):
            if index == warm:
                before = census(server.proc.pid)
            started = time.monotonic()
            with pytest.raises(InferenceServerException) as failed:
                client.infer("crashing", _inputs())
            slowest = max(slowest, time.monotonic() - started)
            assert failed.value.status() == "500"
            if restarts == "succeed" or index == 0:
                assert "worker process exited (code 3)" in failed.value.message()
            else:
                assert "could not be started again" in failed.value.message()
                assert "initialize refuses to run again" in failed.value.message()
        assert before is not None
        grew = settled_growth(
            server.proc.pid,
            before,
            lambda g: g.descriptors <= 6 and g.processes <= 1 and g.rss_mib < 16,
        )
        report(
            f"worker dying on every request, restarts {restarts}",
            requests=requests,
            slowest_answer_s=f"{slowest:.3f}",
            server=grew,
        )
        # At most the one worker it had, its pipe and its channel from the core (both ends of
        # each while it starts): after a crash the worker starts again at once, so a census
        # may catch it starting, which settles (a leak would grow with requests and stay).
        assert grew.descriptors <= 6, grew
        assert grew.processes <= 1, grew
        assert grew.rss_mib < 16, grew
        assert slowest < 5, slowest
        # The rest of the server never noticed.
        assert client.is_server_live()
        answer = client.infer("identity", _inputs())
        assert answer.as_numpy("Y").tolist() == [1.0]
    finally:
        client.close()
        assert server.stop() == 0, server.log()
