"""An ensemble unloaded because a model of one of its steps went away comes back by itself
once every model of its steps is loaded again, as in Triton 2.51 (core's
model_repository_manager.cc keeps such an ensemble in its dependency graph and loads it
within the load of the step model that completes it; server's qa/L0_lifecycle
``test_model_control``: an ensemble unloaded by name is not loaded again).

The real server and tritonclient over real sockets. ``tests/models_ensemble``: ``ens_batched``
runs ``add_one`` twice (IN + 2); ``ens_mixed`` runs ``add_one``, then ``to_text`` and
``halve`` on its output.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, RunningServer, start_server
from tests.waiting import wait_for

ENSEMBLE_MODELS = ROOT / "tests" / "models_ensemble"
MODELS = ("add_one", "to_text", "halve", "ens_batched", "ens_mixed")
PROTOCOLS = pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
UNLOADED = {"version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
READY = {"version": "1", "state": "READY"}


def copy_models(repository: Path) -> None:
    for name in MODELS:
        shutil.copytree(ENSEMBLE_MODELS / name, repository / name)


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("reload_repository")
    copy_models(repository)
    server = start_server(
        [repository],
        tmp_path_factory.mktemp("ensemble_reload") / "server.log",
        "--model-control-mode=explicit",
    )
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
def client(explicit_server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A client of the parametrized protocol; afterwards every model is unloaded again, so
    that each test starts from an empty server."""
    callspec = getattr(request.node, "callspec", None)
    module = callspec.params["module"] if callspec else httpclient
    url = explicit_server.http_url if module is httpclient else explicit_server.grpc_url
    client = module.InferenceServerClient(url)
    yield client
    for name in MODELS:
        client.unload_model(name)
    client.close()


