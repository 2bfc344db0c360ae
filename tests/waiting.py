"""Waiting, bounded, for a condition: ``check`` is polled until it holds, and the test fails
after ``timeout`` seconds. One loop for both a thread (``wait_for``) and a coroutine that
lets its event loop run in between (``wait_for_async``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator


def _polls(check: Callable[[], object], what: str, timeout: float) -> Iterator[None]:
    """Yields each time ``check`` does not hold yet; fails once ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        yield


def wait_for(check: Callable[[], object], what: str, timeout: float = 30) -> None:
    """Polls ``check`` until it holds; fails after ``timeout`` seconds."""
    for _ in _polls(check, what, timeout):
        time.sleep(0.01)


async def wait_for_async(check: Callable[[], object], what: str, timeout: float = 10) -> None:
    """Polls ``check`` (letting the loop run in between) until it holds; fails after
    ``timeout`` seconds."""
    for _ in _polls(check, what, timeout):
        await asyncio.sleep(0.001)
