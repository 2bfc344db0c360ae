"""Ensembles end to end: the real server and tritonclient over real sockets.

``tests/models_ensemble``: ``ens_mixed`` runs ``add_one`` (INT32, dynamic batching) and then,
independently, ``to_text`` (INT32 → BYTES) and ``halve`` (INT32 → FP32) on its output;
``ens_batched`` runs ``add_one`` twice in a row; ``ens_stream`` and ``ens_meet`` have a decoupled
step (``count_up``). Broken ensembles are written to a temporary
repository and loaded in explicit mode.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, RunningServer, start_server

ENSEMBLE_MODELS = ROOT / "tests" / "models_ensemble"
WAIT_S = 30.0


@pytest.fixture(scope="module")
def ens_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server([ENSEMBLE_MODELS], tmp_path_factory.mktemp("ensembles") / "server.log")
    yield server
    assert server.stop() == 0, server.log()


def int32_input(module: Any, values: list[list[int]]) -> Any:
    array = np.array(values, dtype=np.int32)
    tensor = module.InferInput("IN", list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return tensor


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_steps_with_mixed_datatypes_run_and_map_their_tensors(
    ens_server: RunningServer, module: Any
) -> None:
    url = ens_server.http_url if module is httpclient else ens_server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        result = client.infer("ens_mixed", [int32_input(module, [[1, 2, 3], [10, 20, 30]])])
        assert result.as_numpy("PLUS").tolist() == [[2, 3, 4], [11, 21, 31]]
        assert result.as_numpy("TEXT").tolist() == [
            [b"n=2", b"n=3", b"n=4"],
            [b"n=11", b"n=21", b"n=31"],
        ]
        assert result.as_numpy("HALF").dtype == np.float32
        assert result.as_numpy("HALF").tolist() == [[1.0, 1.5, 2.0], [5.5, 10.5, 15.5]]
        # Only what is asked for comes back.
        only = client.infer(
            "ens_mixed",
            [int32_input(module, [[4]])],
            outputs=[module.InferRequestedOutput("HALF")],
        )
        assert only.as_numpy("HALF").tolist() == [[2.5]]
        assert only.as_numpy("PLUS") is None and only.as_numpy("TEXT") is None
    finally:
        client.close()


def test_the_ensemble_describes_itself_as_triton_does(ens_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(ens_server.http_url)
    try:
        metadata = client.get_model_metadata("ens_mixed")
        assert metadata["platform"] == "ensemble"
        assert [i["name"] for i in metadata["inputs"]] == ["IN"]
        config = client.get_model_config("ens_mixed")
        assert config["platform"] == "ensemble"
        assert "instance_group" not in config or not config["instance_group"]
        assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == [
            "add_one",
            "to_text",
            "halve",
        ]
    finally:
        client.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_failing_step_fails_the_request_and_nothing_else(
    ens_server: RunningServer, module: Any
) -> None:
    url = ens_server.http_url if module is httpclient else ens_server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        with pytest.raises(InferenceServerException) as error:
            client.infer("ens_mixed", [int32_input(module, [[1, -5]])])
        assert "add_one: negative input" in error.value.message()
        # The ensemble and its steps keep serving.
        result = client.infer("ens_mixed", [int32_input(module, [[7]])])
        assert result.as_numpy("PLUS").tolist() == [[8]]
    finally:
        client.close()


def test_concurrent_requests_batch_in_their_steps(ens_server: RunningServer) -> None:
    """Each step goes through its model's own scheduler: concurrent ensemble requests meet
    in add_one's dynamic batcher, and every model counts what it ran."""
    http = httpclient.InferenceServerClient(ens_server.http_url)
    grpc = grpcclient.InferenceServerClient(ens_server.grpc_url)
    try:
        before = http.get_inference_statistics("add_one")["model_stats"][0]
        ensemble_before = http.get_inference_statistics("ens_batched")["model_stats"][0]
        results: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
        count = 16
        for index in range(count):
            grpc.async_infer(
                "ens_batched",
                [int32_input(grpcclient, [[index, 100 + index]])],
                callback=lambda result, error, index=index: results.put((index, result, error)),
            )
        for _ in range(count):
            index, result, error = results.get(timeout=WAIT_S)
            assert error is None, error
            assert result.as_numpy("TWO").tolist() == [[index + 2, 102 + index]]
        after = http.get_inference_statistics("add_one")["model_stats"][0]
        ensemble_after = http.get_inference_statistics("ens_batched")["model_stats"][0]
    finally:
        http.close()
        grpc.close()
    success = after["inference_stats"]["success"]["count"]
    assert success - before["inference_stats"]["success"]["count"] == 2 * count
    executions = after["execution_count"] - before["execution_count"]
    assert executions < 2 * count, "no two steps were ever batched together"
    assert any(int(b["batch_size"]) > 1 for b in after["batch_stats"])
    own = ensemble_after["inference_stats"]["success"]["count"]
    assert own - ensemble_before["inference_stats"]["success"]["count"] == count
    # As in Triton, the ensemble's queue and compute times are its steps' sums: here every
    # add_one request was a step of these, so the compute phases match to the nanosecond.
    for phase in ("compute_input", "compute_infer", "compute_output"):
        steps = _grew(before, after, phase)
        mine = _grew(ensemble_before, ensemble_after, phase)
        assert mine == (count, steps[1]), (phase, mine, steps)
    queued, steps_queued = (
        _grew(ensemble_before, ensemble_after, "queue"),
        _grew(before, after, "queue"),
    )
    assert queued[0] == count
    assert 0 < queued[1] <= steps_queued[1] + 2 * count * 1_000_000  # ~1 ms a step's clock apart


