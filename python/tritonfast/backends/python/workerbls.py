"""BLS from models in worker processes: ``exec()`` / ``async_exec()`` in a worker send the
request over the instance's pipe, and the server runs it through its own handle
(:mod:`tritonfast.runtime.handle`) and sends the answer back. A custom metric's ``value()``
is asked of the server the same way.

The worker's side is :class:`WorkerHandle`, installed as the worker's server handle; the
server's side is :func:`answer`, called by whatever reads the pipe (the instance thread while
its batch runs, or the decoupled models' relay). The tensors travel in the messages (pickled):
these calls are not on the zero-copy path in-process BLS is on. Calls are made one at a time
per worker. ``exec(decoupled=True)`` works too; the callee's responses reach the worker's model
together, once the callee has sent its final flag.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from tritonfast.custommetrics import CustomMetrics, Labels, ServerCustomMetrics, State
from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import Code, TritonError, UnavailableError, UnsupportedError, error_for
from tritonfast.runtime import handle
from tritonfast.runtime.handle import NotRun
from tritonfast.runtime.responses import Streamed


def _strip(request: InferRequest) -> None:
    """What of a worker's BLS request does not travel: all but a parent trace's token."""
    request.sink = request.sender = request.trace = None
    if not isinstance(request.parent_trace, TraceToken):
        request.parent_trace = None


class WorkerHandle:
    """The server handle inside a worker process: each call is a round trip on the pipe,
    one at a time (``recv`` gives the answers to them, nothing else)."""

    # Some instances' pipes are read by the server only while a batch runs (those driven from
    # their own thread): a call's answers are taken before the model goes on.
    streams_from_any_thread = False

    def __init__(
        self,
        send: Callable[[tuple[Any, ...]], None],
        recv: Callable[[], Any],
        metrics: CustomMetrics,
    ) -> None:
        self._send = send
        self._recv = recv
        self._lock = threading.Lock()
        # The worker's own registry; /metrics merges it with the server's and other workers'.
        self.custom_metrics = ServerCustomMetrics(metrics)
        self.lane_completions = None  # the server's HTTP frontend is not here
        self.lane_registry = None  # (nor its lanes)
        self.shared_memory_regions = None  # (nor the clients' regions)
        # Set by the worker once it has the core's channel: makes a call over it, or returns
        # None when the call must go over the pipe.
        self.direct: Callable[[InferRequest], InferResponse | None] | None = None
        # The server reads the pipe only once the model has started (see open).
        self._open = False

    def open(self) -> None:
        """The model has started: its calls go to the server from now on (during its
        ``initialize`` they are refused, as when no server runs)."""
        self._open = True

    def _call(self, message: tuple[Any, ...]) -> Any:
        """Send ``message`` and return its (first) answer."""
        self._check_open()
        with self._lock:
            self._send(message)
            return self._recv()

    def infer(self, request: InferRequest) -> InferResponse:
        self._check_open()
        if self.direct is not None:
            answered = self.direct(request)
            if answered is not None:
                return answered
        _strip(request)
        _, kind, payload = self._call(("bls", request))
        if kind == "ok":
            return payload  # type: ignore[no-any-return]
        error = error_for(Code(payload[0]), payload[1])
        if kind == "not_run":
            raise NotRun(error)
        raise error

    async def infer_async(self, request: InferRequest) -> InferResponse:
        return await asyncio.to_thread(self.infer, request)

    def metric_value(self, source: str, name: str, labels: Labels, state: State) -> float:
        """A custom metric's value over the server and all its workers (``source``: the key
        the server keeps this worker's metrics under)."""
        return float(self._call(("metric_value", source, state, name, labels))[1])

    def check(self, request: InferRequest) -> None:
        """Checked by the server as the call runs (one round trip instead of two)."""

    def is_decoupled(self, model: str, version: str = "") -> bool:
        return False  # (asked by ensembles only, which do not run in workers)

    def max_batch_size(self, model: str, version: str = "") -> int:
        raise UnsupportedError("model configurations are not available in a worker process")

    def stream(self, request: InferRequest) -> Iterator[Streamed]:
        self._check_open()
        _strip(request)
        items = []
        with self._lock:
            self._send(("bls_stream", request, None))
            final = False
            while not final:
                _, kind, payload, final = self._recv()
                items.append((kind, payload, final))
        for kind, payload, final in items:
            if kind == "ok":
                yield Streamed(payload, final)
            elif kind == "error":
                yield Streamed(error_for(Code(payload[0]), payload[1]), final)
            else:  # refused before it ran: raised, as the server's own handle raises it
                raise error_for(Code(payload[0]), payload[1])

    def load_model(self, name: str, parameters: dict[str, Any]) -> None:
        self._control("load_model", name, parameters)

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._control("unload_model", name, unload_dependents)

    def model_ready(self, name: str, version: str) -> bool:
        return bool(self._control("model_ready", name, version))

    def _check_open(self) -> None:
        if not self._open:
            raise UnavailableError(handle.NOT_SERVING_MESSAGE)

    def _control(self, operation: str, *arguments: Any) -> Any:
        _, kind, payload = self._call(("control", operation, arguments))
        if kind == "error":
            raise error_for(Code(payload[0]), payload[1])
        return payload

    async def stream_async(self, request: InferRequest) -> AsyncIterator[Streamed]:
        for item in await asyncio.to_thread(lambda: list(self.stream(request))):
            yield item


