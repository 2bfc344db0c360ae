"""What an HTTP handler sees of one request, and a large body received straight into one
pooled buffer (see :mod:`tritonfast.frontends.http.connection` for how it is filled)."""

from __future__ import annotations

import asyncio
from typing import Any

from tritonfast.runtime.bufferpool import pooled_memory

# Triton reads content lengths as int32; bodies up to that size are accepted.
MAX_BODY_BYTES = (1 << 31) - 1
# Bodies from this size on (with a Content-Length) are received straight into a pool buffer.
# Below it, the parser's own chunks cost less than setting one up.
DIRECT_BODY_BYTES = 1 << 18


class DirectBody:
    """A request body received straight into one pool buffer: ``done`` resolves once all of
    its ``length`` bytes are in ``buffer``."""

    __slots__ = ("buffer", "done", "filled", "length")

    def __init__(self, length: int, start: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.buffer = pooled_memory(length)
        self.buffer[: len(start)] = start  # what came with the head, already parsed out
        self.filled = len(start)
        self.length = length
        self.done: asyncio.Future[None] = loop.create_future()
        self.received(0)

    def complete(self) -> bool:
        return self.filled >= self.length

    def room(self) -> memoryview:
        return self.buffer[self.filled :]

    def received(self, nbytes: int) -> bool:
        """Counts ``nbytes`` more received; whether the body is now complete."""
        self.filled += nbytes
        if not self.complete():
            return False
        if not self.done.done():
            self.done.set_result(None)
        return True


class Request:
    """What a handler sees of one request. ``content`` is aiohttp's ``StreamReader`` of the
    body, filled as it arrives, unless ``body`` (a :class:`DirectBody`) receives it."""

    __slots__ = ("body", "content", "headers", "keep_alive", "method", "path", "version")

    def __init__(self, message: Any, content: Any) -> None:
        self.method: str = message.method
        path: str = message.path  # the target as sent
        if "%" in path or "?" in path:  # rare: decode escapes, drop the query
            path = message.url.path
        self.path = path
        self.headers: Any = message.headers  # case-insensitive
        self.content: Any = content
        self.version: tuple[int, int] = message.version
        self.keep_alive: bool = not message.should_close
        self.body: DirectBody | None = None

    def body_received(self) -> bool:
        """Whether the whole body has come in (a connection is reused only then)."""
        body = self.body
        return bool(self.content.is_eof()) if body is None else body.complete()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return None if value is None else int(value)
