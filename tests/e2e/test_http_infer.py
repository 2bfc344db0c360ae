"""Inference over HTTP with tritonclient: every datatype, JSON and binary, compression."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

DATATYPES = [
    "BOOL",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def sample(datatype: str, shape=(2, 3)) -> np.ndarray:
    """Values that exercise each type's range (extremes, negatives, fractions, NUL bytes)."""
    count = int(np.prod(shape))
    rng = np.random.default_rng(7)
    if datatype == "BYTES":
        pool = [b"", b"a", b"\x00\xff\x00", b"caf\xc3\xa9", b"\x80\x81", b"x" * 300]
        return np.array([pool[i % len(pool)] for i in range(count)], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return (np.arange(count) % 2 == 0).reshape(shape)
    if datatype == "BF16":
        return rng.standard_normal(count).astype(ml_dtypes.bfloat16).reshape(shape)
    dtype = np.dtype(
        datatype.replace("FP", "float").replace("UINT", "uint").replace("INT", "int").lower()
    )
    if dtype.kind in "iu":
        lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
        values = [lo + (hi - lo) * i // max(count - 1, 1) for i in range(count)]
        return np.array(values, dtype=dtype).reshape(shape)
    return (rng.standard_normal(count) * 1000).astype(dtype).reshape(shape)


def identity(client, datatype, array, *, binary_in: bool, binary_out: bool, **kwargs):
    tensor = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary_in)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
    return client.infer(f"identity_{datatype.lower()}", [tensor], outputs=[output], **kwargs)


def assert_equal(datatype, got, want):
    assert got.shape == want.shape
    if datatype == "BYTES":
        got = [x.encode() if isinstance(x, str) else x for x in got.reshape(-1)]
        assert got == list(want.reshape(-1))
    else:
        assert got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_binary_round_trip(client, datatype):
    array = sample(datatype)
    result = identity(client, datatype, array, binary_in=True, binary_out=True)
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == datatype and out["shape"] == [2, 3]
    assert "binary_data_size" in out["parameters"]
    assert_equal(datatype, result.as_numpy("OUTPUT0"), array)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BF16"])
def test_json_round_trip(client, datatype):
    array = sample(datatype)
    if datatype == "BYTES":
        array = np.array(["", "a", "caf\u00e9", "\u2603", "x y", "z"], dtype=object).reshape(2, 3)
        want = np.array([s.encode() for s in array.reshape(-1)], dtype=object).reshape(2, 3)
    else:
        want = array
    result = identity(client, datatype, array, binary_in=False, binary_out=False)
    out = result.get_output("OUTPUT0")
    assert "parameters" not in out and "data" in out
    assert_equal(datatype, result.as_numpy("OUTPUT0"), want)


def test_bf16_as_json_numbers(server, client):
    # tritonclient only sends BF16 as binary; plain JSON numbers work too, both ways.
    values = np.array([[1.5, -2.0, 0.1015625]], dtype=ml_dtypes.bfloat16)
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "BF16",
                    "shape": [1, 3],
                    "data": values.astype(float).reshape(-1).tolist(),
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
        }
    ).encode()
    status, _, reply = post(server, "/v2/models/identity_bf16/infer", body)
    assert status == 200
    out = json.loads(reply)["outputs"][0]
    assert out == {
        "name": "OUTPUT0",
        "datatype": "BF16",
        "shape": [1, 3],
        "data": [1.5, -2.0, 0.1015625],
    }
    result = identity(client, "BF16", values, binary_in=True, binary_out=False)
    assert_equal("BF16", result.as_numpy("OUTPUT0"), values)


def test_bytes_with_nul_and_invalid_utf8(client):
    array = np.array([[b"\x00", b"\xff\xfe\x00abc", b"", b"\xc3\x28"]], dtype=object)
    result = identity(client, "BYTES", array, binary_in=True, binary_out=True)
    assert result.as_numpy("OUTPUT0").tolist() == array.tolist()


def test_mixed_json_input_binary_output_and_request_id(client):
    array = sample("INT32")
    result = identity(client, "INT32", array, binary_in=False, binary_out=True, request_id="r-42")
    assert result.get_response()["id"] == "r-42"
    assert result.get_response()["model_name"] == "identity_int32"
    assert result.get_response()["model_version"] == "1"
    assert_equal("INT32", result.as_numpy("OUTPUT0"), array)


