"""Restricted API groups (--http-restricted-api, --grpc-restricted-protocol), answered as
Triton 2.51 answers them (checked side by side): HTTP 403 text/plain with
{"error":"This API is restricted, expecting header '<key>'"}, gRPC UNAVAILABLE "This protocol
is restricted, expecting header 'triton-grpc-protocol-<key>'"."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import TEST_MODELS, RunningServer, start_server
from tests.waiting import wait_for


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


ALL_GROUPS = (
    "health,metadata,inference,shared-memory,model-config,model-repository,statistics,trace,logging"
)
INFER_BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
# One endpoint of each group: method, path, body.
HTTP_ENDPOINTS = {
    "health": ("GET", "/v2/health/live", None),
    "metadata": ("GET", "/v2/models/identity_fp32", None),
    "inference": ("POST", "/v2/models/identity_fp32/infer", INFER_BODY),
    "shared-memory": ("GET", "/v2/systemsharedmemory/status", None),
    "model-config": ("GET", "/v2/models/identity_fp32/config", None),
    "model-repository": ("POST", "/v2/repository/index", b"{}"),
    "statistics": ("GET", "/v2/models/identity_fp32/stats", None),
    "trace": ("GET", "/v2/trace/setting", None),
    "logging": ("GET", "/v2/logging", None),
}


@pytest.fixture(scope="module")
def all_locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(
        [TEST_MODELS],
        tmp_path_factory.mktemp("all-locked") / "server.log",
        f"--http-restricted-api={ALL_GROUPS}:k=v",
        f"--grpc-restricted-protocol={ALL_GROUPS}:k=v",
        "--model-control-mode=explicit",
        "--load-model=identity_fp32",
        wait_ready=False,  # its health endpoints want the header too
    )

    def ready() -> bool:
        try:
            return http(server, "GET", "/v2/health/ready", k="v")[0] == 200
        except urllib.error.URLError:  # not listening yet
            return False

    wait_for(ready, "the server to be ready", timeout=60)
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("group", sorted(HTTP_ENDPOINTS))
def test_every_http_group_is_restricted(all_locked: RunningServer, group: str) -> None:
    method, path, body = HTTP_ENDPOINTS[group]

    def call(**headers: str) -> int:
        request = urllib.request.Request(
            f"http://{all_locked.http_url}{path}", data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as error:
            return error.code

    assert call() == 403
    assert call(k="v") == 200


def _grpc_calls(client: grpcclient.InferenceServerClient) -> dict[str, Any]:
    """One call of each group; each takes the headers to send."""
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return {
        "health": lambda h: client.is_server_ready(headers=h),
        "metadata": lambda h: client.get_model_metadata("identity_fp32", headers=h),
        "inference": lambda h: client.infer("identity_fp32", [tensor], headers=h),
        "shared-memory": lambda h: client.get_system_shared_memory_status(headers=h),
        "model-config": lambda h: client.get_model_config("identity_fp32", headers=h),
        "model-repository": lambda h: client.get_model_repository_index(headers=h),
        "statistics": lambda h: client.get_inference_statistics("identity_fp32", headers=h),
        "trace": lambda h: client.get_trace_settings(headers=h),
        "logging": lambda h: client.get_log_settings(headers=h),
    }


@pytest.mark.parametrize("group", sorted(HTTP_ENDPOINTS))
def test_every_grpc_group_is_restricted(all_locked: RunningServer, group: str) -> None:
    client = grpcclient.InferenceServerClient(all_locked.grpc_url)
    try:
        call = _grpc_calls(client)[group]
        with pytest.raises(InferenceServerException) as caught:
            call(None)
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert caught.value.message() == (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
        )
        assert call({"triton-grpc-protocol-k": "v"}) is not None
    finally:
        client.close()
