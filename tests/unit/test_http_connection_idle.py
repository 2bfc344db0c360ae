"""Keep-alive connections that stay quiet are closed by the HTTP server; busy ones are not.
Runs :class:`HttpServer` in this process on a real socket with a short idle timeout."""

from __future__ import annotations

import asyncio
import time

from tritonfast.frontends.http.answer import Answer
from tritonfast.frontends.http.connection import HttpServer
from tritonfast.frontends.http.request import Request
from tritonfast.memory.bodybudget import BodyBudget

REQUEST = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


async def _pong(request: Request) -> Answer:
    return Answer(200, (b"pong",), "text/plain")


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head
    return await reader.readexactly(4)


async def _scenario(idle_timeout_s: float) -> tuple[float, bool]:
    server = HttpServer(_pong, BodyBudget(), idle_timeout_s=idle_timeout_s)
    await server.start("127.0.0.1", 0)
    assert server._server is not None
    port = server._server.sockets[0].getsockname()[1]
    try:
        quiet_reader, quiet_writer = await asyncio.open_connection("127.0.0.1", port)
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _ask(quiet_reader, quiet_writer) == b"pong"
        started = time.monotonic()
        # The busy client asks every tenth of the timeout until the quiet one is closed.
        closed = asyncio.ensure_future(quiet_reader.read(1))
        while not closed.done():
            assert time.monotonic() - started < idle_timeout_s * 10, "never closed"
            assert await _ask(busy_reader, busy_writer) == b"pong"
            await asyncio.wait([closed], timeout=idle_timeout_s / 10)
        assert closed.result() == b""
        quiet_for = time.monotonic() - started
        busy_still_served = await _ask(busy_reader, busy_writer) == b"pong"
        quiet_writer.close()
        busy_writer.close()
        return quiet_for, busy_still_served
    finally:
        await server.close()


def test_quiet_keep_alive_connection_is_closed_and_busy_one_kept() -> None:
    quiet_for, busy_still_served = asyncio.run(_scenario(idle_timeout_s=0.4))
    # The server counts idleness from its last read of the quiet connection, a little before
    # the client starts its own clock (after reading the answer): allow for that gap.
    assert 0.35 <= quiet_for < 2.0
    assert busy_still_served
