"""RemoteTriton's secrets, end to end, with a real server and real clients: a callable bound
from this process answers inferences through the server, yet its host's key is in nothing the
server shows (HTTP and gRPC metadata, configurations, statistics, the repository index, the
metrics page, the server's verbose log), and its listener, reached directly, runs no pickle
even from a peer that holds the key, refuses a peer without it, is not held up by a peer that
connects and says nothing, and keeps serving through all of it."""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import urllib.request
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonfast.pytriton import remotewire
from tritonfast.pytriton.decorators import batch
from tritonfast.pytriton.model_config import ModelConfig, Tensor
from tritonfast.pytriton.remote import RemoteTriton

from tests.conftest import RunningServer, start_server
from tests.waiting import wait_for

MODEL = "RemoteDoubler"
TIMEOUT_S = 30


@batch
def double(values: np.ndarray) -> dict[str, np.ndarray]:
    return {"doubled": values * 2}


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of an empty repository that loads models only through its API, as a server
    meant for RemoteTriton runs."""
    folder = tmp_path_factory.mktemp("remote_secrets")
    repository = folder / "repository"
    repository.mkdir()
    # Verbose, so the log holds everything the server would ever write about a load.
    running = start_server(
        [repository], folder / "server.log", "--model-control-mode=explicit", "--log-verbose=1"
    )
    yield running
    code = running.stop()
    assert code == 0, f"server exited with {code}:\n{running.log()}"


@pytest.fixture(scope="module")
def remote(explicit_server: RunningServer) -> Iterator[RemoteTriton]:
    """``double`` bound to the server from this process (run() returns once it is loaded)."""
    bound = RemoteTriton(url=f"http://{explicit_server.http_url}")
    bound.bind(
        model_name=MODEL,
        infer_func=double,
        inputs=[Tensor(name="values", dtype=np.float32, shape=(-1,))],
        outputs=[Tensor(name="doubled", dtype=np.float32, shape=(-1,))],
        config=ModelConfig(max_batch_size=8),
    )
    bound.run()
    yield bound
    assert bound.stop()


@pytest.fixture
def key(remote: RemoteTriton) -> bytes:
    return remote._hosts[MODEL].key


@pytest.fixture
def listener_address(remote: RemoteTriton) -> tuple[str, int]:
    host, port = remote._hosts[MODEL].address.rsplit(":", 1)
    return host, int(port)


def assert_model_answers(server: RunningServer) -> None:
    """One inference through tritonclient HTTP: the proxy forwards it, ``double`` runs here."""
    values = np.array([[1.5, -2.0, 0.0]], dtype=np.float32)
    request = httpclient.InferInput("values", list(values.shape), "FP32")
    request.set_data_from_numpy(values)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        result = client.infer(MODEL, [request])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("doubled"), values * 2)


def key_spellings(key: bytes) -> list[str]:
    """The ways the key could show up in a text: its hex (as the key file holds it) in either
    case, and base64 of that file or of the raw key (as an upload carries a file)."""
    return [
        key.hex(),
        key.hex().upper(),
        base64.b64encode(key.hex().encode()).decode(),
        base64.b64encode(key).decode(),
    ]


def http_texts(server: RunningServer) -> dict[str, str]:
    """Every metadata, configuration, statistics and index response the HTTP endpoint gives
    about the server and the model, as the text that goes over the wire."""
    base = f"http://{server.http_url}"
    gets = [
        "/v2",
        f"/v2/models/{MODEL}",
        f"/v2/models/{MODEL}/versions/1",
        f"/v2/models/{MODEL}/config",
        f"/v2/models/{MODEL}/versions/1/config",
        f"/v2/models/{MODEL}/stats",
        "/v2/models/stats",
    ]
    texts = {f"GET {path}": read_url(base + path) for path in gets}
    texts["POST /v2/repository/index"] = read_url(base + "/v2/repository/index", data=b"{}")
    return texts


def read_url(url: str, data: bytes | None = None) -> str:
    with urllib.request.urlopen(url, data=data, timeout=TIMEOUT_S) as response:
        return str(response.read().decode())


def grpc_texts(server: RunningServer) -> dict[str, str]:
    """The gRPC equivalents, as JSON."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        answers = {
            "server metadata": client.get_server_metadata(as_json=True),
            "model metadata": client.get_model_metadata(MODEL, as_json=True),
            "model config": client.get_model_config(MODEL, as_json=True),
            "model statistics": client.get_inference_statistics(MODEL, as_json=True),
            "all statistics": client.get_inference_statistics(as_json=True),
            "repository index": client.get_model_repository_index(as_json=True),
        }
    finally:
        client.close()
    return {f"gRPC {what}": json.dumps(answer) for what, answer in answers.items()}


def config_parameters(server: RunningServer) -> dict[str, Any]:
    config = json.loads(read_url(f"http://{server.http_url}/v2/models/{MODEL}/config"))
    return dict(config.get("parameters", {}))