# What a worker asks the server for over its pipe: other models (BLS), model control
# (pb_utils.load_model and the like), and the value of one of its custom metrics over every
# process (a model's instances may run in several).
REQUESTS = ("bls", "bls_stream", "control", "metric_value")
# What the server answers them with.
ANSWERS = ("bls_answer", "bls_item", "control_answer", "metric_answer")
# The model control calls a worker may make (methods of the server's handle).
_CONTROL = ("load_model", "unload_model", "model_ready")

# Traces of requests sent to workers, by token: a traced request reaches its worker with a
# TraceToken as its trace, which the model passes on (``trace=request.trace()``) to its BLS
# calls, and the server puts the real trace back as their parent. The newest
# _TRACES_KEPT are kept (a model may call the server for a request after its batch).
_TRACES_KEPT = 4096
_traces: OrderedDict[int, Any] = OrderedDict()
_trace_tokens = itertools.count(1)
_traces_lock = threading.Lock()


class TraceToken:
    """What a worker holds in place of a traced request's trace."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        return (TraceToken, (self.value,))


def trace_token(trace: Any) -> TraceToken | None:
    """On the server: the token a worker's request carries for ``trace`` (None: untraced)."""
    if trace is None:
        return None
    with _traces_lock:
        token = next(_trace_tokens)
        _traces[token] = trace
        if len(_traces) > _TRACES_KEPT:
            _traces.popitem(last=False)
    return TraceToken(token)


def _restore_parent(request: InferRequest) -> None:
    parent = request.parent_trace
    if isinstance(parent, TraceToken):
        with _traces_lock:
            request.parent_trace = _traces.get(parent.value)


def serve(message: tuple[Any, ...], send: Callable[[tuple[Any, ...]], None]) -> None:
    """On the server: run a worker's BLS request (one of :data:`REQUESTS`) and send it what
    came of it."""
    if message[0] == "metric_value":
        _, source, state, name, labels = message
        value = handle.current().custom_metrics.merged_value(name, labels, source, state)
        send(("metric_answer", value))
        return
    if message[0] == "control":
        send(_control(message[1], message[2]))
        return
    request = message[1]
    _restore_parent(request)
    if message[0] == "bls":
        send(_answer(message))
        return
    try:
        for item in handle.current().stream(request):
            result = item.result
            if isinstance(result, TritonError):
                send(("bls_item", "error", (result.code.value, result.message), item.final))
            else:
                send(("bls_item", "ok", result, item.final))
    except TritonError as error:  # refused before it ran
        send(("bls_item", "not_run", (error.code.value, error.message), True))


def _answer(message: tuple[Any, ...]) -> tuple[Any, ...]:
    _, request = message
    try:
        return ("bls_answer", "ok", handle.current().infer(request))
    except NotRun as refused:
        return ("bls_answer", "not_run", (refused.error.code.value, refused.error.message))
    except TritonError as error:
        return ("bls_answer", "error", (error.code.value, error.message))


def _control(operation: str, arguments: tuple[Any, ...]) -> tuple[Any, ...]:
    if operation not in _CONTROL:
        return ("control_answer", "error", (Code.INTERNAL.value, f"no such call: {operation}"))
    try:
        return ("control_answer", "ok", getattr(handle.current(), operation)(*arguments))
    except TritonError as error:
        return ("control_answer", "error", (error.code.value, error.message))
