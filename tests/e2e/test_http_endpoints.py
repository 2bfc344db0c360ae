"""Every non-inference HTTP endpoint, with tritonclient and with plain HTTP requests."""

from __future__ import annotations

import http.client
import json

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def request(server, method: str, path: str, body: bytes | None = None, headers=None):
    """One plain HTTP request; returns (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def test_server_metadata(server, client):
    metadata = client.get_server_metadata()
    assert isinstance(metadata["name"], str) and metadata["name"]
    assert isinstance(metadata["version"], str)
    assert "binary_tensor_data" in metadata["extensions"]
    status, headers, body = request(server, "GET", "/v2")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == metadata


def test_health(server, client):
    assert client.is_server_live()
    assert client.is_server_ready()
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, body = request(server, "GET", path)
        assert (status, body) == (200, b"")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2"),
        ("POST", "/v2/health/live"),
        ("DELETE", "/v2/health/ready"),
        ("POST", "/v2/models/add_sub"),
        ("PUT", "/v2/models/add_sub/ready"),
        ("POST", "/v2/models/add_sub/versions/1/config"),
        ("GET", "/v2/models/add_sub/infer"),
        ("GET", "/v2/models/add_sub/versions/1/infer"),
    ],
)
def test_wrong_method_is_405(server, method, path):
    status, headers, body = request(server, method, path)
    assert status == 405
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"error": "Method Not Allowed"}


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v1",
        "/v2/",
        "/v2/health",
        "/v2/health/alive",
        "/v2/models",
        "/v2/models/add_sub/versions/one",
        "/v2/models/add_sub/versions/1/bogus",
        "/v2/models/add_sub/infer/extra",
    ],
)
def test_unknown_path_is_404(server, path):
    for method in ("GET", "POST"):
        status, headers, body = request(server, method, path)
        assert status == 404
        assert json.loads(body) == {"error": "Not Found"}
        assert headers["Content-Type"] == "application/json"


def test_model_metadata(server, client):
    expected = {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "python",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [4]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [4]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [4]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [4]},
        ],
    }
    assert client.get_model_metadata("add_sub") == expected
    assert client.get_model_metadata("add_sub", model_version="1") == expected
    batched = client.get_model_metadata("identity_int8")
    assert batched["inputs"] == [{"name": "INPUT0", "datatype": "INT8", "shape": [-1, -1]}]
    status, headers, body = request(server, "GET", "/v2/models/add_sub/versions/1")
    assert (status, headers["Content-Type"], json.loads(body)) == (
        200,
        "application/json",
        expected,
    )


def test_unknown_model_metadata(server, client):
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no_such_model")
    assert info.value.status() == "404"
    assert info.value.message() == "Request for unknown model: 'no_such_model' is not found"
    status, _, body = request(server, "GET", "/v2/models/add_sub/versions/7")
    assert status == 404
    assert json.loads(body) == {
        "error": "Request for unknown model: 'add_sub' version 7 is not found"
    }


def test_model_ready(server, client):
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", model_version="1")
    assert not client.is_model_ready("add_sub", model_version="2")
    assert not client.is_model_ready("no_such_model")
    status, _, body = request(server, "GET", "/v2/models/add_sub/ready")
    assert (status, body) == (200, b"")
    status, _, body = request(server, "GET", "/v2/models/no_such_model/ready")
    assert status == 400
    assert json.loads(body) == {"error": "Model version not ready"}


def test_model_config(server, client):
    config = client.get_model_config("add_sub")
    assert config["name"] == "add_sub"
    assert config["backend"] == "python"
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [4]
    assert client.get_model_config("add_sub", model_version="1") == config
    status, headers, body = request(server, "GET", "/v2/models/identity_int8/config")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["max_batch_size"] == 8
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("no_such_model")
    assert info.value.status() == "404"
    assert info.value.message() == "Request for unknown model: 'no_such_model' is not found"