# -- the model works -------------------------------------------------------------------------


def test_the_bound_callable_answers_through_the_server(
    explicit_server: RunningServer, remote: RemoteTriton
) -> None:
    assert_model_answers(explicit_server)


def test_the_config_names_the_address_but_not_the_key(
    explicit_server: RunningServer, remote: RemoteTriton
) -> None:
    parameters = config_parameters(explicit_server)
    assert parameters["REMOTE_ADDRESS"]["string_value"] == remote._hosts[MODEL].address
    assert "REMOTE_KEY" not in parameters


# -- the key is nowhere to be read -------------------------------------------------------------


def test_no_text_the_server_shows_holds_the_key(
    explicit_server: RunningServer, remote: RemoteTriton, key: bytes
) -> None:
    # A request served first, so the statistics, the metrics and the log have something to say
    # about the model.
    assert_model_answers(explicit_server)
    texts = {
        **http_texts(explicit_server),
        **grpc_texts(explicit_server),
        "metrics": read_url(f"http://{explicit_server.metrics_url}/metrics"),
        "server log": explicit_server.log(),
    }
    # The texts are about this model (so a missing key is not just a missing model).
    assert MODEL in texts[f"GET /v2/models/{MODEL}/config"]
    assert MODEL in texts["gRPC model config"]
    assert MODEL in texts["metrics"]
    leaks = [
        (source, spelling)
        for source, text in texts.items()
        for spelling in key_spellings(key)
        if spelling in text
    ]
    assert leaks == []


# -- the listener, reached directly ------------------------------------------------------------


def connect(address: tuple[str, int], authkey: bytes) -> Connection:
    """multiprocessing's Client, bounded: it has no timeout of its own, and a listener that
    stopped accepting would leave it waiting for its challenge for good. Raises what Client
    raises (AuthenticationError for a wrong key)."""
    outcome: list[Connection | BaseException] = []

    def attempt() -> None:
        try:
            outcome.append(Client(address, authkey=authkey))
        except BaseException as error:  # handed to the test's thread below
            outcome.append(error)

    threading.Thread(target=attempt, daemon=True, name="test-peer").start()
    wait_for(lambda: outcome, "the host's listener to take a peer", TIMEOUT_S)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


class CreatesMarker:
    """Unpickled, creates ``marker`` (no shell needed: a file API called by the unpickler)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_pickle_from_a_peer_with_the_key_runs_nothing(
    explicit_server: RunningServer,
    listener_address: tuple[str, int],
    key: bytes,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="tritonfast.pytriton.remote")
    marker = tmp_path / "unpickled"
    with connect(listener_address, key) as peer:
        peer.send(CreatesMarker(marker))  # multiprocessing pickles it
        # The host reads it, refuses it as no message of its own and hangs up: the end of the
        # stream is the host having read and dropped it.
        assert peer.poll(TIMEOUT_S), "the host neither answered nor closed the connection"
        with pytest.raises(EOFError):
            peer.recv_bytes()
    assert not marker.exists()
    assert any("malformed batch" in record.getMessage() for record in caplog.records)
    assert_model_answers(explicit_server)


def test_a_peer_without_the_key_is_refused_and_the_listener_keeps_accepting(
    explicit_server: RunningServer, listener_address: tuple[str, int], key: bytes
) -> None:
    with pytest.raises(AuthenticationError):
        connect(listener_address, bytes(byte ^ 0xFF for byte in key))
    assert_model_answers(explicit_server)
    # The listener still takes a peer with the key (the model's own connection was made
    # before the refused one, so its answer alone would not show this).
    assert forwarded_batch(listener_address, key) == [[2.0, 4.0]]


def forwarded_batch(address: tuple[str, int], key: bytes) -> list[list[float]]:
    """What the host answers to a batch sent as the proxy model sends one: typed data, the
    only thing a peer with the key can make it take."""
    request = {"inputs": ["values"], "parameters": {}, "outputs": ["doubled"]}
    values = np.array([[1.0, 2.0]], dtype=np.float32)
    with connect(address, key) as peer:
        peer.send_bytes(remotewire.encode({"requests": [request]}, [values]))
        assert peer.poll(TIMEOUT_S), "the host did not answer a well-formed batch"
        header, outputs = remotewire.decode(peer.recv_bytes())
    assert header == {"answers": [{"outputs": ["doubled"]}]}
    return list(outputs[0].tolist())


def test_a_silent_peer_does_not_keep_others_out(
    explicit_server: RunningServer, listener_address: tuple[str, int], key: bytes
) -> None:
    # Any local process can connect without the key and then say nothing: the challenge it
    # never answers must hold up only its own connection, not the next peer's (a model
    # instance the server starts later, here a peer acting as one).
    with socket.create_connection(listener_address, timeout=TIMEOUT_S):
        assert forwarded_batch(listener_address, key) == [[2.0, 4.0]]
    assert_model_answers(explicit_server)
