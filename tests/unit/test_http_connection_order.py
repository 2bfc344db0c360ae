"""Answers on one connection reach the client whole and in order although they leave by two
ways: small ones from the core's writer thread, large ones through the event loop's
transport. Runs :class:`HttpServer` in this process on a real socket whose buffers are made
tiny, with a client that does not read at first, so that each way still holds bytes when the
next answer must take the other one. Both event loops the server may run on are tried."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
import uvloop
from tritonfast.frontends.http.answer import Answer
from tritonfast.frontends.http.connection import JOIN_BYTES, MAX_UNSENT, HttpServer
from tritonfast.frontends.http.request import Request
from tritonfast.memory.bodybudget import BodyBudget

from tests.waiting import wait_for_async

# "large" stays under the transport's high-water mark, so its writer does not wait for the
# transport to drain and the next answer comes while bytes are left there; "huge" waits.
SIZES = {"small": 1000, "large": JOIN_BYTES + 1000, "huge": 4 * JOIN_BYTES}
# Runs of each kind, so that switches of way happen with bytes left in the other: the first
# "large" goes out through the transport (the writer holds nothing yet) and is not all sent
# when the small answers after it come; those pile up unsent in turn before the next large.
PLAN = ["large"] + ["small"] * 20 + ["large", "small", "huge", "small"] * 3 + ["small"] * 20


def body(kind: str, index: int) -> bytes:
    size = SIZES[kind]
    stamp = f"{kind}-{index};".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


async def _answer(request: Request) -> Answer:
    _, kind, index = request.path.split("/")
    return Answer(200, (body(kind, int(index)),), "application/octet-stream")


def _read_answers(sock: socket.socket, count: int) -> list[bytes]:
    reader = sock.makefile("rb")
    bodies = []
    for _ in range(count):
        status = reader.readline()
        assert status == b"HTTP/1.1 200 OK\r\n", status
        length = 0
        while (line := reader.readline()) != b"\r\n":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        bodies.append(reader.read(length))
        # A slow reader is the case under test: pausing after each answer keeps the server's
        # buffers full while it sends the rest. Nothing is waited for here.
        time.sleep(0.0005)
    return bodies


async def _scenario() -> list[bytes]:
    server = HttpServer(_answer, BodyBudget())
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    client = socket.socket()
    client.settimeout(10)  # a misordered stream leaves the reader waiting for bytes
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    try:
        await asyncio.to_thread(client.connect, ("127.0.0.1", port))
        await wait_for_async(lambda: server.connections, "the server to accept the connection")
        (connection,) = server.connections
        transport = connection.transport
        assert connection._out is not None, "the connection has no writer-thread stream"
        assert transport is not None
        server_sock = transport.get_extra_info("socket")
        server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        requests = b"".join(
            f"GET /{kind}/{index} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            for index, kind in enumerate(PLAN)
        )
        await asyncio.to_thread(client.sendall, requests)
        # Answers pile up unread until the transport holds more than its high-water mark:
        # the server then waits for the client to read.
        high = transport.get_write_buffer_limits()[1]
        await wait_for_async(
            lambda: transport.get_write_buffer_size() > high, "answers to pile up unread"
        )
        return await asyncio.to_thread(_read_answers, client, len(PLAN))
    finally:
        client.close()
        # A broken stream may leave an answer waiting on a full socket: the shutdown timeout
        # path (abort what is left) ends it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.close(), 5)


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_answers_by_both_ways_arrive_whole_and_in_order(run: Callable[[Any], Any]) -> None:
    bodies = run(_scenario())
    expected = [body(kind, index) for index, kind in enumerate(PLAN)]
    for index, (got, want) in enumerate(zip(bodies, expected, strict=True)):
        assert got == want, f"answer {index} ({PLAN[index]}) is wrong: starts {got[:20]!r}"


async def _slow_reader_holdings() -> tuple[int, int]:
    """Most bytes the server held (in the writer thread and the transport) for a client
    that never reads, and the bytes of answers it asked for."""
    server = HttpServer(_answer, BodyBudget())
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    plan = ["small"] * 40 + ["large"] * 100
    try:
        await asyncio.to_thread(client.connect, ("127.0.0.1", port))
        requests = b"".join(
            f"GET /{kind}/{index} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            for index, kind in enumerate(plan)
        )
        await wait_for_async(lambda: server.connections, "the server to accept the connection")
        (connection,) = server.connections
        out, transport = connection._out, connection.transport
        assert out is not None and transport is not None
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        await asyncio.to_thread(client.sendall, requests)
        most = 0
        # A client that does not read for a second is the case under test: what the server
        # holds is sampled all along, and no event marks the end of that second.
        for _ in range(100):
            most = max(most, out.unsent + transport.get_write_buffer_size())
            await asyncio.sleep(0.01)
        return most, sum(SIZES[kind] for kind in plan)
    finally:
        client.close()
        await asyncio.wait_for(server.close(), 10)


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_what_is_kept_for_a_client_that_does_not_read_is_bounded(
    run: Callable[[Any], Any],
) -> None:
    most, asked = run(_slow_reader_holdings())
    assert asked > 4 * MAX_UNSENT  # the client asked for far more than the bound
    # The writer's bound, plus the answer that crossed it and the transport's high-water mark.
    assert 0 < most <= MAX_UNSENT + SIZES["large"] + (64 << 10), (most, MAX_UNSENT)
