"""One thread per model instance: take a batch from the Rust queue, run it, hand back results.

The wait for a batch happens inside the Rust core with the GIL released. Results are handed
to the event loop with one ``call_soon_threadsafe`` per batch, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

from tritonfast.backends.base import Backend, Result
from tritonfast.errors import InternalError, TritonError
from tritonfast.runtime.types import InferRequest

log = logging.getLogger(__name__)

# How long one wait for work may block before the loop re-checks for shutdown.
_POLL_US = 500_000

# A queued item: the request and the future its frontend task awaits.
QueueItem = tuple[InferRequest, "asyncio.Future[Any]"]


class InstanceLoop:
    def __init__(self, name: str, queue: Any, backend: Backend, loop: asyncio.AbstractEventLoop):
        self.name = name
        self._queue = queue
        self._backend = backend
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name=f"instance:{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to finish its last batch; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def finalize(self) -> None:
        try:
            self._backend.finalize()
        except Exception:  # a model's finalize must not stop the others' shutdown
            log.exception("finalize failed for instance %s", self.name)

    def _run(self) -> None:
        pop_batch = self._queue.pop_batch
        while True:
            batch = pop_batch(_POLL_US)
            if batch is None:  # closed and drained
                return
            if batch:
                self._execute(batch)

    def _execute(self, batch: list[QueueItem]) -> None:
        requests = [item[0] for item in batch]
        try:
            results: Sequence[Result] = self._backend.execute(requests)
        except TritonError as exc:
            results = [exc] * len(batch)
        except Exception as exc:  # a backend bug fails this batch, not the server
            log.exception("instance %s failed to execute a batch", self.name)
            results = [InternalError(f"instance {self.name}: {exc}")] * len(batch)
        if len(results) != len(batch):
            error = InternalError(
                f"instance {self.name} returned {len(results)} responses for {len(batch)} requests"
            )
            results = [error] * len(batch)
        self._loop.call_soon_threadsafe(_settle, [item[1] for item in batch], results)


def _settle(futures: list[asyncio.Future[Any]], results: Sequence[Result]) -> None:
    """Runs on the event loop: complete every future of one batch."""
    for future, result in zip(futures, results, strict=True):
        if future.done():  # the caller went away (cancelled)
            continue
        if isinstance(result, TritonError):
            future.set_exception(result)
        else:
            future.set_result(result)
