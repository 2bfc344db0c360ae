"""Models with ``execute_batched`` get one concatenated array per input for the whole batch
(assembled by the core in a pooled buffer) and their outputs are split back per request."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

MODEL = "batched_scale"


def _request(rows: int, start: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [rows, 4], "FP32")
    tensor.set_data_from_numpy(start + np.arange(rows * 4, dtype=np.float32).reshape(rows, 4))
    return [tensor]


def test_concurrent_requests_share_one_batched_call(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
        sizes = [1, 3, 2, 4, 1, 2]  # 13 rows: fits one batch of max_batch_size 16
        inputs = [_request(rows, 100.0 * i) for i, rows in enumerate(sizes)]
        done: list[tuple[int, object, object]] = []
        for index, tensors in enumerate(inputs):
            client.async_infer(
                MODEL, tensors, lambda result, error, i=index: done.append((i, result, error))
            )
        for _ in range(400):
            if len(done) == len(sizes):
                break
            time.sleep(0.01)
        assert len(done) == len(sizes)
        seen_rows = set()
        for index, result, error in done:
            assert error is None, error
            expected = 100.0 * index + np.arange(sizes[index] * 4, dtype=np.float32)
            np.testing.assert_array_equal(
                result.as_numpy("OUT"), 3 * expected.reshape(sizes[index], 4)
            )
            assert result.as_numpy("OUT").shape == (sizes[index], 4)
            seen_rows.add(int(result.as_numpy("ROWS")[0, 0]))
        after = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
        executions = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
        assert executions < len(sizes), "the requests were not batched"
        assert max(seen_rows) > max(sizes), seen_rows
        stats = after["inference_stats"]
        assert int(stats["compute_input"]["ns"]) > 0
        assert int(stats["compute_infer"]["ns"]) > 0
    finally:
        client.close()


def test_a_failing_batched_call_fails_its_requests_only(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer(MODEL, _request(1, -5.0))
        assert "ValueError: negative input" in info.value.message()
        result = client.infer(MODEL, _request(2, 1.0))
        assert result.as_numpy("OUT").shape == (2, 4)
    finally:
        client.close()
