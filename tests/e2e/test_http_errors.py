"""Bad inference requests over plain HTTP: each gets Triton's status and message, and the
server keeps answering (on the same keep-alive connection and on new ones)."""

from __future__ import annotations

import http.client
import json
import socket

import numpy as np
import pytest

ADD_SUB = "/v2/models/add_sub/infer"
PREFIX = "[request id: <id_unknown>] "


class Connection:
    """One keep-alive HTTP/1.1 connection to the server."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, path: str, body: bytes, headers=None) -> tuple[int, dict[str, str], bytes]:
        self.conn.request("POST", path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        return response.status, dict(response.headers), response.read()

    def good_inference(self) -> None:
        body = add_sub_json([1, 2, 3, 4], [1, 1, 1, 1])
        status, _, reply = self.post(ADD_SUB, body)
        assert status == 200, reply
        outputs = {o["name"]: o["data"] for o in json.loads(reply)["outputs"]}
        assert outputs == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}


@pytest.fixture
def conn(server):
    c = Connection(server.http_port)
    yield c
    # The same connection, and a fresh one, still work after the bad request.
    c.good_inference()
    c.conn.close()
    fresh = Connection(server.http_port)
    fresh.good_inference()
    fresh.conn.close()


def tensor(name: str, datatype: str, shape: list[int], **fields) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, **fields}


def add_sub_json(a, b) -> bytes:
    return json.dumps(
        {
            "inputs": [
                tensor("INPUT0", "FP32", [len(a)], data=a),
                tensor("INPUT1", "FP32", [len(b)], data=b),
            ]
        }
    ).encode()


def binary_request(inputs: list[tuple[dict, bytes]]) -> tuple[bytes, int]:
    """A request whose inputs all travel as binary data; returns (body, JSON length)."""
    doc = {"inputs": [{**t, "parameters": {"binary_data_size": len(raw)}} for t, raw in inputs]}
    header = json.dumps(doc).encode()
    return header + b"".join(raw for _, raw in inputs), len(header)


def assert_error(reply: tuple[int, dict[str, str], bytes], status: int, message: str) -> None:
    got_status, headers, body = reply
    assert (got_status, json.loads(body)) == (status, {"error": message})
    assert headers["Content-Type"] == "application/json"


FOUR = np.ones(4, dtype=np.float32).tobytes()


def test_unknown_model(conn):
    reply = conn.post("/v2/models/no_such_model/infer", add_sub_json([1.0], [1.0]))
    assert_error(reply, 404, "Request for unknown model: 'no_such_model' is not found")


def test_unknown_model_version(conn):
    reply = conn.post("/v2/models/add_sub/versions/3/infer", add_sub_json([1.0] * 4, [1.0] * 4))
    assert_error(reply, 404, "Request for unknown model: 'add_sub' version 3 is not found")


def test_wrong_input_name(conn):
    body = json.dumps(
        {
            "inputs": [
                tensor("INPUT0", "FP32", [4], data=[1, 2, 3, 4]),
                tensor("WRONG", "FP32", [4], data=[1, 2, 3, 4]),
            ]
        }
    ).encode()
    assert_error(
        conn.post(ADD_SUB, body),
        400,
        "unexpected inference input 'WRONG' for model 'add_sub'",
    )


def test_wrong_shape(conn):
    reply = conn.post(ADD_SUB, add_sub_json([1, 2, 3], [1, 2, 3]))
    assert_error(
        reply,
        400,
        PREFIX + "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [3]. ",
    )


def test_wrong_datatype(conn):
    body, length = binary_request(
        [
            (tensor("INPUT0", "FP64", [4]), np.ones(4, np.float64).tobytes()),
            (tensor("INPUT1", "FP32", [4]), FOUR),
        ]
    )
    reply = conn.post(ADD_SUB, body, {"Inference-Header-Content-Length": str(length)})
    assert_error(
        reply,
        400,
        PREFIX + "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'",
    )


def test_wrong_byte_size(conn):
    body, length = binary_request(
        [(tensor("INPUT0", "FP32", [4]), FOUR[:12]), (tensor("INPUT1", "FP32", [4]), FOUR)]
    )
    reply = conn.post(ADD_SUB, body, {"Inference-Header-Content-Length": str(length)})
    assert_error(
        reply,
        400,
        PREFIX
        + "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 16, got 12",
    )


def test_wrong_byte_size_names_the_request(conn):
    body, length = binary_request([(tensor("INPUT0", "FP32", [4]), FOUR[:8])])
    doc = json.loads(body[:length])
    doc["id"] = "req-9"
    header = json.dumps(doc).encode()
    reply = conn.post(
        ADD_SUB, header + FOUR[:8], {"Inference-Header-Content-Length": str(len(header))}
    )
    assert_error(
        reply,
        400,
        "[request id: req-9] input byte size mismatch for input 'INPUT0' for model 'add_sub'."
        " Expected 16, got 8",
    )


def test_batch_larger_than_max_batch_size(conn):
    body = json.dumps({"inputs": [tensor("INPUT0", "FP32", [9, 1], data=[0.0] * 9)]}).encode()
    reply = conn.post("/v2/models/identity_fp32/infer", body)
    assert_error(
        reply, 400, PREFIX + "inference request batch-size must be <= 8 for 'identity_fp32'"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "The document is empty. at 0"),
        (b"AAAA", "Invalid value. at 0"),
        (b"this is not json", "Invalid value. at 1"),
        (b'{"inputs": [', "Invalid value. at 12"),
        (b'{"inputs": []', "Missing a comma or '}' after an object member. at 13"),
        (b'{"inputs": [] } }', "The document root must not be followed by other values. at 16"),
    ],
)
def test_malformed_json(conn, body, message):
    assert_error(
        conn.post(ADD_SUB, body), 500, "failed to parse the request JSON buffer: " + message
    )


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (
            "/v2/repository/index",
            b'{"ready": "x"}',
            "attempt to access JSON non-boolean as boolean",
        ),
        (
            "/v2/systemsharedmemory/region/r/register",
            b'{"key": 5}',
            "attempt to access JSON non-string as string",
        ),
        (
            "/v2/repository/index",
            b"{bad",
            "failed to parse the request JSON buffer: Missing a name for object member. at 1",
        ),
    ],
)
def test_bodies_triton_cannot_read_are_internal_errors(conn, path, body, message):
    """As Triton 2.51 answers them: a body or member of the wrong JSON type is INTERNAL."""
    assert_error(conn.post(path, body), 500, message)


def test_json_element_count_does_not_match_shape(conn):
    body = json.dumps(
        {
            "inputs": [
                tensor("INPUT0", "FP32", [4], data=[1, 2, 3, 4, 5]),
                tensor("INPUT1", "FP32", [4], data=[1, 2, 3, 4]),
            ]
        }
    ).encode()
    reply = conn.post(ADD_SUB, body)
    assert_error(
        reply, 500, "Unable to parse 'data': Shape does not match true shape of 'data' field"
    )


def test_truncated_binary_body(conn):
    body, length = binary_request(
        [(tensor("INPUT0", "FP32", [4]), FOUR), (tensor("INPUT1", "FP32", [4]), FOUR)]
    )
    reply = conn.post(ADD_SUB, body[:-6], {"Inference-Header-Content-Length": str(length)})
    assert_error(
        reply,
        400,
        "unexpected size for input 'INPUT1', expecting 6 additional bytes for model 'add_sub'",
    )


def test_binary_data_without_header_length(conn):
    body, _ = binary_request(
        [(tensor("INPUT0", "FP32", [4]), FOUR), (tensor("INPUT1", "FP32", [4]), FOUR)]
    )
    header_only = body[: -2 * len(FOUR)]
    reply = conn.post(ADD_SUB, header_only)
    assert_error(
        reply,
        400,
        "unexpected size for input 'INPUT0', expecting 16 additional bytes for model 'add_sub'",
    )


def test_header_length_larger_than_body(conn):
    body, _ = binary_request(
        [(tensor("INPUT0", "FP32", [4]), FOUR), (tensor("INPUT1", "FP32", [4]), FOUR)]
    )
    claimed = len(body) + 100
    reply = conn.post(ADD_SUB, body, {"Inference-Header-Content-Length": str(claimed)})
    assert_error(
        reply, 400, f"inference header size should be in range (0, {len(body)}), got: {claimed}"
    )


def test_additional_binary_data(conn):
    body, length = binary_request(
        [(tensor("INPUT0", "FP32", [4]), FOUR), (tensor("INPUT1", "FP32", [4]), FOUR)]
    )
    reply = conn.post(ADD_SUB, body + b"\x00" * 3, {"Inference-Header-Content-Length": str(length)})
    assert_error(reply, 400, "unexpected additional input data for model 'add_sub'")


def test_bad_bytes_element(conn):
    payload = b"\x05\x00\x00\x00ab"  # claims 5 bytes, carries 2
    body, length = binary_request([(tensor("INPUT0", "BYTES", [1, 1]), payload)])
    reply = conn.post(
        "/v2/models/identity_bytes/infer", body, {"Inference-Header-Content-Length": str(length)}
    )
    assert_error(
        reply,
        400,
        "incomplete string data for inference input 'INPUT0', expecting string of length 5 but"
        " only 2 bytes available",
    )


def test_unsupported_content_encoding(conn):
    status, headers, body = conn.post(
        ADD_SUB, add_sub_json([1] * 4, [1] * 4), {"Content-Encoding": "br"}
    )
    assert (status, json.loads(body)) == (501, {"error": "Unsupported compression type"})
    assert headers["Accept-Encoding"] == "gzip, deflate"


def test_corrupt_gzip_body(conn):
    reply = conn.post(ADD_SUB, b"\x1f\x8b not really gzip", {"Content-Encoding": "gzip"})
    assert_error(reply, 500, "failed to parse the request JSON buffer: The document is empty. at 0")


def test_reserved_parameter(conn):
    body = json.dumps(
        {
            "inputs": [
                tensor("INPUT0", "FP32", [4], data=[1] * 4),
                tensor("INPUT1", "FP32", [4], data=[1] * 4),
            ],
            "parameters": {"triton_secret": 1},
        }
    ).encode()
    assert_error(
        conn.post(ADD_SUB, body),
        400,
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be"
        " specified.",
    )


def test_garbage_on_a_raw_socket(server, conn):
    # Not HTTP at all: the server answers 400 and drops that connection, nothing else.
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"\x00\x01\x02 definitely not http\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.") and reply.split(b" ", 2)[1] == b"400"


def test_raw_socket_binary_request(server, conn):
    # A complete request written by hand, byte for byte, on a raw socket.
    header = json.dumps(
        {
            "inputs": [
                tensor("INPUT0", "FP32", [4], parameters={"binary_data_size": 16}),
                tensor("INPUT1", "FP32", [4], parameters={"binary_data_size": 16}),
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    a = np.arange(4, dtype=np.float32).tobytes()
    body = header + a + a
    head = (
        f"POST {ADD_SUB} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(head + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head_part, _, payload = reply.partition(b"\r\n\r\n")
    lines = head_part.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK"
    fields = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    assert fields["content-type"] == "application/octet-stream"
    length = int(fields["inference-header-content-length"])
    meta = json.loads(payload[:length])
    assert meta["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "FP32",
            "shape": [4],
            "parameters": {"binary_data_size": 16},
        }
    ]
    np.testing.assert_array_equal(np.frombuffer(payload[length:], np.float32), 2 * np.arange(4))
