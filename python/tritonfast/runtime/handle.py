"""What models and backends reach the server through: the :class:`Handle` interface (the
server's own is :class:`tritonfast.api.serverhandle.ServerHandle`; a worker process has one
that forwards over its pipe), which server's handle a model's code reaches (:func:`current`),
and :class:`NotRun`. Several servers may run in one process (in-process ``Server``s): each
instance knows its server, so each model reaches its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from typing import Any, Protocol

from tritonfast._core import LaneCompletions, LaneRegistry, SharedMemoryRegistry
from tritonfast.custommetrics import ServerCustomMetrics
from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import TritonError, UnavailableError
from tritonfast.runtime.instance import running_instance
from tritonfast.runtime.responses import Streamed

NOT_SERVING_MESSAGE = "the server is not serving: models can call other models only while it runs"


class NotRun(Exception):
    """A request the server refused before running it (unknown model, invalid inputs, a full
    queue): ``error`` says why."""

    def __init__(self, error: TritonError) -> None:
        super().__init__(error.message)
        self.error = error


class Handle(Protocol):
    """What models reach through :func:`current`: the server's ``ServerHandle``, or, in a
    worker process, a handle that forwards to it."""

    streams_from_any_thread: bool

    @property
    def custom_metrics(self) -> ServerCustomMetrics:
        """Where the model's pb_utils.MetricFamily objects register (a worker: its own)."""
        ...

    @property
    def lane_registry(self) -> LaneRegistry | None:
        """The lanes of the server's models, for the calls models make that the core takes
        (see runtime.lane); None in a worker process."""
        ...

    @property
    def lane_completions(self) -> LaneCompletions | None:
        """Where the core tells the server's HTTP frontend which requests it answered (see
        runtime.lane); None in a worker process."""
        ...

    @property
    def shared_memory_regions(self) -> SharedMemoryRegistry | None:
        """The server's system shared-memory regions, for the requests its models' lanes
        take (see runtime.lane); None in a worker process."""
        ...

    def infer(self, request: InferRequest) -> InferResponse: ...
    async def infer_async(self, request: InferRequest) -> InferResponse: ...
    def check(self, request: InferRequest) -> None: ...
    def is_decoupled(self, model: str, version: str = "") -> bool: ...
    def max_batch_size(self, model: str, version: str = "") -> int: ...
    def stream(self, request: InferRequest) -> Iterator[Streamed]: ...
    def stream_async(self, request: InferRequest) -> AsyncIterator[Streamed]: ...
    def load_model(self, name: str, parameters: dict[str, Any]) -> None: ...
    def unload_model(self, name: str, unload_dependents: bool) -> None: ...
    def model_ready(self, name: str, version: str) -> bool: ...


# The servers running in this process (a worker process: its one forwarding handle).
_live: list[Handle] = []
# The server a model's code reaches when no instance's batch runs it (a model's
# initialize(), warm-up): set by the repository around them.
_serving: ContextVar[Handle | None] = ContextVar("serving", default=None)

SEVERAL_SERVERS_MESSAGE = (
    "several servers run in this process, and a call made outside a model instance's batch"
    " (from a thread of the model's own) cannot tell which one it is for: make it from"
    " execute(), initialize() or a coroutine they start"
)


def install(handle: Handle) -> None:
    """``handle``'s server runs from now on (until :func:`uninstall`)."""
    _live.append(handle)


def uninstall(handle: Handle) -> None:
    with contextlib.suppress(ValueError):
        _live.remove(handle)


@contextlib.contextmanager
def serving(handle: Handle | None) -> Iterator[None]:
    """Code in this block runs for ``handle``'s server (see :func:`current`)."""
    token = _serving.set(handle)
    try:
        yield
    finally:
        _serving.reset(token)


def current() -> Handle:
    """The handle of the server the calling code runs for: that of the instance whose batch
    it runs (``runtime.instance.running_instance``), else the one set by :func:`serving`,
    else the one server of this process. UnavailableError when no server runs, or when
    several do and none of those says which."""
    instance = running_instance()
    if instance is not None and instance.server is not None:
        return instance.server
    handle = _serving.get()
    if handle is not None:
        return handle
    if len(_live) == 1:
        return _live[0]
    raise UnavailableError(SEVERAL_SERVERS_MESSAGE if _live else NOT_SERVING_MESSAGE)
