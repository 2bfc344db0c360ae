"""HTTP/1.1 connection handling, on raw sockets: pipelining, ``Expect: 100-continue``,
HTTP/1.0, chunked bodies, bodies the server never reads, and large answers to a client that
reads slowly. Each test ends by checking that the server still answers a fresh client."""

from __future__ import annotations

import gzip
import json
import queue
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import TEST_MODELS, RunningServer, start_server
from tests.waiting import wait_for

ADD_SUB = "/v2/models/add_sub/infer"
IDENTITY = "/v2/models/identity_fp32/infer"


class RawConnection:
    """A socket with a buffered reader, so answers can be read one after another."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.reader = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> tuple[str, dict[str, str], bytes]:
        """The next answer: status line, headers (lower-case names) and body."""
        status = self.reader.readline().decode().rstrip("\r\n")
        headers = {}
        while line := self.reader.readline().decode().rstrip("\r\n"):
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip()
        body = self.reader.read(int(headers.get("content-length", 0)))
        return status, headers, body

    def closed_by_server(self) -> bool:
        return self.reader.read(1) == b""

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


@pytest.fixture
def raw(server):
    conn = RawConnection(server.http_port)
    yield conn
    conn.close()
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live()
    client.close()


def add_sub_request(a: list[float], extra_headers: str = "", version: str = "1.1") -> bytes:
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": a},
                {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": [1, 1, 1, 1]},
            ]
        }
    ).encode()
    head = (
        f"POST {ADD_SUB} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra_headers}\r\n"
    )
    return head.encode() + body


def sums(body: bytes) -> list[float]:
    return next(o["data"] for o in json.loads(body)["outputs"] if o["name"] == "OUTPUT0")


def test_pipelined_requests_are_answered_in_order(raw):
    requests = [add_sub_request([i, i, i, i]) for i in range(8)]
    requests.insert(3, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    requests.insert(5, b"GET /v2/nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
    raw.send(b"".join(requests))
    answers = [raw.answer() for _ in requests]
    assert [a[0] for a in answers] == ["HTTP/1.1 200 OK"] * 5 + ["HTTP/1.1 404 Not Found"] + [
        "HTTP/1.1 200 OK"
    ] * 4
    inference = [a for i, a in enumerate(answers) if i not in (3, 5)]
    assert [sums(body)[0] for _, _, body in inference] == [i + 1 for i in range(8)]
    assert answers[3][2] == b""


@pytest.mark.parametrize(
    "malformed", [b"GET /v2 HTTP/1.1\r\nNo colon here\r\n\r\n", b"\x00\x01\r\n\r\n"]
)
def test_a_malformed_request_pipelined_after_whole_ones_leaves_them_answered(raw, malformed):
    """As Triton: requests sent whole before a malformed one, in the same write, are answered
    in order; then the malformed one gets 400 and the connection closes."""
    raw.send(
        add_sub_request([1, 1, 1, 1])
        + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        + add_sub_request([2, 2, 2, 2])
        + malformed
    )
    first, live, second, refused = (raw.answer() for _ in range(4))
    assert (first[0], sums(first[2])) == ("HTTP/1.1 200 OK", [2, 2, 2, 2])
    assert live[0] == "HTTP/1.1 200 OK"
    assert (second[0], sums(second[2])) == ("HTTP/1.1 200 OK", [3, 3, 3, 3])
    assert refused[0] == "HTTP/1.1 400 Bad Request", refused
    assert raw.closed_by_server()


def test_expect_continue_gets_100_before_the_body_is_sent(raw):
    request = add_sub_request([1, 2, 3, 4], "Expect: 100-continue\r\n")
    head, _, body = request.partition(b"\r\n\r\n")
    raw.send(head + b"\r\n\r\n")
    assert raw.reader.readline() == b"HTTP/1.1 100 Continue\r\n"
    assert raw.reader.readline() == b"\r\n"
    raw.send(body)
    status, _, reply = raw.answer()
    assert status == "HTTP/1.1 200 OK"
    assert sums(reply) == [2, 3, 4, 5]


def test_http10_request_is_answered_and_the_connection_closed(raw):
    raw.send(add_sub_request([1, 1, 1, 1], version="1.0"))
    status, headers, body = raw.answer()
    assert status == "HTTP/1.0 200 OK"
    assert "connection" not in headers  # closing is HTTP/1.0's default
    assert sums(body) == [2, 2, 2, 2]
    assert raw.closed_by_server()


def test_http10_keep_alive_is_kept(raw):
    raw.send(add_sub_request([1, 1, 1, 1], "Connection: keep-alive\r\n", version="1.0"))
    status, headers, _ = raw.answer()
    assert (status, headers["connection"]) == ("HTTP/1.0 200 OK", "keep-alive")
    raw.send(add_sub_request([2, 2, 2, 2], "Connection: keep-alive\r\n", version="1.0"))
    assert sums(raw.answer()[2]) == [3, 3, 3, 3]


def test_connection_close_is_honoured(raw):
    raw.send(add_sub_request([1, 1, 1, 1], "Connection: close\r\n"))
    status, headers, _ = raw.answer()
    assert (status, headers["connection"]) == ("HTTP/1.1 200 OK", "close")
    assert raw.closed_by_server()


def test_chunked_request_body(raw):
    body = add_sub_request([5, 5, 5, 5]).partition(b"\r\n\r\n")[2]
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 10]), body[i : i + 10]) for i in range(0, len(body), 10)
    )
    raw.send(
        f"POST {ADD_SUB} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        + chunks
        + b"0\r\n\r\n"
    )
    status, _, reply = raw.answer()
    assert status == "HTTP/1.1 200 OK"
    assert sums(reply) == [6, 6, 6, 6]


def test_unread_body_closes_the_connection_after_the_answer(raw):
    # An unknown path is answered before its body arrives; the rest of that body can't be
    # told from a next request, so the connection ends after the answer.
    raw.send(b"POST /v2/nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 10)
    status, headers, _ = raw.answer()
    assert (status, headers["connection"]) == ("HTTP/1.1 404 Not Found", "close")
    assert raw.closed_by_server()


def test_header_line_too_long_is_refused(raw):
    raw.send(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    status, _, _ = raw.answer()
    assert status.startswith("HTTP/1.1 4")
    assert raw.closed_by_server()


def identity_request(data: np.ndarray) -> bytes:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, data.size],
                    "parameters": {"binary_data_size": data.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return (
        (
            f"POST {IDENTITY} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(header) + data.nbytes}"
            f"\r\nInference-Header-Content-Length: {len(header)}\r\n\r\n"
        ).encode()
        + header
        + data.tobytes()
    )


def identity_output(headers: dict[str, str], body: bytes) -> np.ndarray:
    return np.frombuffer(body[int(headers["inference-header-content-length"]) :], np.float32)


def test_large_answer_to_a_slow_reader(server, raw):
    # 32 MiB out: more than the socket buffers hold, so the server must wait for the reader;
    # meanwhile other clients are served.
    data = np.arange(8 << 20, dtype=np.float32)
    raw.send(identity_request(data))
    other = httpclient.InferenceServerClient(server.http_url)
    small = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    small.set_data_from_numpy(np.ones((1, 4), np.float32))
    result = other.infer("identity_fp32", [small])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((1, 4), np.float32))
    other.close()
    status, headers, body = raw.answer()
    assert status == "HTTP/1.1 200 OK"
    np.testing.assert_array_equal(identity_output(headers, body), data)


def test_escaped_path_and_query_string(raw):
    # "%5F" is "_"; the query string is not part of the path.
    raw.send(b"GET /v2/models/add%5Fsub/ready?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.answer()[0] == "HTTP/1.1 200 OK"
    raw.send(b"GET /v2/models/add%5Fsub/config HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = raw.answer()
    assert (status, json.loads(body)["name"]) == ("HTTP/1.1 200 OK", "add_sub")


def test_small_and_large_answers_keep_their_order_on_one_connection(raw):
    # Small answers leave from the core's writer thread, large ones through the event loop's
    # transport; while a large one still waits in the transport (the client is not reading),
    # the small ones after it must wait behind it, and the other way round.
    large = np.arange(8 << 20, dtype=np.float32)  # 32 MiB: more than the socket buffers hold
    medium = -np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    raw.send(
        b"".join(
            [
                add_sub_request([1, 1, 1, 1]),
                identity_request(large),
                add_sub_request([2, 2, 2, 2]),
                add_sub_request([3, 3, 3, 3]),
                identity_request(medium),
                add_sub_request([4, 4, 4, 4]),
            ]
        )
    )
    assert sums(raw.answer()[2]) == [2, 2, 2, 2]
    status, headers, body = raw.answer()
    assert status == "HTTP/1.1 200 OK"
    np.testing.assert_array_equal(identity_output(headers, body), large)
    assert sums(raw.answer()[2]) == [3, 3, 3, 3]
    assert sums(raw.answer()[2]) == [4, 4, 4, 4]
    _, headers, body = raw.answer()
    np.testing.assert_array_equal(identity_output(headers, body), medium)
    assert sums(raw.answer()[2]) == [5, 5, 5, 5]


def test_answers_to_concurrent_clients_are_sent_off_the_event_loop(server, raw):
    # By the writer thread; or, for requests the core answers whole, by the model's driver
    # threads (both named by the core). Their CPU time grows with the answers they send. A
    # lone request's answer is sent by the loop itself, so several clients ask at once.
    def writer_ticks() -> int:
        ticks = 0
        for task in Path(f"/proc/{server.proc.pid}/task").iterdir():
            name = (task / "comm").read_text().strip()  # 15 characters at most
            if name in ("tritonfast-outb", "tritonfast-lane"):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime + stime
        return ticks

    clients = [raw] + [RawConnection(server.http_port) for _ in range(7)]
    try:
        before = writer_ticks()
        deadline = time.monotonic() + 30
        while writer_ticks() == before:  # a tick is 10 ms of CPU: a few thousand answers
            assert time.monotonic() < deadline, "no answer was sent off the event loop"
            for client in clients:
                client.send(b"".join(add_sub_request([i, 0, 0, 0]) for i in range(100)))
            for client in clients:
                for i in range(100):
                    assert sums(client.answer()[2])[0] == i + 1
    finally:
        for client in clients[1:]:
            client.close()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_declared_body_lengths_alone_do_not_take_memory(server, raw):
    """Connections that declare huge bodies and send a little hold only what they sent."""
    before = _rss_bytes(server.proc.pid)
    lying = []
    # Twelve declare 2 GiB, twenty-four 32 MiB (past the eager-buffer budget); each sends
    # 300 KB past its head, so its body is received straight into a buffer.
    for declared in [2**31 - 1] * 12 + [32 * 2**20] * 24:
        head = (
            "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
        )
        sock = socket.create_connection(("127.0.0.1", server.http_port))
        sock.sendall(head.encode() + b"{" * 300_000)
        lying.append(sock)
    try:
        # The server keeps answering others meanwhile, and has read what the liars sent.
        raw.send(add_sub_request([1, 2, 3, 4]))
        status, _, body = raw.answer()
        assert status == "HTTP/1.1 200 OK"
        assert sums(body) == [2.0, 3.0, 4.0, 5.0]
        grown = _rss_bytes(server.proc.pid) - before
        # About 11 MB arrived; buffers take memory only where bytes were written.
        assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB"
    finally:
        for sock in lying:
            sock.close()
    wait_for(
        lambda: _rss_bytes(server.proc.pid) - before < 32 * 2**20,
        "the memory of the closed connections to be given back",
    )


def _status_and_body(sock: socket.socket) -> bytes:
    """The status line and body of the next answer on ``sock``."""
    reader = sock.makefile("rb")
    status = reader.readline()
    length = 0
    while line := reader.readline().rstrip(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    answer = status + reader.read(length)
    reader.close()
    return answer


def _post_identity(server: RunningServer, body: bytes, header: bytes = b"") -> bytes:
    """POST ``body`` (with one more ``header`` line) to identity_fp32 on a connection of its
    own; the status line and body of the answer."""
    extra = header + b"\r\n" if header else b""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n%s"
            b"Content-Length: %d\r\n\r\n" % (extra, len(body)) + body
        )
        return _status_and_body(sock)


def test_bodies_past_the_server_wide_budget_are_refused_and_the_budget_comes_back(
    tmp_path: Path,
) -> None:
    """With an 8 MiB budget: a connection holding a 6 MiB body (half sent) leaves no room for
    a 4 MiB one, which gets 503 over HTTP (its bytes read and dropped) and UNAVAILABLE over
    gRPC; once the first goes away, the same requests are served."""
    server = start_server(
        [TEST_MODELS], tmp_path / "server.log", "--request-body-budget-bytes=8388608"
    )
    opened: list[socket.socket] = []  # closed in the end whatever happens
    try:
        holder = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        opened.append(holder)
        holder.sendall(
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n" % (6 << 20) + b"{" * (3 << 20)
        )
        tensor = httpclient.InferInput("INPUT0", [1, 1 << 20], "FP32")  # 4 MiB
        tensor.set_data_from_numpy(np.ones((1, 1 << 20), np.float32))
        body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor])
        head = (
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
            % (header_length, len(body))
        )

        def post() -> bytes:
            """The status line and body of one answer to the 4 MiB request."""
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
                sock.sendall(head + body)
                return _status_and_body(sock)

        wait_for(lambda: post().startswith(b"HTTP/1.1 503"), "the 6 MiB body to be held")
        refused = post()
        assert refused.startswith(b"HTTP/1.1 503"), refused[:200]
        assert b"past its budget of 8388608 bytes (--request-body-budget-bytes)" in refused
        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        grpc_tensor = grpcclient.InferInput("INPUT0", [1, 1 << 20], "FP32")
        grpc_tensor.set_data_from_numpy(np.ones((1, 1 << 20), np.float32))
        with pytest.raises(InferenceServerException) as error:
            grpc_client.infer("identity_fp32", [grpc_tensor])
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        assert "past its budget of 8388608 bytes" in error.value.message()
        # A ModelStreamInfer message counts too: refused alone, the stream goes on.
        replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
        grpc_client.start_stream(callback=lambda result, error: replies.put((result, error)))
        grpc_client.async_stream_infer("identity_fp32", [grpc_tensor])
        small = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        small.set_data_from_numpy(np.ones((1, 4), np.float32))
        grpc_client.async_stream_infer("identity_fp32", [small])
        result, stream_error = replies.get(timeout=30)
        assert result is None and "past its budget of 8388608 bytes" in str(stream_error)
        result, stream_error = replies.get(timeout=30)
        assert stream_error is None and result.as_numpy("OUTPUT0").shape == (1, 4)
        grpc_client.stop_stream()
        holder.close()
        wait_for(lambda: post().startswith(b"HTTP/1.1 200"), "the budget to come back")
        result = grpc_client.infer("identity_fp32", [grpc_tensor]).as_numpy("OUTPUT0")
        assert result.shape == (1, 1 << 20)
        grpc_client.close()
        # A compressed body counts as what it inflates to: 16 MiB of blanks is past the budget.
        answer = _post_identity(server, gzip.compress(b" " * (16 << 20)), b"Content-Encoding: gzip")
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"past its budget of 8388608 bytes" in answer
        wait_for(lambda: post().startswith(b"HTTP/1.1 200"), "the budget to come back again")
        # Connections that declared large bodies hold budget for what they sent (2 MiB each at
        # first), and give it back as soon as they close, not when the collector gets to them.
        liars = []
        for _ in range(3):
            liar = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
            liar.sendall(
                b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n{" % (32 << 20)
            )
            liars.append(liar)
        wait_for(lambda: post().startswith(b"HTTP/1.1 503"), "the liars to hold 6 MiB")
        for liar in liars:
            liar.close()
        wait_for(lambda: post().startswith(b"HTTP/1.1 200"), "their budget back", timeout=5)
        # A body answered with an error gives its budget back at once too: 6 MiB of broken
        # JSON, four times over, is refused for what it is each time.
        broken = b'{"inputs":[' + b"1," * (3 << 20) + b"]}"
        for _ in range(4):
            answer = _post_identity(server, broken)
            assert answer.startswith(b"HTTP/1.1 500"), answer[:200]
            assert b"failed to parse the request JSON buffer: Invalid value." in answer
        # Chunked bodies (no Content-Length) count as they grow: a 16 MiB one is past the
        # budget. Its bytes are read and dropped, it gets 503, its connection goes on serving,
        # and what it counted comes back.
        chunked_head = (
            b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
            sock.sendall(chunked_head + _chunks(b" " * (16 << 20)) + b"0\r\n\r\n")
            answer = _status_and_body(sock)
            assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
            assert b"past its budget of 8388608 bytes" in answer
            sock.sendall(head + body)
            assert _status_and_body(sock).startswith(b"HTTP/1.1 200")
        wait_for(lambda: post().startswith(b"HTTP/1.1 200"), "the chunked body's budget back")
    finally:
        for sock in opened:
            sock.close()
        server.stop()


def _chunks(data: bytes, size: int = 1 << 20) -> bytes:
    """``data`` in HTTP/1.1 chunks of ``size`` bytes (without the last, empty chunk)."""
    return b"".join(
        b"%x\r\n%s\r\n" % (len(piece), piece)
        for piece in (data[at : at + size] for at in range(0, len(data), size))
    )


def test_a_half_close_answers_whole_requests_and_drops_one_cut_short(server) -> None:
    """A client that shuts down its sending side after its requests gets every answer and
    then the close; one whose body stops short of its length, or whose chunks never end, gets
    the close (nothing can answer it), never a connection left hanging."""
    good = (
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    short = (
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    )
    unended = (
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"
    )
    for sent, answers in ((good, 2), (short, 0), (unended, 0), (good + short, 2)):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
            sock.sendall(sent)
            sock.shutdown(socket.SHUT_WR)
            received = b""
            while chunk := sock.recv(65536):  # a connection left hanging fails here (timeout)
                received += chunk
        assert received.count(b"HTTP/1.1 200 OK") == answers, received[:300]