def test_no_outputs_named_returns_all_binary(client):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2, dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    outputs = result.get_response()["outputs"]
    assert sorted(o["name"] for o in outputs) == ["OUTPUT0", "OUTPUT1"]
    assert all(o["parameters"]["binary_data_size"] == 16 for o in outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_requested_output_subset(client):
    a = np.arange(4, dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(a, binary_data=False)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = client.infer("add_sub", inputs, outputs=outputs, model_version="1")
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros(4, np.float32))
    assert result.as_numpy("OUTPUT0") is None


def test_request_parameters_reach_the_model(client):
    tensor = httpclient.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.array([5, 6], dtype=np.int32))
    result = client.infer(
        "params",
        [tensor],
        request_id="p-1",
        parameters={"text": "hello", "count": 3, "flag": True, "ratio": 0.5},
    )
    response = result.get_response()
    assert response["id"] == "p-1"
    params = response["parameters"]
    assert {k: params[k] for k in ("text", "count", "flag", "ratio")} == {
        "text": "hello",
        "count": 3,
        "flag": True,
        "ratio": 0.5,
    }
    assert "binary_data_output" not in params  # wire-only keys stay in the codec
    assert params["seen_request_id"] == "p-1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [5, 6])


def test_protocol_parameters_do_not_reach_the_model(client):
    """As in Triton 2.51: the server acts on these; the model's parameters() holds the rest."""
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    result = client.infer(
        "params",
        [tensor],
        sequence_id=5,
        sequence_start=True,
        sequence_end=True,
        priority=1,
        timeout=100000,
        parameters={"custom": "kept"},
    )
    params = result.get_response()["parameters"]
    assert {k: v for k, v in params.items() if k != "seen_request_id"} == {"custom": "kept"}


@pytest.mark.parametrize("request_algorithm", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_algorithm", [None, "gzip", "deflate"])
def test_compression(client, request_algorithm, response_algorithm):
    array = sample("FP64", (4, 50))
    tensor = httpclient.InferInput("INPUT0", list(array.shape), "FP64")
    tensor.set_data_from_numpy(array)
    result = client.infer(
        "identity_fp64",
        [tensor],
        request_compression_algorithm=request_algorithm,
        response_compression_algorithm=response_algorithm,
    )
    assert_equal("FP64", result.as_numpy("OUTPUT0"), array)


def post(server, path: str, body: bytes, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def json_identity_body(values: list[int]) -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT64", "shape": [1, len(values)], "data": values}
            ]
        }
    ).encode()


@pytest.mark.parametrize(
    ("encoding", "decompress"),
    [("gzip", gzip.decompress), ("deflate", zlib.decompress)],
)
def test_response_is_compressed_on_the_wire(server, encoding, decompress):
    body = json_identity_body(list(range(100)))
    status, headers, reply = post(
        server, "/v2/models/identity_int64/infer", body, {"Accept-Encoding": encoding}
    )
    assert status == 200
    assert headers["Content-Encoding"] == encoding
    assert headers["Content-Type"] == "application/json"
    assert json.loads(decompress(reply))["outputs"][0]["data"] == list(range(100))


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("gzip;q=0.5, deflate;q=0.8", "deflate"),
        ("deflate;q=0.2, gzip", "gzip"),
        ("br", None),
        ("identity", None),
        ("gzip;q=0", None),
    ],
)
def test_accept_encoding_weights(server, accept, expected):
    status, headers, reply = post(
        server,
        "/v2/models/identity_int64/infer",
        json_identity_body([1, 2]),
        {"Accept-Encoding": accept},
    )
    assert status == 200
    assert headers.get("Content-Encoding") == expected
    if expected is None:
        assert json.loads(reply)["outputs"][0]["data"] == [1, 2]


def binary_identity_header(data: np.ndarray) -> bytes:
    """The JSON part of a binary-extension request of INT64 ``data``, output asked binary."""
    return json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT64",
                    "shape": list(data.shape),
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_binary_request_on_the_wire(server, encoding):
    data = np.arange(1000, dtype=np.int64).reshape(1, 1000)
    header = binary_identity_header(data)
    plain = header + data.tobytes()
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    status, headers, reply = post(
        server,
        "/v2/models/identity_int64/infer",
        packed,
        {"Content-Encoding": encoding, "Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    length = int(headers["Inference-Header-Content-Length"])
    meta = json.loads(reply[:length])
    assert meta["outputs"][0]["parameters"] == {"binary_data_size": data.nbytes}
    assert reply[length:] == data.tobytes()


def test_large_tensor(client):
    array = np.arange(8 * 1024 * 1024, dtype=np.float32).reshape(1, -1)  # 32 MiB each way
    result = identity(client, "FP32", array, binary_in=True, binary_out=True)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), array)


def test_empty_tensor(client):
    array = np.zeros((1, 0), dtype=np.float32)
    result = identity(client, "FP32", array, binary_in=True, binary_out=True)
    assert result.as_numpy("OUTPUT0").shape == (1, 0)


