"""The server handle: how models and backends submit requests to any model of the server,
in-process (BLS from ``pb_utils``, ensembles, bound callables), through the data plane.

A request sent through the handle goes the same way as one from a client (validation, the
model's own scheduler, batching, statistics), minus the wire: its tensors pass as the arrays
they are. The handle's blocking calls wait on the caller's thread for the server's event loop
to answer, so they must never be made on that loop's own thread, where the wait could never
end: such a call is refused with an error (see runtime.looprun for which models may run
there). Coroutines waiting on the handle from another event loop (a model's own loop) are fine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import TritonError, UnavailableError
from tritonfast.runtime.handle import NotRun
from tritonfast.runtime.instance import Caller, running_instance
from tritonfast.runtime.responses import Streamed

if TYPE_CHECKING:
    from tritonfast._core import LaneCompletions, LaneRegistry, SharedMemoryRegistry
    from tritonfast.api.dataplane import DataPlane
    from tritonfast.custommetrics import ServerCustomMetrics


class ServerHandle:
    """Submits requests to the server whose event loop is ``loop`` (make it on that loop)."""

    # The responses of a stream may be taken on any thread, at any time.
    streams_from_any_thread = True

    def __init__(self, dataplane: DataPlane, loop: asyncio.AbstractEventLoop) -> None:
        self._dataplane = dataplane
        self._loop = loop
        self._loop_thread = threading.get_ident()

    @property
    def custom_metrics(self) -> ServerCustomMetrics:
        return self._dataplane.custom_metrics

    @property
    def lane_completions(self) -> LaneCompletions:
        return self._dataplane.lane_completions

    @property
    def lane_registry(self) -> LaneRegistry:
        return self._dataplane.lane_registry

    @property
    def shared_memory_regions(self) -> SharedMemoryRegistry:
        return self._dataplane.shared_memory_regions

    def infer(self, request: InferRequest) -> InferResponse:
        """Send ``request`` and wait for its one response; raises its TritonError, or NotRun
        when it was refused before running. (A request's ``timeout`` parameter is its queue's
        business, as for any request.) A model instance waiting here counts as busy with the
        server (see :meth:`~tritonfast.runtime.scheduler.Scheduler.waiting_on_server`)."""
        self._may_wait()
        with _waiting(running_instance()):
            return self._infer(request)

    def _infer(self, request: InferRequest) -> InferResponse:
        sink: concurrent.futures.Future[InferResponse] = concurrent.futures.Future()
        # Straight into the model's queue from this thread when its scheduler allows (the
        # answer comes back from the instance that ran it), else through the loop.
        try:
            submitted = self._dataplane.submit(request, sink)
            if not submitted:
                self._dataplane.check(request)
        except TritonError as error:
            raise NotRun(error) from None
        if submitted:
            return sink.result()
        return asyncio.run_coroutine_threadsafe(self._dataplane.infer(request), self._loop).result()

    def is_decoupled(self, model: str, version: str = "") -> bool:
        """Whether ``model`` may answer a request with any number of responses."""
        return self._dataplane.is_decoupled(model, version)

    def max_batch_size(self, model: str, version: str = "") -> int:
        """``model``'s ``max_batch_size`` (0: its tensors have no batch dimension)."""
        return self._dataplane.model_config(model, version).max_batch_size

    def check(self, request: InferRequest) -> None:
        """Raise NotRun with the error ``request`` would be refused with before running."""
        try:
            self._dataplane.check(request)
        except TritonError as error:
            raise NotRun(error) from None

    # -- model control (pb_utils.load_model, unload_model, is_model_ready) --------------------
    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        """Load (or reload) ``name`` as the repository extension's load does, and wait until it
        is done; raises its TritonError (e.g. when the server is not in explicit mode)."""
        self._may_wait()
        coroutine = self._dataplane.load_model(name, parameters)
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        """Unload ``name`` as the repository extension's unload does, and wait until it is
        done."""
        self._may_wait()
        coroutine = self._dataplane.unload_model(name, unload_dependents)
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def model_ready(self, name: str, version: str) -> bool:
        return self._dataplane.model_ready(name, version)

    async def infer_async(self, request: InferRequest) -> InferResponse:
        """Send ``request`` from a coroutine on any event loop and await its one response.
        (On the server's own loop: a step of an ensemble, whose caller already counts as
        waiting.)"""
        if asyncio.get_running_loop() is self._loop:
            return await self._dataplane.infer(request)
        self._may_wait()
        with _waiting(running_instance()):
            return await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(self._dataplane.infer(request), self._loop)
            )

    def stream(self, request: InferRequest) -> Iterator[Streamed]:
        """Send ``request`` (now) and return an iterator of its responses as they come (any
        model), which any thread may take them from. The calling instance counts as waiting
        on the server until the iterator is done with (its final response, closed, or
        dropped)."""
        self._may_wait()
        waiting = contextlib.ExitStack()
        waiting.enter_context(_waiting(running_instance()))
        items: queue.SimpleQueue[Streamed | BaseException] = queue.SimpleQueue()
        future = asyncio.run_coroutine_threadsafe(self._pump(request, items.put), self._loop)
        return _Responses(items, future, waiting)

    async def stream_async(self, request: InferRequest) -> AsyncIterator[Streamed]:
        """Send ``request`` from a coroutine and yield its responses as they come."""
        if asyncio.get_running_loop() is self._loop:
            async for item in self._dataplane.stream(request):
                yield item
            return
        self._may_wait()
        items: asyncio.Queue[Streamed | BaseException] = asyncio.Queue()
        caller = asyncio.get_running_loop()

        def put(got: Streamed | BaseException) -> None:
            caller.call_soon_threadsafe(items.put_nowait, got)

        with _waiting(running_instance()):
            future = asyncio.run_coroutine_threadsafe(self._pump(request, put), self._loop)
            try:
                while True:
                    item = _checked(await items.get())
                    yield item
                    if item.final:
                        return
            finally:
                future.cancel()

    async def _pump(
        self, request: InferRequest, put: Callable[[Streamed | BaseException], None]
    ) -> None:
        """On the server's loop: hand each of ``request``'s responses to ``put``, or what
        stopped it (it could not start, or it was cancelled)."""
        try:
            async for item in self._dataplane.stream(request):
                put(item)
        except BaseException as exc:
            put(exc)

    def _may_wait(self) -> None:
        """Refuse a wait on the loop's own thread; tell the calling model it waits on the
        server, so that its batches never move to the loop."""
        instance = running_instance()
        if instance is not None:
            instance.calls_server()
        if threading.get_ident() == self._loop_thread:
            where = f" (model instance '{instance.name}')" if instance is not None else ""
            raise UnavailableError(
                f"a model running on the server's event loop cannot wait for the server{where};"
                " its batches run on its own threads from now on"
            )


def _checked(got: Streamed | BaseException) -> Streamed:
    if isinstance(got, BaseException):
        raise got
    return got


def _waiting(instance: Caller | None) -> contextlib.AbstractContextManager[None]:
    """Around a call to the server: the calling instance (if a model's batch makes it) counts
    as waiting on the server meanwhile."""
    return instance.calling_server() if instance is not None else contextlib.nullcontext()


class _Responses(Iterator[Streamed]):
    """The responses of a request :meth:`ServerHandle.stream` sent, as they come. Ending the
    iteration early (``close``, or dropping the iterator) cancels the request; ``waiting``
    is closed once the responses are over either way."""

    def __init__(
        self,
        items: queue.SimpleQueue[Streamed | BaseException],
        future: concurrent.futures.Future[None],
        waiting: contextlib.ExitStack,
    ) -> None:
        self._items = items
        self._future = future
        self._waiting = waiting
        self._done = False

    def __next__(self) -> Streamed:
        if self._done:
            raise StopIteration
        try:
            item = _checked(self._items.get())
        except BaseException:
            self.close()
            raise
        if item.final:
            self.close()
        return item

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._future.cancel()  # the caller stopped early: the request is cancelled
            self._waiting.close()

    def __del__(self) -> None:
        self.close()
