"""Fuzzing the HTTP connection layer of a real server: random request heads, bodies, chunked
encodings, binary-extension headers and ways of cutting the bytes into writes. Whatever
arrives, the server answers or closes the connection (never hangs), and answers the next
well-formed request as before; well-formed requests, however they are cut and whatever
follows them, each get their answer."""

from __future__ import annotations

import errno
import json
import socket
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GOOD_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
).encode()
GOOD = (
    b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    % len(GOOD_BODY)
    + GOOD_BODY
)
PATHS = [
    b"/v2/models/identity_fp32/infer",
    b"/v2/models/add_sub/infer",
    b"/v2/models/identity_fp32",
    b"/v2/health/ready",
    b"/v2/repository/index",
    b"/v2/systemsharedmemory/region/r/register",
    b"/v2/models/identity_fp32/generate",
    b"/v2/logging",
    b"/",
]
token = st.binary(min_size=1, max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b)
header_names = (
    st.sampled_from(
        [
            b"Content-Length",
            b"Transfer-Encoding",
            b"Inference-Header-Content-Length",
            b"Content-Encoding",
            b"Content-Type",
            b"Connection",
            b"Expect",
            b"Host",
        ]
    )
    | token
)
header_values = (
    st.sampled_from(
        [
            b"0",
            b"5",
            b"-1",
            b"99999999999",
            b"chunked",
            b"gzip",
            b"deflate",
            b"close",
            b"keep-alive",
            b"100-continue",
            b"application/json",
            b" 12 ",
            b"1,2",
        ]
    )
    | token
)
body_docs = st.sampled_from(
    [
        GOOD_BODY,
        b"",
        b"{",
        b"[]",
        b'{"inputs": 5}',
        b"\x00" * 16,
        b'{"inputs":[{"name":"INPUT0",'
        b'"shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}' + b"\x00" * 8,
    ]
) | st.binary(max_size=64)


@st.composite
def raw_requests(draw: Any) -> bytes:
    method = draw(st.sampled_from([b"POST", b"GET", b"PUT", b"DELETE", b"OPTIONS"]) | token)
    path = draw(st.sampled_from(PATHS) | token)
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"XYZ"]))
    headers = draw(st.lists(st.tuples(header_names, header_values), max_size=5))
    body = draw(body_docs)
    if draw(st.booleans()):  # a truthful Content-Length
        headers.append((b"Content-Length", str(len(body)).encode()))
    if draw(st.booleans()):  # or a chunked body, in random chunk sizes
        chunks, rest = [], body
        while rest:
            size = draw(st.integers(1, max(1, len(rest))))
            chunks.append(b"%x\r\n%s\r\n" % (size, rest[:size]))
            rest = rest[size:]
        body = b"".join(chunks) + draw(st.sampled_from([b"0\r\n\r\n", b"", b"zz\r\n"]))
        headers.append((b"Transfer-Encoding", b"chunked"))
    head = b"%s %s %s\r\n" % (method, path, version)
    head += b"".join(b"%s: %s\r\n" % pair for pair in headers)
    return head + b"\r\n" + body


def _exchange(port: int, data: bytes, cuts: list[int]) -> bytes:
    """Send ``data`` in pieces, end the sending side, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        start = 0
        try:
            for cut in [*sorted(set(cuts)), len(data)]:
                sock.sendall(data[start:cut])
                start = cut
            sock.shutdown(socket.SHUT_WR)
        except OSError as err:
            if err.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
            return b""  # the server closed first: an answer to what it had read
        received = b""
        try:
            while chunk := sock.recv(65536):  # a hang fails here (socket timeout)
                received += chunk
        except ConnectionResetError:
            pass
        return received


def _still_serves(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(GOOD)
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    requests=st.lists(raw_requests(), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 400), max_size=4),
)
def test_anything_on_a_connection_gets_an_answer_or_a_close_and_harms_nothing(
    server, requests, cuts
) -> None:
    answer = _exchange(server.http_port, b"".join(requests), cuts)
    if answer:
        assert answer.startswith(b"HTTP/1."), answer[:200]
    _still_serves(server.http_port)


@st.composite
def good_requests(draw: Any) -> bytes:
    """A well-formed inference request for identity_fp32: a JSON or a binary-extension body,
    sent with a Content-Length or chunked (random chunk sizes), with harmless extra headers."""
    values = draw(st.lists(st.integers(-1000, 1000), min_size=1, max_size=8))
    headers = [(b"Host", b"x")]
    if draw(st.booleans()):
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, len(values)],
                        "datatype": "FP32",
                        "data": values,
                    }
                ]
            }
        ).encode()
        headers.append((b"Content-Type", b"application/json"))
    else:
        data = struct.pack(f"<{len(values)}f", *values)
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": "INPUT0",
                        "shape": [1, len(values)],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": len(data)},
                    }
                ]
            }
        ).encode()
        body = header + data
        headers.append((b"Inference-Header-Content-Length", str(len(header)).encode()))
    if draw(st.booleans()):
        headers.append((draw(st.sampled_from([b"X-Extra", b"Accept", b"User-Agent"])), b"1"))
    if draw(st.booleans()):
        chunks, rest = [], body
        while rest:
            size = draw(st.integers(1, max(1, len(rest))))
            chunks.append(b"%x\r\n%s\r\n" % (size, rest[:size]))
            rest = rest[size:]
        body = b"".join(chunks) + b"0\r\n\r\n"
        headers.append((b"Transfer-Encoding", b"chunked"))
    else:
        headers.append((b"Content-Length", str(len(body)).encode()))
    head = b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\n"
    head += b"".join(b"%s: %s\r\n" % pair for pair in headers)
    return head + b"\r\n" + body


def _statuses(answers: bytes) -> list[bytes]:
    """The status lines of the answers in ``answers`` (each with a Content-Length)."""
    statuses = []
    while answers:
        head, _, rest = answers.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        statuses.append(lines[0])
        length = next(
            int(line.split(b":", 1)[1])
            for line in lines[1:]
            if line.lower().startswith(b"content-length:")
        )
        answers = rest[length:]
    return statuses


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    requests=st.lists(good_requests(), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 600), max_size=4),
)
def test_every_well_formed_request_gets_its_answer(server, requests, cuts) -> None:
    """Well-formed requests pipelined on one connection, cut into random writes, the sending
    side closed after the last (a half-close): each is answered 200, in order, as Triton
    answers them."""
    answer = _exchange(server.http_port, b"".join(requests), cuts)
    assert _statuses(answer) == [b"HTTP/1.1 200 OK"] * len(requests)
