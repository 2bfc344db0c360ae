"""BLS from models in worker processes: ``exec()`` / ``async_exec()`` in a worker send the
request over the instance's pipe, and the server runs it through its own handle
(:mod:`tritonfast.runtime.handle`) and sends the answer back.

The worker's side is :class:`WorkerHandle`, installed as the worker's server handle; the
server's side is :func:`answer`, called by whatever reads the pipe (the instance thread while
its batch runs, or the decoupled models' relay). The tensors travel in the messages (pickled):
these calls are not on the zero-copy path in-process BLS is on. Calls are made one at a time
per worker. A decoupled callee (``exec(decoupled=True)``) is not available from a worker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tritonfast.errors import Code, TritonError, UnsupportedError, error_for
from tritonfast.runtime import handle
from tritonfast.runtime.handle import NotRun
from tritonfast.runtime.responses import Streamed
from tritonfast.runtime.types import InferRequest, InferResponse

# Which end of the pipe the worker reads other messages with while it waits for an answer.
Other = Callable[[tuple[Any, ...]], None]


class WorkerHandle:
    """The server handle inside a worker process: each call is a round trip on the pipe."""

    def __init__(
        self, send: Callable[[tuple[Any, ...]], None], recv: Callable[[], Any], other: Other
    ) -> None:
        self._send = send
        self._recv = recv
        self._other = other  # messages for someone else (cancellations) that arrive meanwhile
        self._lock = threading.Lock()

    def infer(self, request: InferRequest, timeout: float | None = None) -> InferResponse:
        request.sink = request.sender = request.trace = request.parent_trace = None  # not sent
        with self._lock:
            self._send(("bls", request, timeout))
            while True:
                message = self._recv()
                if message[0] == "bls_answer":
                    break
                self._other(message)
        _, kind, payload = message
        if kind == "ok":
            return payload  # type: ignore[no-any-return]
        if kind == "timeout":
            raise TimeoutError
        error = error_for(Code(payload[0]), payload[1])
        if kind == "not_run":
            raise NotRun(error)
        raise error

    async def infer_async(self, request: InferRequest) -> InferResponse:
        return await asyncio.to_thread(self.infer, request)

    def check(self, request: InferRequest) -> None:
        """Checked by the server as the call runs (one round trip instead of two)."""

    def is_decoupled(self, model: str, version: str = "") -> bool:
        return False  # (decoupled callees are not available from a worker)

    def max_batch_size(self, model: str, version: str = "") -> int:
        raise UnsupportedError("model configurations are not available in a worker process")

    def stream(self, request: InferRequest) -> Iterator[Streamed]:
        raise UnsupportedError(NO_DECOUPLED_MESSAGE)

    def stream_async(self, request: InferRequest) -> Any:
        raise UnsupportedError(NO_DECOUPLED_MESSAGE)


NO_DECOUPLED_MESSAGE = (
    "exec(decoupled=True) is not available to models in the 'process' instance mode"
)


def answer(message: tuple[Any, ...]) -> tuple[Any, ...]:
    """On the server: run a worker's BLS request and say how it went."""
    _, request, timeout = message
    try:
        return ("bls_answer", "ok", handle.current().infer(request, timeout))
    except NotRun as refused:
        return ("bls_answer", "not_run", (refused.error.code.value, refused.error.message))
    except TritonError as error:
        return ("bls_answer", "error", (error.code.value, error.message))
    except TimeoutError:
        return ("bls_answer", "timeout", None)
