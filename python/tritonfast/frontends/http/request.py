"""What an HTTP handler sees of one request, and a large body received straight into one
pooled buffer (see :mod:`tritonfast.frontends.http.connection` for how it is filled)."""

from __future__ import annotations

import asyncio
from typing import Any

from tritonfast.errors import UnavailableError
from tritonfast.frontends.bodybudget import BUDGET, COUNTED_BYTES
from tritonfast.runtime.bufferpool import pooled_memory

# Triton reads content lengths as int32; bodies up to that size are accepted.
MAX_BODY_BYTES = (1 << 31) - 1
# Bodies from this size on (with a Content-Length) are received straight into a pool buffer
# (and counted against the server's body budget, frontends.bodybudget). Below it, the parser's
# own chunks cost less than setting one up.
DIRECT_BODY_BYTES = COUNTED_BYTES
# Bodies up to this size get their whole buffer at once, while the eager buffers of bodies
# still arriving stay within the budget; any other starts at FIRST_DIRECT_BYTES (at most) and
# doubles as it arrives.
EAGER_BODY_BYTES = 1 << 25
EAGER_BUDGET_BYTES = 1 << 27
FIRST_DIRECT_BYTES = 1 << 21


class DirectBody:
    """A request body received straight into one pool buffer: ``done`` resolves once all of
    its ``length`` bytes are in ``buffer``.

    A body of up to :data:`EAGER_BODY_BYTES` gets its whole buffer at once while the bodies
    still arriving hold less than :data:`EAGER_BUDGET_BYTES` between them (the fast path: no
    copies). Any other grows as its bytes arrive, doubling from :data:`FIRST_DIRECT_BYTES`:
    a declared length alone never takes memory, so clients that declare huge bodies and send
    little hold little."""

    __slots__ = ("allocated", "buffer", "done", "failure", "filled", "length", "reserved")
    eager_reserved = 0  # bytes of eager buffers whose bodies are still arriving

    def __init__(self, length: int, start: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.length = length
        self.reserved = 0
        self.allocated = 0
        self.failure: UnavailableError | None = None
        self.done: asyncio.Future[None] = loop.create_future()
        self.done.add_done_callback(_retrieved)
        eager = length <= EAGER_BODY_BYTES
        if eager and DirectBody.eager_reserved + length <= EAGER_BUDGET_BYTES:
            size = length
        else:
            eager = False
            size = min(length, max(FIRST_DIRECT_BYTES, 2 * len(start)))
        if not self._hold(size):  # its bytes are read and dropped (see room)
            self.buffer = memoryview(b"")
            self.filled = len(start)
            self.received(0)
            return
        self.buffer = pooled_memory(size)
        if eager:
            self.reserved = length
            DirectBody.eager_reserved += length
        self.buffer[: len(start)] = start  # what came with the head, already parsed out
        self.filled = len(start)
        self.received(0)

    def _hold(self, size: int) -> bool:
        """Count a buffer of ``size`` bytes (in place of the one held) against the budget;
        past it the body fails with 503, and False."""
        if not BUDGET.take(size - self.allocated):
            self.failure = BUDGET.refusal(self.length)
            return False
        self.allocated = size
        return True

    def complete(self) -> bool:
        return self.filled >= self.length

    def room(self) -> memoryview | None:
        """Where the next bytes go (a growing buffer grows first when it is full); None when
        the body failed (see :attr:`failure`): its bytes are then read and dropped, so that
        the client, still sending, gets its answer instead of a reset connection."""
        if self.failure is not None:
            return None
        if self.filled >= len(self.buffer) and self.filled < self.length:
            size = min(self.length, 2 * len(self.buffer))
            if not self._hold(size):
                return None
            grown = pooled_memory(size)
            grown[: self.filled] = self.buffer[: self.filled]
            self.buffer = grown  # the old buffer goes back to the pool with its last view
        return self.buffer[self.filled : self.length]

    def received(self, nbytes: int) -> bool:
        """Counts ``nbytes`` more received; whether the body is now complete."""
        self.filled += nbytes
        if not self.complete():
            return False
        self._release()
        if not self.done.done():
            # A failed body answers once all of it came (and was dropped): a client still
            # sending would otherwise see its connection reset instead of the answer.
            if self.failure is not None:
                self.done.set_exception(self.failure)
            else:
                self.done.set_result(None)
        return True

    def _release(self) -> None:
        DirectBody.eager_reserved -= self.reserved
        self.reserved = 0

    def __del__(self) -> None:  # the request is done with it, or abandoned with its connection
        self._release()
        BUDGET.give(self.allocated)
        self.allocated = 0


def _retrieved(done: asyncio.Future[None]) -> None:
    """A failed body's error is answered by its handler, if one reads it; never logged as
    an exception nobody retrieved."""
    if not done.cancelled():
        done.exception()


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
