"""Business Logic Scripting: a Python model's ``InferenceRequest.exec()`` / ``async_exec()``
through the server handle (:mod:`tritonfast.runtime.handle`), in-process.

The callee gets the caller's arrays as they are (no copy), and its outputs come back the same
way. A failure is returned as a response whose ``has_error()`` is true, as Triton's Python
backend returns it: the callee's own error as it is; a request refused before it ran (unknown
model, bad inputs) as INTERNAL "Model <m> - Error when running inference: <why>", where an
unknown or unloaded model's reason is "Failed for execute the inference request. Model '<m>'
is not ready." (texts checked against Triton 2.51).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from tritonfast.backends.python import pb_values
from tritonfast.data.types import InferRequest, InputTensor, RequestedOutput
from tritonfast.errors import DECOUPLED_REFUSAL, Code, InternalError, TritonError
from tritonfast.runtime import handle
from tritonfast.runtime.handle import NotRun
from tritonfast.runtime.responses import Result, Streamed

if TYPE_CHECKING:  # pb_utils calls this module: its name is for annotations only
    from tritonfast.backends.python import pb_utils

# pb_utils.TritonError codes by the server's error code names.
_PB_CODES = {code.value: pb_code for pb_code, code in pb_values.ERROR_CODES.items()}


def execute(request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
    server_request = _server_request(request)
    if decoupled:
        try:
            items = handle.current().stream(server_request)
        except TritonError as error:  # no server, or a wait the server refuses
            return iter([_response(error)])
        return _responses(items)
    try:
        return _response(handle.current().infer(server_request))
    except NotRun as refused:
        return _not_run(server_request.model_name, refused.error)
    except TritonError as error:
        return _response(error)


async def execute_async(request: pb_utils.InferenceRequest, decoupled: bool) -> Any:
    server_request = _server_request(request)
    if decoupled:
        try:
            server = handle.current()
            if server.streams_from_any_thread:
                return _Responses.received_meanwhile(server.stream(server_request))
            # In a worker, the server may read the pipe only while the batch runs: all of the
            # call's responses come in before the model goes on.
            stream = server.stream(server_request)
            return _Responses.of(await asyncio.to_thread(lambda: list(_responses(stream))))
        except TritonError as error:  # no server, or a wait the server refuses
            return _Responses.of([_response(error)])
    server = handle.current()
    try:
        server.check(server_request)
        return _response(await server.infer_async(server_request))
    except NotRun as refused:
        return _not_run(server_request.model_name, refused.error)
    except TritonError as error:
        return _response(error)


def _responses(items: Iterator[Any]) -> Iterator[pb_values.InferenceResponse]:
    """The callee's responses as the model sees them; a final flag sent on its own comes as
    an empty last response, as in Triton."""
    try:
        for item in items:
            yield pb_values.InferenceResponse() if item.result is None else _response(item.result)
    except TritonError as error:
        yield _response(error)


class _Responses:
    """What ``await async_exec(decoupled=True)`` gives, as Triton's Python backend gives it:
    the callee's responses in order, taken with ``for`` (each step waits for the next, as
    Triton's iterator does) or with ``async for`` (each step waits without holding up the
    model's event loop). Iterating again goes over the same responses."""

    def __init__(self) -> None:
        self._items: list[pb_values.InferenceResponse] = []
        self._done = False
        self._changed = threading.Condition()
        # Coroutines waiting in ``async for`` for the next response, on their loops.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @classmethod
    def of(cls, items: list[pb_values.InferenceResponse]) -> _Responses:
        responses = cls()
        responses._items, responses._done = items, True
        return responses

    @classmethod
    def received_meanwhile(cls, items: Iterator[Streamed]) -> _Responses:
        """The responses of a request sent already, taken by a thread of their own as they
        come (calls made one after another run together)."""
        responses = cls()
        threading.Thread(
            target=responses._receive, args=(items,), name="tritonfast-bls-stream", daemon=True
        ).start()
        return responses

    def _receive(self, items: Iterator[Streamed]) -> None:
        try:
            for response in _responses(items):
                self._add(response)
        except BaseException as exc:
            self._add(_response(InternalError(f"the call ended early: {exc!r}")))
        finally:
            with self._changed:
                self._done = True
            self._wake()

    def _add(self, response: pb_values.InferenceResponse) -> None:
        with self._changed:
            self._items.append(response)
        self._wake()

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # its loop is closed
                loop.call_soon_threadsafe(_settle, future)

    def __iter__(self) -> Iterator[pb_values.InferenceResponse]:
        index = 0
        while True:
            with self._changed:
                while index >= len(self._items) and not self._done:
                    self._changed.wait()
                if index >= len(self._items):
                    return
                item = self._items[index]
            index += 1
            yield item

    async def __aiter__(self) -> AsyncIterator[pb_values.InferenceResponse]:
        index = 0
        while True:
            with self._changed:
                ready = index < len(self._items)
                item = self._items[index] if ready else None
                if not ready and self._done:
                    return
                if not ready:
                    woken = asyncio.get_running_loop().create_future()
                    self._waiters.append((asyncio.get_running_loop(), woken))
            if item is None:
                await woken  # cancelled while waiting: nothing was taken
                continue
            index += 1
            yield item


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _server_request(request: pb_utils.InferenceRequest) -> InferRequest:
    parameters = dict(request._parameters)
    if request.timeout():
        # The request's own timeout, as Triton sets it (TRITONSERVER_InferenceRequestSet-
        # TimeoutMicroseconds): the callee's queue policy decides whether it applies, as for
        # the "timeout" parameter of an HTTP or gRPC request. The call itself waits.
        parameters["timeout"] = request.timeout()
    if request.correlation_id():
        parameters["sequence_id"] = request.correlation_id()
    flags = request.flags()
    if flags & pb_values.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        parameters["sequence_start"] = True
    if flags & pb_values.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        parameters["sequence_end"] = True
    version = request.model_version()
    outputs = request.requested_output_names()
    return InferRequest(
        model_name=request.model_name(),
        model_version=str(version) if version >= 0 else "",
        id=request.request_id(),
        inputs=[
            InputTensor(t.name(), t.wire_datatype, tuple(t.as_numpy().shape), t.as_numpy())
            for t in request.inputs()
        ],
        outputs=[RequestedOutput(name) for name in outputs] if outputs else None,
        parameters=parameters,
        parent_trace=request._trace._trace if request._trace is not None else None,
    )


def _not_run(model: str, error: TritonError) -> pb_values.InferenceResponse:
    """A request the server refused before running it, worded as Triton's Python backend
    words it."""
    reason = error.message
    if error.code is Code.NOT_FOUND:
        reason = f"Failed for execute the inference request. Model '{model}' is not ready."
    elif DECOUPLED_REFUSAL in reason:  # exec() without decoupled=True, to a decoupled model
        reason = (
            f"Model {model} is using the decoupled. The current BLS request call doesn't"
            " support models using the decoupled transaction policy. Please use"
            " 'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled"
            " models.'"  # the stray quote is Triton's
        )
    message = f"Model {model} - Error when running inference: {reason}"
    return pb_values.InferenceResponse(error=pb_values.TritonError(message))


def _response(result: Result) -> pb_values.InferenceResponse:
    if isinstance(result, TritonError):
        code = _PB_CODES.get(result.code.value, pb_values.TritonError.INTERNAL)
        return pb_values.InferenceResponse(error=pb_values.TritonError(result.message, code))
    return pb_values.InferenceResponse(
        output_tensors=[pb_values.Tensor._wrap(t.name, t.data, t.datatype) for t in result.outputs],
        parameters=dict(result.parameters),
    )
