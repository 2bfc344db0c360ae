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
# A direct body's first buffer (at most): it doubles as the body arrives.
FIRST_DIRECT_BYTES = 1 << 21


class DirectBody:
    """A request body received straight into one pool buffer: ``done`` resolves once all of
    its ``length`` bytes are in ``buffer``.

    The buffer grows as bytes arrive (doubling, from :data:`FIRST_DIRECT_BYTES`), never to the
    declared length up front: a client that declares a huge body and sends little holds little
    memory."""

    __slots__ = ("buffer", "done", "filled", "length")

    def __init__(self, length: int, start: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.length = length
        self.buffer = pooled_memory(min(length, max(FIRST_DIRECT_BYTES, 2 * len(start))))
        self.buffer[: len(start)] = start  # what came with the head, already parsed out
        self.filled = len(start)
        self.done: asyncio.Future[None] = loop.create_future()
        self.received(0)

    def complete(self) -> bool:
        return self.filled >= self.length

    def room(self) -> memoryview:
        """Where the next bytes go (the buffer grows first when it is full)."""
        if self.filled >= len(self.buffer) and self.filled < self.length:
            grown = pooled_memory(min(self.length, 2 * len(self.buffer)))
            grown[: self.filled] = self.buffer[: self.filled]
            self.buffer = grown  # the old buffer goes back to the pool with its last view
        return self.buffer[self.filled : self.length]

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
