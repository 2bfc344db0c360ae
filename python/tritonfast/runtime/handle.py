"""What models and backends reach the server through: the :class:`Handle` interface (the
server's own is :class:`tritonfast.api.serverhandle.ServerHandle`; a worker process has one
that forwards over its pipe), the handle of the server that runs, and :class:`NotRun`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import TritonError, UnavailableError
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


_current: Handle | None = None


def install(handle: Handle | None) -> None:
    """Make ``handle`` the one models reach (None when the server stops)."""
    global _current
    _current = handle


def current() -> Handle:
    """The running server's handle; UnavailableError when no server runs."""
    if _current is None:
        raise UnavailableError(NOT_SERVING_MESSAGE)
    return _current
