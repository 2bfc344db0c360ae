"""Restricted API groups (--http-restricted-api, --grpc-restricted-protocol), answered as
Triton 2.51 answers them (checked side by side): HTTP 403 text/plain with
{"error":"This API is restricted, expecting header '<key>'"}, gRPC UNAVAILABLE "This protocol
is restricted, expecting header 'triton-grpc-protocol-<key>'"."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import TEST_MODELS, RunningServer, start_server


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(
        [TEST_MODELS],
        tmp_path_factory.mktemp("locked") / "server.log",
        "--http-restricted-api=model-repository,statistics:admin-key=admin-value",
        "--grpc-restricted-protocol=model-repository,health:admin-key=admin-value",
        "--model-control-mode=explicit",
        "--load-model=identity_fp32",
    )
    yield server
    assert server.stop() == 0


def http(server: RunningServer, method: str, path: str, **headers: str) -> tuple[int, str, str]:
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read().decode()


def test_http_groups_answer_only_with_their_header(locked: RunningServer) -> None:
    refused = (
        403,
        "text/plain",
        '{"error":"This API is restricted, expecting header \'admin-key\'"}',
    )
    assert http(locked, "POST", "/v2/repository/index") == refused
    assert http(locked, "GET", "/v2/models/stats") == refused
    assert http(locked, "POST", "/v2/repository/index", **{"admin-key": "wrong"}) == refused
    status, _, body = http(locked, "POST", "/v2/repository/index", **{"admin-key": "admin-value"})
    assert status == 200 and "identity_fp32" in body
    assert http(locked, "GET", "/v2/health/ready")[0] == 200  # not restricted over HTTP


def test_grpc_groups_answer_only_with_their_metadata(locked: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(locked.grpc_url)
    try:
        for call in (client.is_server_live, client.get_model_repository_index):
            with pytest.raises(InferenceServerException) as caught:
                call()
            assert caught.value.status() == "StatusCode.UNAVAILABLE"
            assert caught.value.message() == (
                "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
            )
        allowed = {"triton-grpc-protocol-admin-key": "admin-value"}
        assert client.is_server_live(headers=allowed)
        assert client.get_model_repository_index(headers=allowed).models
        assert client.get_server_metadata().name  # metadata is not restricted
    finally:
        client.close()


def test_a_malformed_restriction_refuses_to_start(tmp_path) -> None:
    server = start_server(
        [TEST_MODELS], tmp_path / "log", "--http-restricted-api=health", wait_ready=False
    )
    assert server.wait_exit(60) != 0
    assert (
        "--http-restricted-api option format is"
        " '<API_1>,<API_2>:<restricted-key>=<restricted-value>'. Got health"
    ) in server.log()
