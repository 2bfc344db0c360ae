"""Large request bodies with a Content-Length are received straight into one pool buffer
(``DirectBody``), and the connection then goes on parsing what follows them. Runs
:class:`HttpServer` in this process on a real socket, on both event loops the server may use;
the handler answers with what it received and how."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import itertools
import socket
import struct
import termios
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import uvloop
from tritonfast.frontends.http import connection as connection_module
from tritonfast.frontends.http import request as request_module
from tritonfast.frontends.http.answer import Answer
from tritonfast.frontends.http.app import _read_body
from tritonfast.frontends.http.connection import HttpConnection, HttpServer
from tritonfast.frontends.http.request import DIRECT_BODY_BYTES, Request
from tritonfast.memory.bodybudget import BodyBudget

from tests.waiting import wait_for_async

LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


async def _describe(request: Request) -> Answer:
    """``direct|streamed <length> <sha256>`` of the body."""
    how = "streamed" if request.body is None else "direct"
    body = await _read_body(request)
    digest = hashlib.sha256(body).hexdigest()
    return Answer(200, (f"{how} {len(body)} {digest}".encode(),), "text/plain")


def _post(body: bytes, headers: str = "") -> bytes:
    return (
        f"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode()
        + body
    )


def _expected(how: str, body: bytes) -> str:
    return f"{how} {len(body)} {hashlib.sha256(body).hexdigest()}"


async def _answer(reader: asyncio.StreamReader) -> str:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.startswith(b"Content-Length")
    )
    return (await reader.readexactly(length)).decode()


@contextlib.asynccontextmanager
async def _serving(handler: Any = _describe) -> AsyncIterator[tuple[HttpServer, int]]:
    """A server on a free port: ``(server, port)``."""
    server = HttpServer(handler, BodyBudget())
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    try:
        yield server, server._server.sockets[0].getsockname()[1]
    finally:
        await asyncio.wait_for(server.close(), 10)


async def _with_server(scenario: Callable[[int], Any], handler: Any = _describe) -> Any:
    async with _serving(handler) as (_, port):
        return await scenario(port)


def _queued(sock: Any, request: int) -> int:
    """``FIONREAD`` (bytes received, not read yet) or ``TIOCOUTQ`` (bytes sent, not yet
    acknowledged by the peer) of a socket."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0" * 4))[0])


async def _delivered(server: HttpServer, writer: asyncio.StreamWriter) -> None:
    """Waits until the server has read every byte ``writer`` has written."""
    await writer.drain()
    client = writer.get_extra_info("socket")
    address = writer.get_extra_info("sockname")

    def read_by_the_server() -> bool:
        if writer.transport.get_write_buffer_size() or _queued(client, termios.TIOCOUTQ):
            return False  # still on the client's side
        for connection in server.connections:
            transport = connection.transport
            if transport is not None and transport.get_extra_info("peername") == address:
                return _queued(transport.get_extra_info("socket"), termios.FIONREAD) == 0
        return False  # not accepted yet

    await wait_for_async(read_by_the_server, "the server to read what was sent")


