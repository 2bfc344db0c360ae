"""Ensembles the core runs whole (every step's model on a lane: ``rust/src/lane/ensemble.rs``)
against the reference scheduler: the same generated requests (HTTP JSON and binary, gRPC raw
contents; outputs named or not, ids, priorities, shapes the ensemble or a step refuses, inputs
a step fails on) sent over real sockets to a server whose core runs them and to one with
``--backend-config=python,core-path=off`` get the same status, headers and bytes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._proto import grpc_service_pb2 as pb

from tests.conftest import ROOT, RunningServer
from tests.e2e.corepair import Connection, grpc_answer, server_pair

ENSEMBLE_MODELS = ROOT / "tests" / "models_ensemble"
# Ensembles whose steps answer the same whatever ran before (not ens_meet: its count_up
# counts its calls), each with its outputs and whether it batches.
ENSEMBLES = {
    "ens_mixed": (["PLUS", "TEXT", "HALF"], True),
    "ens_rebatch": (["NEG", "OUT"], True),
    "ens_batched": (["TWO"], True),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    logs = tmp_path_factory.mktemp("core_ensembles")
    yield from server_pair([ENSEMBLE_MODELS], logs)


@st.composite
def ensemble_inputs(draw: Any) -> tuple[str, list[int], np.ndarray]:
    """An ensemble, and an INT32 input for it: mostly one it takes, sometimes one it (or a
    step: a batch of 2 reaches ens_rebatch's non-batching step as [2, 1]; a negative value
    fails add_one) refuses."""
    model = draw(st.sampled_from(sorted(ENSEMBLES)))
    rows = draw(st.integers(1, 2))
    columns = 1 if model == "ens_rebatch" else draw(st.integers(1, 3))
    shape = [rows, columns]
    if draw(st.integers(0, 12)) == 0:
        shape = [columns]  # no batch dimension
    low = -1 if draw(st.integers(0, 8)) == 0 else 0
    count = int(np.prod(shape))
    values = np.array(draw(st.lists(st.integers(low, 99), min_size=count, max_size=count)))
    return model, shape, values.astype(np.int32).reshape(shape)


@st.composite
def http_requests(draw: Any) -> tuple[str, bytes, dict[str, str]]:
    model, shape, values = draw(ensemble_inputs())
    outputs, _ = ENSEMBLES[model]
    entry: dict[str, Any] = {"name": "IN", "datatype": "INT32", "shape": shape}
    binary = draw(st.booleans())
    tail = b""
    if binary:
        tail = values.tobytes()
        entry["parameters"] = {"binary_data_size": len(tail)}
    else:
        entry["data"] = values.reshape(-1).tolist()
    doc: dict[str, Any] = {"inputs": [entry]}
    if draw(st.booleans()):
        doc["id"] = draw(st.sampled_from(["1", "ens-7"]))
    parameters: dict[str, Any] = {}
    if draw(st.booleans()):
        parameters["binary_data_output"] = draw(st.booleans())
    if draw(st.integers(0, 4)) == 0:
        parameters["priority"] = draw(st.integers(0, 2))
    if parameters:
        doc["parameters"] = parameters
    if draw(st.booleans()):
        named = draw(st.lists(st.sampled_from([*outputs, "NOPE"]), min_size=1, unique=True))
        doc["outputs"] = [
            {"name": name, "parameters": {"binary_data": draw(st.booleans())}} for name in named
        ]
    header = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers = {"Inference-Header-Content-Length": str(len(header))}
    return f"/v2/models/{model}/infer", header + tail, headers


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(http_requests())
def test_the_core_runs_ensembles_as_the_reference_scheduler(
    connections: tuple[Connection, Connection], request: tuple[str, bytes, dict[str, str]]
) -> None:
    core, reference = connections
    assert core.ask(*request) == reference.ask(*request)


@st.composite
def grpc_requests(draw: Any) -> bytes:
    model, shape, values = draw(ensemble_inputs())
    outputs, _ = ENSEMBLES[model]
    message = pb.ModelInferRequest(model_name=model)
    if draw(st.booleans()):
        message.id = draw(st.sampled_from(["1", "ens-é"]))
    message.inputs.add(name="IN", datatype="INT32", shape=shape)
    message.raw_input_contents.append(values.tobytes())
    for name in draw(st.lists(st.sampled_from([*outputs, "NOPE"]), max_size=2, unique=True)):
        message.outputs.add(name=name)
    return message.SerializeToString()


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(grpc_requests())
def test_grpc_calls_to_ensembles_get_the_reference_answers(
    grpc_calls: tuple[Any, Any], message: bytes
) -> None:
    core, reference = grpc_calls
    assert grpc_answer(core, message) == grpc_answer(reference, message)


def test_the_ensembles_statistics_count_the_cores_runs(
    servers: tuple[RunningServer, ...], connections: tuple[Connection, Connection]
) -> None:
    """A request the core ran counts in the ensemble's own statistics, as the reference
    scheduler counts its own, with its steps' queue and compute times."""
    client = httpclient.InferenceServerClient(servers[0].http_url)
    body = json.dumps(
        {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}
    ).encode()
    try:
        before = client.get_inference_statistics("ens_batched")["model_stats"][0]
        for _ in range(5):
            status, _, answer = connections[0].ask("/v2/models/ens_batched/infer", body, {})
            assert status == b"HTTP/1.1 200 OK", answer
        after = client.get_inference_statistics("ens_batched")["model_stats"][0]
    finally:
        client.close()

    def grown(phase: str) -> tuple[int, int]:
        now, earlier = after["inference_stats"][phase], before["inference_stats"][phase]
        return (
            int(now.get("count", 0)) - int(earlier.get("count", 0)),
            int(now.get("ns", 0)) - int(earlier.get("ns", 0)),
        )

    assert grown("success")[0] == 5
    assert int(after["inference_count"]) - int(before["inference_count"]) == 5
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        count, ns = grown(phase)
        assert count == 5 and ns > 0, phase
