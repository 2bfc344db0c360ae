"""What ``await async_exec(decoupled=True)`` gives: the callee's responses, read with ``for``
or ``async for``, again if need be, and never lost to a cancelled wait."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from tritonfast.backends.python.bls import _Responses
from tritonfast.errors import InvalidArgumentError
from tritonfast.runtime.responses import Streamed


def stream(count: int, go: threading.Event | None = None) -> Iterator[Streamed]:
    for index in range(count):
        if go is not None and index == 1:
            go.wait(30)  # the second response comes late
        yield Streamed(InvalidArgumentError(f"r{index}"), index == count - 1)


def messages(responses) -> list[str]:
    return [response.error().message() for response in responses]


def test_for_reads_them_in_order_and_again() -> None:
    responses = _Responses.received_meanwhile(stream(3))
    assert messages(responses) == ["r0", "r1", "r2"]
    assert messages(responses) == ["r0", "r1", "r2"]


def test_a_cancelled_async_wait_takes_nothing() -> None:
    go = threading.Event()
    responses = _Responses.received_meanwhile(stream(3, go))

    async def read() -> list[str]:
        items = aiter(responses)
        first = await anext(items)
        with pytest.raises(asyncio.TimeoutError):  # the second is late: this wait is cancelled
            await asyncio.wait_for(anext(items), 0.05)
        go.set()
        rest = [response async for response in responses]
        return messages([first, *rest])

    assert asyncio.run(read()) == ["r0", "r0", "r1", "r2"]


def test_a_stream_that_breaks_ends_with_an_error() -> None:
    def broken() -> Iterator[Streamed]:
        yield Streamed(InvalidArgumentError("r0"), False)
        raise EOFError("pipe closed")

    got = messages(_Responses.received_meanwhile(broken()))
    assert got[0] == "r0"
    assert got[1].startswith("the call ended early: EOFError")