def _grew(before: dict[str, Any], after: dict[str, Any], phase: str) -> tuple[int, int]:
    """How much a phase's (count, ns) grew between two statistics."""

    def pair(stats: dict[str, Any]) -> tuple[int, int]:
        tally = stats["inference_stats"][phase]
        return int(tally.get("count", 0)), int(tally.get("ns", 0))

    (count_before, ns_before), (count_after, ns_after) = pair(before), pair(after)
    return count_after - count_before, ns_after - ns_before


# name: (text in ens_batched's config, its replacement, Triton's message)
BROKEN = {
    "ens_unproduced": (
        'output_map { key: "Y" value: "ONE" }',
        'output_map { key: "Y" value: "ELSEWHERE" }',
        "output 'TWO' for ensemble 'ens_unproduced' is not written: at least one of its"
        " depending tensors, 'ONE', is not connected",
    ),
    "ens_cycle": (
        'input_map { key: "X" value: "IN" }',
        'input_map { key: "X" value: "TWO" }',
        "ensemble input 'IN' for ensemble ens_cycle' is not used",
    ),
    "ens_twice": (
        'output_map { key: "Y" value: "TWO" }',
        'output_map { key: "Y" value: "ONE" }',
        "ensemble tensor 'ONE' can appear in an output map only once for ensemble 'ens_twice'"
        " step 1",
    ),
    "ens_missing_model": (
        'model_name: "add_one"',
        'model_name: "nope"',
        "ensemble ens_missing_model contains models that are not available or ambiguous: nope",
    ),
    "ens_bad_input": (
        'input_map { key: "X" value: "IN" }',
        'input_map { key: "WRONG" value: "IN" }',
        "in ensemble ens_bad_input, ensemble tensor IN is mapping to non-existing input WRONG"
        " in model add_one",
    ),
    "ens_dtype": (
        'input [ { name: "IN" data_type: TYPE_INT32',
        'input [ { name: "IN" data_type: TYPE_FP32',
        "in ensemble ens_dtype, ensemble tensor IN: inconsistent data type: TYPE_FP32 is"
        " inferred from model ens_dtype while TYPE_INT32 is inferred from model add_one",
    ),
    "ens_batch": (
        "max_batch_size: 16",
        "max_batch_size: 32",
        "ensemble ens_batch allows maximum batch size 32, but it contains model add_one which"
        " only allows maximum batch size to be 16",
    ),
    "ens_instances": (
        "ensemble_scheduling {",
        "instance_group [ { count: 1 } ]\nensemble_scheduling {",
        "instance group should not be specified for ensemble 'ens_instances'",
    ),
}


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("ensemble_repository")
    shutil.copytree(ENSEMBLE_MODELS / "add_one", repository / "add_one")
    source = (ENSEMBLE_MODELS / "ens_batched" / "config.pbtxt").read_text()
    for name, (old, new, _) in BROKEN.items():
        text = source.replace('name: "ens_batched"', f'name: "{name}"')
        assert old in text
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(text.replace(old, new, 1))
    shutil.copytree(ENSEMBLE_MODELS / "ens_batched", repository / "ens_batched")
    server = start_server(
        [repository],
        tmp_path_factory.mktemp("explicit_ensembles") / "server.log",
        "--model-control-mode=explicit",
        "--load-model=add_one",
    )
    yield server
    assert server.stop() == 0, server.log()


# Refused while Triton polls the repository (the ensemble's own structure), the others once
# it is loaded against its steps; both are listed by name only (observed on Triton 2.51).
POLLED = {"ens_unproduced", "ens_cycle", "ens_twice", "ens_instances"}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_ensemble_is_refused_at_load(explicit_server: RunningServer, name: str) -> None:
    message = BROKEN[name][2]
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        with pytest.raises(InferenceServerException) as error:
            client.load_model(name)
        if name in POLLED:
            assert error.value.status() == "500"
            assert error.value.message() == (
                f"failed to load '{name}', failed to poll from model repository: {message}"
            )
            assert f"Poll failed for model directory '{name}': {message}" in explicit_server.log()
        else:
            assert error.value.status() == "400"
            assert error.value.message() == f"load failed for model '{name}': {message}\n"
        assert not client.is_model_ready(name)
        assert {r["name"]: r for r in client.get_model_repository_index()}[name] == {"name": name}
        assert client.is_model_ready("add_one")
    finally:
        client.close()


