"""The gRPC core engine's second polling thread: started by a large request message (unary or
streamed), gone once they stop, and never in the way of stopping the server. Driven by a real
grpc client over a real socket against a ``CoreServer`` on its own event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from tritonfast.frontends.grpc import core
from tritonfast.frontends.grpc.core import CoreServer, Method
from tritonfast.memory.bodybudget import BodyBudget

from tests.waiting import wait_for

ECHO = "/test.Echo/Unary"
COUNT = "/test.Echo/Stream"
OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


async def _length(request: bytes, context: Any) -> bytes:
    return str(len(request)).encode()


async def _lengths(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        yield str(len(request)).encode()


def _helper_running() -> bool:
    return any(thread.name == "grpc-core-2" for thread in threading.enumerate())


class _Served:
    """A CoreServer running on an event loop in a thread of the test's process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        methods = {
            ECHO: Method(False, False, _length, None, None),
            COUNT: Method(True, True, _lengths, None, None),
        }
        self.server = self._call(self._make, methods)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    async def _make(self, methods: dict[str, Method]) -> CoreServer:
        return CoreServer(self.loop, methods, OPTIONS, BodyBudget())

    def _call(self, function: Any, *args: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(function(*args), self.loop).result(timeout=60)

    def stop(self) -> None:
        self._call(self.server.stop, 5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Served]:
    monkeypatch.setattr(core, "HELPER_IDLE_S", 1.0)
    running = _Served()
    yield running
    running.stop()


def _channel(served: _Served) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{served.port}", options=OPTIONS)


def test_small_messages_keep_one_polling_thread(served: _Served) -> None:
    with _channel(served) as channel:
        unary = channel.unary_unary(ECHO)
        for _ in range(20):
            assert unary(b"x" * 1000, timeout=30) == b"1000"
    assert not _helper_running()


def test_a_large_message_starts_the_helper_until_they_stop(served: _Served) -> None:
    large = b"\0" * core.LARGE_MESSAGE
    with _channel(served) as channel:
        unary = channel.unary_unary(ECHO)
        assert unary(large, timeout=60) == str(len(large)).encode()
        assert _helper_running()
        # Calls go on being answered with two threads on the queue.
        for _ in range(20):
            assert unary(b"abc", timeout=30) == b"3"
    wait_for(lambda: not _helper_running(), "the helper to stop once large messages stop")


def test_a_large_streamed_message_starts_the_helper(served: _Served) -> None:
    large = b"\0" * core.LARGE_MESSAGE
    with _channel(served) as channel:
        stream = channel.stream_stream(COUNT)
        answers = list(stream(iter([b"ab", large, b"abc"]), timeout=60))
        assert answers == [b"2", str(len(large)).encode(), b"3"]
        assert _helper_running()
    wait_for(lambda: not _helper_running(), "the helper to stop once large messages stop")


def test_the_server_stops_while_the_helper_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "HELPER_IDLE_S", 600.0)
    running = _Served()
    try:
        with _channel(running) as channel:
            channel.unary_unary(ECHO)(b"\0" * core.LARGE_MESSAGE, timeout=60)
        assert _helper_running()
    finally:
        running.stop()
    wait_for(lambda: not _helper_running(), "the helper to end with the server")
