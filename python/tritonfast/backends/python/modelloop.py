"""The event loop on which a Python model's ``async def execute`` runs, one per instance.

As in Triton's Python backend, a coroutine ``execute`` runs on an asyncio loop of the model
instance's own (a thread started on the first coroutine, never the server's loop): the
instance thread waits for it to finish for a single-response model, and does not wait for a
decoupled one, whose next batch may then start while earlier coroutines still run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any


class ModelLoop:
    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"model-loop:{self._name}", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (or exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._started()).result()

    def spawn(
        self,
        coroutine: Coroutine[Any, Any, Any],
        failed: Callable[[BaseException], None],
    ) -> None:
        """Run ``coroutine`` on the loop without waiting; ``failed`` is told if it raises."""

        def done(future: Future[Any]) -> None:
            if not future.cancelled() and future.exception() is not None:
                failed(future.exception())  # type: ignore[arg-type]

        asyncio.run_coroutine_threadsafe(coroutine, self._started()).add_done_callback(done)

    def stop(self) -> None:
        """Stop the loop (coroutines still pending are abandoned) and its thread."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