def test_an_ensemble_brings_its_step_models_and_goes_with_them(
    explicit_server: RunningServer,
) -> None:
    """As in Triton's explicit mode: loading an ensemble loads its step models; unloading a
    step model unloads the ensemble; ``unload_dependents`` takes the step models along."""
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        client.unload_model("add_one")
        assert not client.is_model_ready("add_one")
        client.load_model("ens_batched")
        assert client.is_model_ready("add_one") and client.is_model_ready("ens_batched")
        result = client.infer("ens_batched", [int32_input(httpclient, [[1]])])
        assert result.as_numpy("TWO").tolist() == [[3]]
        client.unload_model("add_one")
        assert not client.is_model_ready("ens_batched")
        with pytest.raises(InferenceServerException):
            client.infer("ens_batched", [int32_input(httpclient, [[1]])])
        client.load_model("ens_batched")
        client.unload_model("ens_batched", unload_dependents=True)
        assert not client.is_model_ready("ens_batched")
        assert not client.is_model_ready("add_one")
    finally:
        client.load_model("add_one")
        client.close()


def test_a_decoupled_step_makes_the_ensemble_stream(ens_server: RunningServer) -> None:
    """As in Triton: the ensemble is decoupled; each response of its decoupled step runs the
    steps after it and is one response of the ensemble."""
    client = grpcclient.InferenceServerClient(ens_server.grpc_url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    try:
        assert client.get_model_config("ens_stream").config.model_transaction_policy.decoupled
        client.start_stream(callback=lambda result, error: replies.put((result, error)))
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer("ens_stream", [tensor], enable_empty_final_response=True)
        received = [replies.get(timeout=WAIT_S) for _ in range(4)]
        client.stop_stream()
    finally:
        client.close()
    assert all(error is None for _, error in received)
    pairs = [
        (result.as_numpy("N").tolist(), result.as_numpy("NEG").tolist())
        for result, _ in received[:3]
    ]
    assert pairs == [([1], [-1]), ([2], [-2]), ([3], [-3])]
    final = received[3][0].get_response()
    assert final.parameters["triton_final_response"].bool_param and not final.outputs
    http = httpclient.InferenceServerClient(ens_server.http_url)
    try:
        with pytest.raises(InferenceServerException) as error:
            http.infer("ens_stream", [int32_input(httpclient, [[1]])])
        assert "decoupled" in error.value.message()
    finally:
        http.close()


def test_a_decoupled_ensemble_runs_its_branches_at_once(ens_server: RunningServer) -> None:
    """As in Triton, a decoupled ensemble's steps run as soon as their inputs exist: a step
    independent of the decoupled one runs beside it, and the steps after each of its responses
    run while the others are under way (ens_meet's three ``meet`` executions finish only
    together)."""
    client = grpcclient.InferenceServerClient(ens_server.grpc_url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    request_id = f"meet-{uuid.uuid4().hex}"
    try:
        client.start_stream(callback=lambda result, error: replies.put((result, error)))
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([2], dtype=np.int32))
        client.async_stream_infer(
            "ens_meet", [tensor], request_id=request_id, enable_empty_final_response=True
        )
        received = [replies.get(timeout=WAIT_S) for _ in range(3)]
        client.stop_stream()
    finally:
        client.close()
        for mark in (Path(tempfile.gettempdir()) / "tritonfast-meet").glob(f"{request_id}.*"):
            mark.unlink()
    assert all(error is None for _, error in received), [str(e) for _, e in received]
    triples = sorted(
        (r.as_numpy("N").tolist(), r.as_numpy("A").tolist(), r.as_numpy("B").tolist())
        for r, _ in received[:2]
    )
    assert triples == [([1], [1], [2]), ([2], [2], [2])]
    assert received[2][0].get_response().parameters["triton_final_response"].bool_param


def test_a_batch_dimension_of_one_is_bridged_between_steps(ens_server: RunningServer) -> None:
    """As in Triton: a non-batching step in a batching ensemble gets its tensors without the
    batch dimension of 1, and its outputs get it back."""
    client = httpclient.InferenceServerClient(ens_server.http_url)
    try:
        tensor = httpclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[-7]], dtype=np.int32))
        result = client.infer("ens_rebatch", [tensor])
        assert result.as_numpy("NEG").tolist() == [[7]]
        assert result.as_numpy("OUT").tolist() == [[8]]
    finally:
        client.close()
