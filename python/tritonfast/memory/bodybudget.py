"""A server's budget of request-body bytes held in memory (``--request-body-budget-bytes``).

Both frontends count what large request bodies hold: HTTP the bytes received so far of bodies
received straight into pool memory (256 KiB and up) or read from aiohttp's stream (chunked
ones), and what compressed bodies inflated to; gRPC the messages of that size (of unary calls
and of ``ModelStreamInfer`` streams), from their arrival until their request is over. A
body that would take the total past the budget is refused (HTTP 503, gRPC UNAVAILABLE) with
:func:`refusal`'s words, and nothing of it is kept. Letting go of a large body trims the heap
(:mod:`tritonfast.memory.memtrim`). Each server has its own (``DataPlane.body_budget``).
"""

from __future__ import annotations

import threading

from tritonfast.errors import UnavailableError
from tritonfast.memory import memtrim

DEFAULT_BYTES = 1 << 32
# Bodies from this size on are counted (smaller ones are bounded by the connection's buffers).
COUNTED_BYTES = 1 << 18
FLAG = "--request-body-budget-bytes"
# A body this large, once let go, has the freed memory given back to the kernel (memtrim).
TRIM_AFTER_BYTES = 1 << 23


class BodyBudget:
    """Bytes held by counted bodies, against a limit; safe from any thread."""

    def __init__(self, limit: int = DEFAULT_BYTES) -> None:
        self.limit = limit
        self.held = 0
        # Reentrant: a body's finalizer gives its bytes back, and the collector may run it on a
        # thread that is inside take or give already.
        self._lock = threading.RLock()

    def take(self, nbytes: int) -> bool:
        """Count ``nbytes`` more, unless that passes the limit (then False, nothing counted)."""
        with self._lock:
            if self.held + nbytes > self.limit:
                return False
            self.held += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes
        if nbytes >= TRIM_AFTER_BYTES:
            memtrim.soon()

    def refusal(self, size: int) -> UnavailableError:
        return UnavailableError(
            f"the server holds {self.held} bytes of request bodies, and this one of {size}"
            f" bytes would take it past its budget of {self.limit} bytes ({FLAG}); try again"
            " later"
        )


class BodyCount:
    """What one body counts against ``budget``: grown as the body does, in doubling steps
    (few calls to the budget per body) never past its ``length`` when known; given back once
    the request is over."""

    __slots__ = ("budget", "bytes", "length")

    def __init__(self, budget: BodyBudget, length: int | None = None) -> None:
        self.budget = budget
        self.bytes = 0
        self.length = length

    def cover(self, held: int) -> bool:
        """Count at least ``held`` bytes; False, with nothing more counted, past the budget."""
        if held <= self.bytes:
            return True
        wanted = max(held, 2 * self.bytes)
        if self.length is not None:
            wanted = max(held, min(wanted, self.length))
        if not self.budget.take(wanted - self.bytes):
            return False
        self.bytes = wanted
        return True

    def give_back(self) -> None:
        if self.bytes:
            self.budget.give(self.bytes)
            self.bytes = 0
