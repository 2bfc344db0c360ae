"""What an HTTP handler sees of one request, and a large body received straight into one
pooled buffer (see :mod:`tritonfast.frontends.http.connection` for how it is filled): a
shared-memory object, where a worker can read the body's large inputs."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tritonfast.errors import TritonError, UnavailableError
from tritonfast.memory.bodybudget import COUNTED_BYTES, BodyBudget, BodyCount
from tritonfast.memory.bufferpool import pooled_memory, shared_body

if TYPE_CHECKING:
    from tritonfast._core import OutStream, PooledBuffer

# Triton reads content lengths as int32; bodies up to that size are accepted.
MAX_BODY_BYTES = (1 << 31) - 1
# Bodies from this size on (with a Content-Length) are received straight into a pool buffer
# (and counted against the server's body budget, memory.bodybudget). Below it, the parser's
# own chunks cost less than setting one up.
DIRECT_BODY_BYTES = COUNTED_BYTES
# The body budget is taken as bytes arrive: at first this much (at most the body), then twice
# what has arrived each time the bytes reach what was taken.
FIRST_COUNTED_BYTES = 1 << 21
# Bytes of a direct body asked of the socket in one read. A client sending a large body over
# a fast link keeps the socket full, and one read takes all it holds (megabytes): every other
# client of the event loop waits for that copy. With a bounded read the connection yields
# after each one (see HttpConnection.buffer_updated), so a read costs the others at most the
# copy of this many bytes.
DIRECT_READ_BYTES = 1 << 18


class DirectBody:
    """A request body received straight into one pool buffer: ``done`` resolves once all of
    its ``length`` bytes are in ``buffer``.

    The buffer has the whole declared length from the start, so nothing is ever copied as the
    body arrives; its memory is taken from the kernel page by page only as bytes are written
    (large pool buffers are fresh mappings, or reused ones within the pool's small idle
    bound). What counts against the server's body budget follows the bytes that arrived:
    :data:`FIRST_COUNTED_BYTES` at first, doubling as they come. So a declared length alone
    holds neither memory nor budget, and clients that declare huge bodies and send little
    hold little.

    The buffer is a shared-memory object when there is room (:attr:`object` names it, for the
    core to let the model's worker read the body's large inputs there). Its memory is taken
    (``PooledBuffer.reserve``) ahead of the bytes as they come, at most twice what arrived,
    because writing a page the shared-memory file system cannot back would kill the server:
    when it has no room left, the body moves to the heap (what arrived copied there once)."""

    __slots__ = (
        "_reserved",
        "_shared",
        "buffer",
        "counted",
        "done",
        "failure",
        "filled",
        "length",
        "object",
        "released",
    )

    def __init__(
        self, length: int, start: bytes, loop: asyncio.AbstractEventLoop, budget: BodyBudget
    ) -> None:
        self.length = length
        self.counted = BodyCount(budget, length)
        self.released = False
        self.failure: UnavailableError | None = None
        self.done: asyncio.Future[None] = loop.create_future()
        self.done.add_done_callback(_retrieved)
        self.filled = len(start)
        self._shared: PooledBuffer | None = None
        self._reserved = len(start)
        # The shared-memory object (path, device, inode) the buffer is, from its start.
        self.object: tuple[str, int, int] | None = None
        if not self._count(max(FIRST_COUNTED_BYTES, 2 * len(start))):
            self.buffer = memoryview(b"")  # its bytes are read and dropped (see room)
        else:
            self.buffer, self._shared = shared_body(length, len(start))
            if self._shared is not None:
                self.object = self._shared.object
            self.buffer[: len(start)] = start  # what came with the head, already parsed out
        self.received(0)

    def _count(self, nbytes: int) -> bool:
        """Count ``nbytes`` of the body (or more, never past its length) against the budget;
        past it the body fails with 503, and False."""
        if not self.counted.cover(min(nbytes, self.length)):
            self.failure = self.counted.budget.refusal(self.length)
            return False
        return True

    def complete(self) -> bool:
        return self.filled >= self.length

    def room(self) -> memoryview | None:
        """Where the next bytes go (up to what the budget counts, which grows first when the
        bytes reached it); None when the body failed (see :attr:`failure`) or was released
        before it all came: its bytes are then read and dropped, so that the client, still
        sending, gets its answer instead of a reset connection."""
        if self.failure is not None or self.released:
            return None
        counted = self.counted
        if self.filled >= counted.bytes and not self._count(self.filled + 1):
            return None
        end = min(counted.bytes, self.filled + DIRECT_READ_BYTES)
        if end > self._reserved and not self._reserve(end):
            return None
        return self.buffer[self.filled : end]

    def _reserve(self, end: int) -> bool:
        """Take the shared memory of the buffer's bytes up to ``end`` at least (twice what
        arrived, in doubling steps); without room, move the body to the heap (False, with the
        body failed with 503, when the heap has no room either)."""
        shared = self._shared
        if shared is None:
            self._reserved = end
            return True
        target = min(self.length, max(end, 2 * self.filled))
        try:
            shared.reserve(target)
        except TritonError:
            return self._to_heap()
        self._reserved = target
        return True

    def _to_heap(self) -> bool:
        """Shared memory has no room for the rest: continue in a heap buffer, what arrived
        copied there (the worker then gets a copy of the body's tensors)."""
        try:
            heap = pooled_memory(self.length)
        except (MemoryError, ValueError, TritonError):
            self.failure = UnavailableError(
                f"the server has no memory left to receive a request body of {self.length} bytes"
            )
            return False
        heap[: self.filled] = self.buffer[: self.filled]
        self.buffer, self._shared, self.object = heap, None, None
        self._reserved = self.length
        return True

    def received(self, nbytes: int) -> bool:
        """Counts ``nbytes`` more received; whether the body is now complete."""
        self.filled += nbytes
        if not self.complete():
            return False
        if not self.done.done():
            # A failed body answers once all of it came (and was dropped): a client still
            # sending would otherwise see its connection reset instead of the answer.
            if self.failure is not None:
                self.done.set_exception(self.failure)
            else:
                self.done.set_result(None)
        return True

    def release(self) -> None:
        """The request was answered: give its bytes back to the budget (once; bytes still
        arriving are dropped). Not left to the collector: an error's traceback can keep a
        body alive until the next cycle collection, and the budget with it."""
        if not self.released:
            self.released = True
            self.counted.give_back()

    def __del__(self) -> None:  # abandoned with its connection before an answer
        self.release()


def _retrieved(done: asyncio.Future[None]) -> None:
    """A failed body's error is answered by its handler, if one reads it; never logged as
    an exception nobody retrieved."""
    if not done.cancelled():
        done.exception()


class Request:
    """What a handler sees of one request. ``content`` is aiohttp's ``StreamReader`` of the
    body, filled as it arrives, unless ``body`` (a :class:`DirectBody`) receives it."""

    __slots__ = (
        "body",
        "budget",
        "content",
        "counted",
        "headers",
        "keep_alive",
        "method",
        "out",
        "path",
        "version",
    )

    def __init__(self, message: Any, content: Any, budget: BodyBudget) -> None:
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
        self.budget = budget  # the server's, that large bodies count against
        # The connection's writer-thread stream, when other threads may write this request's
        # answer on it (set by the connection; see tritonfast._core.EventWriter).
        self.out: OutStream | None = None
        # What a large body read from ``content`` counts against the budget (see count_body).
        self.counted: BodyCount | None = None

    def count_body(self, held: int) -> bool:
        """Count a body read from ``content`` as it grows to ``held`` bytes (from
        :data:`COUNTED_BYTES` on); False, with nothing more counted, past the budget."""
        if held < COUNTED_BYTES:
            return True
        if self.counted is None:
            self.counted = BodyCount(self.budget, self.content_length)
        return self.counted.cover(held)

    def release(self) -> None:
        """The request was answered (or its connection lost): give back what its body counted
        against the budget (once)."""
        if self.body is not None:
            self.body.release()
        if self.counted is not None:
            self.counted.give_back()

    def body_received(self) -> bool:
        """Whether the whole body has come in (a connection is reused only then)."""
        body = self.body
        return bool(self.content.is_eof()) if body is None else body.complete()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return None if value is None else int(value)
