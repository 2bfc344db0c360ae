"""Heavy work on request bodies runs on threads of low scheduling priority.

Inflating a compressed body, checking megabytes of JSON against Triton's grammar and decoding
it let go of the GIL for most of their time, so other clients' requests go on meanwhile; but
on a machine with few cores they still take a core the event loop would use. These threads
run at nice :data:`NICE` (Linux: a per-thread attribute), so when the two compete the
scheduler gives the loop, which answers every other client, most of the time: one client's
heavy body costs that client, not everyone. At most :data:`THREADS` such jobs run at once in
a server (``DataPlane.bulk_work``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

NICE = 10
THREADS = 2

_T = TypeVar("_T")


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not permitted, or not Linux
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


class BulkWork:
    """A server's low-priority threads (made as work comes, ended by :meth:`close`)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=THREADS, thread_name_prefix="tritonfast-bulk", initializer=_lower_priority
        )

    async def run(self, work: Callable[..., _T], *args: object) -> _T:
        """``work(*args)`` on a low-priority thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work, *args)

    def close(self) -> None:
        """No more work; the threads end once what they run is done."""
        self._executor.shutdown(wait=False)
