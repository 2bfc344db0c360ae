"""A small, complete HTTP answer written to the connection in one call.

aiohttp's ``web.Response`` keeps its headers in a case-insensitive multidict, adds ``Date`` and
``Server``, decides about compression and chunking, and writes the status line, the headers and
the body through its payload writer in several steps. For the many small answers of an
inference server that costs more than everything else the frontend does for a request (a
third of the event loop's time under load, measured with py-spy). An :class:`Answer` formats
its status line and headers itself and hands them to the transport with the body in one
``write``. Used for inference answers that are not streamed or compressed; keep-alive follows
the request, as aiohttp decides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter


class Answer(web.StreamResponse):
    """200 OK with ``Content-Type``, ``Content-Length``, optional ``extra`` header lines (each
    ending in CRLF) and a body of ``parts`` (bytes-like objects, ``length`` bytes in all)."""

    def __init__(
        self, parts: Sequence[Any], length: int, content_type: str, extra: str = ""
    ) -> None:
        super().__init__()
        self._answer = (parts, length, content_type, extra)
        self._keep_connection = False

    @property
    def keep_alive(self) -> bool:
        """Whether aiohttp keeps the connection open after this answer (it asks after
        ``write_eof``)."""
        return self._keep_connection

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        parts, length, content_type, extra = self._answer
        version = request.version
        self._keep_connection = request.keep_alive
        if self._keep_connection:
            connection = "Connection: keep-alive\r\n" if version == (1, 0) else ""
        else:
            connection = "Connection: close\r\n" if version == (1, 1) else ""
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        head = (
            f"HTTP/{version[0]}.{version[1]} 200 OK\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\n{extra}{connection}\r\n"
        )
        transport.write(b"".join([head.encode("latin-1"), *parts]))
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        """Everything went out in :meth:`prepare`."""