def protocol_of(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def index(client: Any) -> dict[str, dict[str, str]]:
    """The repository index by model name, each row without its name."""
    if protocol_of(client) is httpclient:
        rows = client.get_model_repository_index()
    else:
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    return {row["name"]: {k: v for k, v in row.items() if k != "name"} for row in rows}


def infer_two(client: Any, values: list[list[int]]) -> list[list[int]]:
    """``ens_batched``'s answer: each value plus 2."""
    array = np.array(values, dtype=np.int32)
    tensor = protocol_of(client).InferInput("IN", list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return client.infer("ens_batched", [tensor]).as_numpy("TWO").tolist()


def infer_mixed_text(client: Any) -> list[list[bytes]]:
    tensor = protocol_of(client).InferInput("IN", [1, 2], "INT32")
    tensor.set_data_from_numpy(np.array([[1, 5]], dtype=np.int32))
    return client.infer("ens_mixed", [tensor]).as_numpy("TEXT").tolist()


def assert_refused(client: Any, name: str) -> None:
    """Triton's answer to a request for a model with no loaded version."""
    with pytest.raises(InferenceServerException) as raised:
        infer_two(client, [[1]]) if name == "ens_batched" else infer_mixed_text(client)
    message = f"Request for unknown model: '{name}' has no available versions"
    assert raised.value.message() == message
    not_found = "404" if protocol_of(client) is httpclient else "StatusCode.NOT_FOUND"
    assert raised.value.status() == not_found


@PROTOCOLS
def test_an_ensemble_comes_back_when_its_step_model_is_loaded_again(
    client: Any, module: Any
) -> None:
    client.load_model("ens_batched")
    assert client.is_model_ready("ens_batched") and client.is_model_ready("add_one")
    assert infer_two(client, [[1, 2]]) == [[3, 4]]

    client.unload_model("add_one")
    rows = index(client)
    assert rows["add_one"] == UNLOADED and rows["ens_batched"] == UNLOADED
    assert not client.is_model_ready("ens_batched")
    assert_refused(client, "ens_batched")

    # Triton loads the ensemble again within the load of its step model: once the load
    # answers, the ensemble serves.
    client.load_model("add_one")
    rows = index(client)
    assert rows["add_one"] == READY and rows["ens_batched"] == READY
    assert client.is_model_ready("ens_batched")
    assert infer_two(client, [[1, 2], [10, 20]]) == [[3, 4], [12, 22]]
    assert client.is_server_ready()


@PROTOCOLS
def test_an_ensemble_unloaded_by_name_does_not_come_back(client: Any, module: Any) -> None:
    client.load_model("ens_batched")
    client.unload_model("add_one")
    assert not client.is_model_ready("ens_batched")
    # Unloaded by name while it waits for its step model: it waits no more.
    client.unload_model("ens_batched")
    client.load_model("add_one")
    assert client.is_model_ready("add_one")
    assert index(client)["ens_batched"] == UNLOADED
    assert not client.is_model_ready("ens_batched")
    assert_refused(client, "ens_batched")
    # Asked for by name, it loads as ever.
    client.load_model("ens_batched")
    assert infer_two(client, [[5]]) == [[7]]


@PROTOCOLS
def test_an_ensemble_comes_back_once_every_step_model_is_back(client: Any, module: Any) -> None:
    client.load_model("ens_batched")
    client.load_model("ens_mixed")
    client.unload_model("add_one")  # a step of both
    client.unload_model("to_text")  # a step of ens_mixed only, which is unloaded already
    rows = index(client)
    assert rows["ens_batched"] == UNLOADED and rows["ens_mixed"] == UNLOADED

    client.load_model("add_one")
    assert client.is_model_ready("ens_batched")
    assert infer_two(client, [[0]]) == [[2]]
    # ens_mixed still misses to_text.
    assert index(client)["ens_mixed"] == UNLOADED
    assert not client.is_model_ready("ens_mixed")
    assert_refused(client, "ens_mixed")

    client.load_model("to_text")
    assert index(client)["ens_mixed"] == READY
    assert client.is_model_ready("ens_mixed")
    assert infer_mixed_text(client) == [[b"n=2", b"n=6"]]


def test_an_ensemble_comes_back_with_the_configuration_it_was_loaded_with(
    client: Any,
) -> None:
    """An ensemble loaded with a ``config`` parameter comes back with that configuration (Triton
    keeps it with the model), not with its config.pbtxt."""
    config = {
        "name": "ens_batched",
        "platform": "ensemble",
        "max_batch_size": 4,
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "TWO", "data_type": "TYPE_INT32", "dims": [-1]}],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": "add_one",
                    "model_version": -1,
                    "input_map": {"X": "IN"},
                    "output_map": {"Y": "ONE"},
                },
                {
                    "model_name": "add_one",
                    "model_version": -1,
                    "input_map": {"X": "ONE"},
                    "output_map": {"Y": "TWO"},
                },
            ]
        },
    }
    client.load_model("ens_batched", config=json.dumps(config))
    assert client.get_model_config("ens_batched")["max_batch_size"] == 4
    client.unload_model("add_one")
    client.load_model("add_one")
    assert client.is_model_ready("ens_batched")
    assert client.get_model_config("ens_batched")["max_batch_size"] == 4  # config.pbtxt: 16
    assert infer_two(client, [[1]]) == [[3]]


def test_poll_mode_unloads_the_ensemble_with_its_step_and_loads_it_again(tmp_path: Path) -> None:
    """In poll mode too (Triton's PollAndUpdate updates the same dependency graph): a step
    model's directory that leaves the repository unloads the ensembles using it, and they are
    loaded again once it is back."""
    repository = tmp_path / "repository"
    repository.mkdir()
    copy_models(repository)
    server = start_server(
        [repository],
        tmp_path / "server.log",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.2",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        wait_for(lambda: client.is_server_ready(), "the server to be ready")
        assert infer_two(client, [[1]]) == [[3]]

        shutil.move(repository / "add_one", tmp_path / "add_one")
        # (UNLOADING while the poll that found it gone unloads it.)
        wait_for(lambda: index(client)["ens_batched"] == UNLOADED, "ens_batched to unload")
        assert not client.is_model_ready("ens_batched")
        assert "add_one" not in index(client)
        assert_refused(client, "ens_batched")

        shutil.move(tmp_path / "add_one", repository / "add_one")
        # The ensembles come back one after another, within the poll that finds it back.
        for ensemble in ("ens_batched", "ens_mixed"):
            wait_for(lambda e=ensemble: client.is_model_ready(e), f"{ensemble} to load again")
        assert index(client)["ens_batched"] == READY
        assert infer_two(client, [[1]]) == [[3]]
    finally:
        client.close()
        assert server.stop() == 0, server.log()