def test_answers_keep_the_connection_open_unless_told_otherwise(server):
    """Inference answers are written in one piece (frontends/http/answer.py); the connection
    stays open for the next request over HTTP/1.1 and closes when the client asks."""
    path = "/v2/models/identity_int64/infer"
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        sockets = []
        for values in ([1, 2], [3, 4, 5]):
            conn.request("POST", path, body=json_identity_body(values))
            response = conn.getresponse()
            reply = response.read()
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json"
            assert int(response.headers["Content-Length"]) == len(reply)
            assert json.loads(reply)["outputs"][0]["data"] == values
            assert not response.will_close
            sockets.append(conn.sock)
        assert sockets[0] is sockets[1], "the second request reused the connection"
        conn.request("POST", path, body=json_identity_body([6]), headers={"Connection": "close"})
        response = conn.getresponse()
        assert response.status == 200
        assert response.headers["Connection"] == "close"
        assert json.loads(response.read())["outputs"][0]["data"] == [6]
        assert response.will_close
    finally:
        conn.close()


def test_binary_answers_carry_the_header_length(server):
    data = np.arange(6, dtype=np.int64).reshape(1, 6)
    header = binary_identity_header(data)
    status, headers, reply = post(
        server,
        "/v2/models/identity_int64/infer",
        header + data.tobytes(),
        {"Inference-Header-Content-Length": str(len(header))},
    )
    assert status == 200
    assert headers["Content-Type"] == "application/octet-stream"
    json_length = int(headers["Inference-Header-Content-Length"])
    assert int(headers["Content-Length"]) == len(reply) == json_length + data.nbytes
    answer = json.loads(reply[:json_length])
    assert answer["outputs"][0]["parameters"]["binary_data_size"] == data.nbytes
    assert np.array_equal(np.frombuffer(reply[json_length:], np.int64).reshape(1, 6), data)


def test_classification_extension(client):
    """Top K per batch element as "value:index:label", as Triton 2.51 answers (checked side
    by side): %f for floating point, ties in index order, K above the element count gives all,
    0 leaves the output as it is."""
    scores = httpclient.InferInput("INPUT0", [2, 4], "FP32")
    scores.set_data_from_numpy(np.array([[0.1, 0.7, 0.15, 0.05], [3, 1, 2, 2.5]], np.float32))
    top2 = client.infer(
        "classify_fp32",
        [scores],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)],
    )
    assert top2.as_numpy("OUTPUT0").tolist() == [
        [b"0.700000:1:dog", b"0.150000:2:bird"],
        [b"3.000000:0:cat", b"2.500000:3:fish"],
    ]
    values = httpclient.InferInput("INPUT0", [5], "INT32")
    values.set_data_from_numpy(np.array([4, 9, -1, 9, 2], np.int32))
    top = client.infer(
        "classify_int32",
        [values],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=9)],
    )
    assert top.as_numpy("OUTPUT0").tolist() == [b"9:1", b"9:3", b"4:0", b"2:4", b"-1:2"]
    assert "classification" in client.get_server_metadata()["extensions"]


# -- raw binary requests (Inference-Header-Content-Length: 0) ---------------------------------
def test_a_raw_binary_body_is_the_models_one_input(server):
    values = np.arange(8, dtype=np.float32)
    for chunked in (False, True):
        headers = {"Inference-Header-Content-Length": "0"}
        body = values.tobytes()
        if chunked:  # the body's framing does not matter
            headers["Transfer-Encoding"] = "chunked"
            body = b"%X\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        status, reply_headers, reply = post(server, "/v2/models/identity_fp32/infer", body, headers)
        assert status == 200, reply
        json_length = int(reply_headers["Inference-Header-Content-Length"])
        header = json.loads(reply[:json_length])
        # One variable-sized dimension deduced from the body's size, under a batch of 1.
        assert header["outputs"][0]["shape"] == [1, 8]
        assert reply[json_length:] == values.tobytes()  # outputs come back binary


@pytest.mark.parametrize(
    ("model", "body", "message"),
    [
        (
            "add_sub",
            bytes(32),
            "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be"
            " deduced but got 2 inputs in 'add_sub' model configuration",
        ),
        (
            "identity_bytes",
            b"427",
            "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the model must"
            " have input shape [1]",
        ),
        (
            "identity_fp32",
            bytes(6),
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model"
            " 'identity_fp32'. Expected 4, got 6",
        ),
    ],
)
def test_raw_binary_requests_a_model_cannot_take(server, model, body, message):
    headers = {"Inference-Header-Content-Length": "0"}
    status, _, reply = post(server, f"/v2/models/{model}/infer", body, headers)
    assert (status, json.loads(reply)) == (400, {"error": message})
