"""Statistics extension (HTTP and gRPC): counts that match the requests sent."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture
def grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def one_stats(client: httpclient.InferenceServerClient, model: str) -> dict:
    stats = client.get_inference_statistics(model)["model_stats"]
    assert len(stats) == 1
    return stats[0]


def test_counts_match_requests_sent(http, grpc) -> None:
    before = one_stats(http, "identity_int16")
    for batch in (1, 2, 3):
        tensor = httpclient.InferInput("INPUT0", [batch, 5], "INT16")
        tensor.set_data_from_numpy(np.ones((batch, 5), dtype=np.int16))
        http.infer("identity_int16", [tensor])
    after = one_stats(http, "identity_int16")
    assert after["name"] == "identity_int16" and after["version"] == "1"
    inference = after["inference_stats"]
    assert inference["success"]["count"] - before["inference_stats"]["success"]["count"] == 3
    assert inference["queue"]["count"] - before["inference_stats"]["queue"]["count"] == 3
    assert after["inference_count"] - before["inference_count"] == 6  # 1 + 2 + 3
    assert after["execution_count"] - before["execution_count"] == 3  # no dynamic batching
    assert inference["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    assert inference["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert after["last_inference"] >= before["last_inference"]
    assert after["last_inference"] > 0
    sizes = {b["batch_size"] for b in after["batch_stats"]}
    assert {1, 2, 3} <= sizes
    # gRPC reports the same numbers.
    over_grpc = grpc.get_inference_statistics("identity_int16", as_json=True)["model_stats"][0]
    assert int(over_grpc["inference_count"]) == after["inference_count"]
    assert int(over_grpc["execution_count"]) == after["execution_count"]


def test_failures_are_counted_and_validation_errors_are_not(http) -> None:
    before = one_stats(http, "raiser")
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("raiser", [tensor])
    bad = httpclient.InferInput("INPUT0", [2], "FP32")  # wrong shape: rejected before queueing
    bad.set_data_from_numpy(np.zeros(2, dtype=np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("raiser", [bad])
    after = one_stats(http, "raiser")
    assert (
        after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    )
    assert (
        after["inference_stats"]["success"]["count"]
        == before["inference_stats"]["success"]["count"]
    )


def test_all_models_and_unknown_model(http, grpc) -> None:
    names = {s["name"] for s in http.get_inference_statistics()["model_stats"]}
    assert {"add_sub", "identity_fp32", "raiser"} <= names
    with pytest.raises(InferenceServerException) as info:
        http.get_inference_statistics("nope")
    assert info.value.status() == "400"
    assert info.value.message() == "requested model 'nope' is not available"
    with pytest.raises(InferenceServerException) as info:
        grpc.get_inference_statistics("nope")
    assert "requested model 'nope' is not available" in info.value.message()