def _bodies() -> list[bytes]:
    large = bytes(range(256)) * (DIRECT_BODY_BYTES // 256 * 3 + 1)  # ~768 KiB, not aligned
    return [large, b"small body", large[:DIRECT_BODY_BYTES], b"x" * (DIRECT_BODY_BYTES - 1)]


@LOOPS
def test_large_bodies_are_received_directly_and_pipelined_requests_after_them_parsed(
    run: Callable[[Any], Any],
) -> None:
    bodies = _bodies()

    async def scenario(port: int) -> list[str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # All in one go: a direct body ends inside a read that also holds the next head.
        writer.write(b"".join(_post(body) for body in bodies))
        answers = [await _answer(reader) for _ in bodies]
        writer.close()
        return answers

    answers = run(_with_server(scenario))
    hows = ["direct", "streamed", "direct", "streamed"]
    assert answers == [_expected(how, body) for how, body in zip(hows, bodies, strict=True)]


@LOOPS
def test_a_large_body_sent_slowly_after_100_continue(run: Callable[[Any], Any]) -> None:
    body = bytes(reversed(range(256))) * (DIRECT_BODY_BYTES // 128)

    async def scenario() -> str:
        async with _serving() as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head, _, _ = _post(body, "Expect: 100-continue\r\n").partition(b"\r\n\r\n")
            writer.write(head + b"\r\n\r\n")
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == (
                b"HTTP/1.1 100 Continue\r\n\r\n"
            )
            for start in range(0, len(body), 50_000):  # many small reads into the one buffer
                writer.write(body[start : start + 50_000])
                await _delivered(server, writer)  # read before the next part is sent
            answer = await _answer(reader)
            writer.close()
            return answer

    assert run(scenario()) == _expected("direct", body)


@LOOPS
def test_a_client_leaving_in_the_middle_of_a_large_body_costs_nothing_else(
    run: Callable[[Any], Any],
) -> None:
    body = b"y" * (2 * DIRECT_BODY_BYTES)

    async def scenario() -> str:
        async with _serving() as (server, port):
            _, quitter = await asyncio.open_connection("127.0.0.1", port)
            quitter.write(_post(body)[:DIRECT_BODY_BYTES])  # the head and part of the body
            await _delivered(server, quitter)  # the server is receiving the body directly
            quitter.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(body))
            answer = await _answer(reader)
            writer.close()
            return answer

    assert run(scenario()) == _expected("direct", body)


@LOOPS
def test_a_large_chunked_body_is_streamed(run: Callable[[Any], Any]) -> None:
    body = b"z" * (2 * DIRECT_BODY_BYTES)

    async def scenario(port: int) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        chunks = b"".join(
            f"{len(part):x}\r\n".encode() + part + b"\r\n"
            for part in (body[i : i + 100_000] for i in range(0, len(body), 100_000))
        )
        writer.write(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks
            + b"0\r\n\r\n"
        )
        answer = await _answer(reader)
        writer.close()
        return answer

    assert run(_with_server(scenario)) == _expected("streamed", body)


@LOOPS
def test_an_answer_before_its_direct_body_is_in_closes_the_connection(
    run: Callable[[Any], Any],
) -> None:
    # The rest of the body must not be read as requests: the connection ends after the answer.
    body = b"GET /v2 HTTP/1.1\r\n\r\n" * (2 * DIRECT_BODY_BYTES // 20)

    async def scenario() -> tuple[bytes, bytes]:
        sent = asyncio.Event()

        async def answer_without_reading(request: Request) -> Answer:
            # Once what the client sent has come in (so that closing sends a FIN, not a reset).
            await sent.wait()
            return Answer(200, (b"not read",), "text/plain")

        async with _serving(answer_without_reading) as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(body)[:DIRECT_BODY_BYTES])  # head and part of the body
            await _delivered(server, writer)
            sent.set()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            await asyncio.wait_for(reader.readexactly(len(b"not read")), 10)
            rest = await asyncio.wait_for(reader.read(), 10)  # b"" once the server closes
            writer.close()
            return head, rest

    head, rest = run(scenario())
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in head, head
    assert rest == b""


@LOOPS
def test_a_direct_body_right_after_a_streamed_one_that_pauses_the_parser(
    run: Callable[[Any], Any],
) -> None:
    # The streamed body (over the body stream's 128 KiB high-water mark) pauses the parser
    # with the next request's head still unparsed in the same read; that head is parsed only
    # when the first handler reads its body, and its body must then be received directly.
    first = bytes(range(256)) * (200 * 1024 // 256)
    second = bytes(reversed(range(256))) * (2 * DIRECT_BODY_BYTES // 256)

    async def scenario() -> list[str]:
        handled = 0

        async def describe_later(request: Request) -> Answer:
            nonlocal handled
            handled += 1
            if handled == 1:  # its streamed body piles up past the high-water mark
                await wait_for_async(
                    lambda: all(
                        c.transport is not None and not c.transport.is_reading()
                        for c in server.connections
                    ),
                    "the body stream to pause reading",
                )
            return await _describe(request)

        async with _serving(describe_later) as (server, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(first) + _post(second) + _post(b"tail"))
            answers = [await _answer(reader) for _ in range(3)]
            writer.close()
            return answers

    assert run(scenario()) == [
        _expected("streamed", first),
        _expected("direct", second),
        _expected("streamed", b"tail"),
    ]


@LOOPS
def test_a_large_body_arriving_fast_is_read_a_bounded_piece_per_turn_of_the_loop(
    run: Callable[[Any], Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A client on another thread keeps the socket full. uvloop's transport would read it again
    # and again within one event (up to 32 reads, each as large as the buffer offered), holding
    # every other client up; each read of a direct body is bounded, and the loop takes a turn
    # between two of them. (The bound is made small here, so that the socket's first receive
    # buffer, before the kernel grows it, holds several reads' worth.)
    bound = 16 * 1024
    monkeypatch.setattr(request_module, "DIRECT_READ_BYTES", bound)
    monkeypatch.setattr(connection_module, "DIRECT_READ_BYTES", bound)
    body = bytes(range(256)) * (4 * DIRECT_BODY_BYTES // 256)
    reads: list[tuple[int, int]] = []  # (bytes, the loop's turns so far) per direct read
    turns = 0
    original = HttpConnection.buffer_updated

    def recorded(self: HttpConnection, nbytes: int) -> None:
        if self._direct is not None:
            reads.append((nbytes, turns))
        original(self, nbytes)

    monkeypatch.setattr(HttpConnection, "buffer_updated", recorded)

    async def scenario() -> str:
        loop = asyncio.get_running_loop()
        counting = True

        def turn() -> None:
            nonlocal turns
            turns += 1
            if counting:
                loop.call_soon(turn)

        turn()
        try:
            async with _serving() as (_, port):
                with socket.create_connection(("127.0.0.1", port)) as sock:
                    sending = loop.run_in_executor(None, sock.sendall, _post(body))
                    answer = await loop.run_in_executor(None, _blocking_answer, sock)
                    await sending
                return answer
        finally:
            counting = False

    assert run(scenario()) == _expected("direct", body)
    assert reads and max(nbytes for nbytes, _ in reads) <= bound
    full = [at for nbytes, at in reads if nbytes == bound]
    assert len(full) > 1, "the socket never held a whole read's worth"
    assert all(later > earlier for earlier, later in itertools.pairwise(full))


def _blocking_answer(sock: socket.socket) -> str:
    """The body of one answer read from a blocking socket."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), head
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return rest[:length].decode()
