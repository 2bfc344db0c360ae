"""Fault injection: a response cache flooded with answers that are all different. The cache
stays within its size, counting what its entries really cost (4-byte and empty answers
included): the oldest answers are evicted, and the server's memory stays flat."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import start_server
from tests.e2e.faults import SCALE, report, rss_mib
from tests.e2e.models_on_disk import write_model

CACHE_BYTES = 1 << 20
# About 1,500 small answers fit in 1 MiB; twice as many is sure to evict the first.
FLOOD = 3000

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
response_cache { enable: true }
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "auto" } }
"""

# Answers its input; with EMPTY set, a [batch, 0] answer (no output bytes at all).
MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = x[:, :0] if request.parameters() != "{}" else x
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return answers
"""


def _request(value: int) -> list[grpcclient.InferInput]:
    x = grpcclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return [x]


def _cache_counts(client: grpcclient.InferenceServerClient) -> tuple[int, int]:
    stats = client.get_inference_statistics("cached", as_json=True)["model_stats"][0]
    counts = stats["inference_stats"]
    return int(counts["cache_hit"].get("count", 0)), int(counts["cache_miss"].get("count", 0))


@pytest.mark.parametrize("answers", ["four-bytes", "empty"])
def test_a_flood_of_different_answers_keeps_the_cache_within_its_size(tmp_path, answers) -> None:
    repository = tmp_path / "models"
    write_model(repository, "cached", CONFIG, MODEL)
    server = start_server(
        [repository], tmp_path / "server.log", f"--cache-config=local,size={CACHE_BYTES}"
    )
    client = grpcclient.InferenceServerClient(server.grpc_url)
    parameters = {"EMPTY": 1} if answers == "empty" else None
    try:
        for value in range(500):  # what the first requests start stays
            client.infer("cached", _request(-1 - value), parameters=parameters)
        before = rss_mib(server.proc.pid)
        flood = FLOOD * SCALE
        for value in range(flood):
            client.infer("cached", _request(value), parameters=parameters)
        hits, misses = _cache_counts(client)
        assert hits == 0
        # The newest answer is still there; the first of the flood was evicted long ago.
        client.infer("cached", _request(flood - 1), parameters=parameters)
        client.infer("cached", _request(0), parameters=parameters)
        assert _cache_counts(client) == (hits + 1, misses + 1)
        grew = rss_mib(server.proc.pid) - before
        report(f"cache flood, {answers} answers", requests=flood, rss_mib=f"{grew:+.1f}")
        assert grew < 16, grew
    finally:
        client.close()
        assert server.stop() == 0, server.log()
