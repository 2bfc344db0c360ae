"""Decoupled models in worker processes: responses sent from the worker, at any time, reach
the request's sender in the server.

The worker gives each request of a decoupled model a :class:`~tritonfast.runtime.responses.
ResponseSender` (with Triton's rules) whose responses go to the server with its request's
token: the output tensors travel in the message itself, not through the instance's output
segment, because a stream's responses outlive the batch that segment belongs to. A batch the
server's core sent over its channel has its responses sent back over that channel
(:meth:`WorkerStreams.over_channel`, typed messages the core reads: ``rust/src/lane/
streams.rs``). A batch that came over the pipe (``core-path=off``) has them sent over the pipe,
pickled, in ``("responses", [(token, result, final), ...])`` messages: the event loop reads
them (:mod:`.looppipe`), or, for a model driven from its instance thread (one that may call
the server), a :class:`ResponseRelay` thread does. Either way the server passes each response
to the stream of the request with that token, takes the batch's own reply, and tells the
worker over the pipe which streams' consumers went away (``("cancel", token)``), which the
worker's senders then report through ``is_cancelled()``.

Coalescing: every message costs both processes a wake-up, which on a busy machine costs more
than a small response itself (a response per message costs the server's reader thread about
80 µs of CPU on 2 vCPUs). So a response sent within :data:`LINGER_S` of the previous message
waits, with those sent after it, until that much time has passed since then (a thread of the
worker's flushes them if the model sends nothing more), :data:`COALESCE_COUNT` responses or
:data:`COALESCE_BYTES` of tensors wait, or a final flag comes. A request's first response goes
at once (with any held back before it), as does one sent after a pause (a model that takes a
millisecond or more per token): the time to a first response is what a streaming client
waits on most. A model sending many small responses in a burst has the rest delivered in
groups, each at most :data:`LINGER_S` late.

A worker that dies ends every stream still open with an error naming the instance.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from tritonfast._core import LaneWorkerChannel
from tritonfast.backends.python import workerbls, workerlog
from tritonfast.backends.python.channelbatch import channel_head
from tritonfast.data import rawtensor
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import Code, InternalError, TritonError, error_for
from tritonfast.runtime.responses import ResponseSender, Result

log = logging.getLogger(__name__)

# How often the relay looks for streams whose consumer went away, while any is open.
CANCEL_POLL_S = 0.005

# Coalescing of a worker's responses (see the module docstring).
LINGER_S = 0.001
COALESCE_COUNT = 64
COALESCE_BYTES = 256 * 1024

# A response as it travels: ("ok", model, version, id, parameters, [(name, datatype, shape,
# data)]) or ("error", code, message).
Described = tuple[Any, ...]


def describe(result: Result) -> Described:
    if isinstance(result, TritonError):
        return ("error", result.code.value, result.message)
    tensors = [(t.name, t.datatype, t.shape, t.data) for t in result.outputs]
    return ("ok", result.model_name, result.model_version, result.id, result.parameters, tensors)


def channel_described(result: Result) -> Described:
    """A response as the core's channel carries it (``LaneWorkerChannel.stream``): parameters
    as JSON text, tensors as their wire bytes."""
    if isinstance(result, TritonError):
        return ("error", result.code.value, result.message)
    tensors = [
        (t.name, t.datatype, list(t.shape), rawtensor.to_raw(t.datatype, t.data))
        for t in result.outputs
    ]
    head = channel_head(result.model_name, result.model_version, result.id, result.parameters)
    return (*head, tensors)


def rebuild(described: Described) -> Result:
    if described[0] == "error":
        return error_for(Code(described[1]), described[2])
    _, model_name, model_version, response_id, parameters, tensors = described
    outputs = [
        OutputTensor(name, dtype, tuple(shape), data) for name, dtype, shape, data in tensors
    ]
    return InferResponse(model_name, model_version, response_id, outputs, parameters)


# -- the server side ----------------------------------------------------------------------------
class ResponseRelay:
    """Reads one worker's pipe on its own thread (see the module docstring)."""

    def __init__(
        self,
        conn: Connection,
        instance_name: str,
        serve: Callable[[tuple[Any, ...], Callable[[tuple[Any, ...]], None]], None],
    ) -> None:
        self._conn = conn
        self._serve = serve  # answers the worker's calls to the server
        self._instance_name = instance_name
        self._send_lock = threading.Lock()
        self._open: dict[int, ResponseSender] = {}
        self._cancel_sent: set[int] = set()
        self._open_lock = threading.Lock()
        self._replies: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(
            target=self._run, name=f"relay:{instance_name}", daemon=True
        )
        self._thread.start()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._conn.send(message)

    def open(self, token: int, sender: ResponseSender) -> None:
        with self._open_lock:
            self._open[token] = sender

    def forget(self, tokens: list[int]) -> None:
        """Streams whose requests were rescheduled: they come back under new tokens."""
        with self._open_lock:
            for token in tokens:
                self._open.pop(token, None)
                self._cancel_sent.discard(token)

    def reply(self, timeout: float) -> Any:
        """The worker's next batch reply; raises ``queue.Empty`` after ``timeout``, EOFError
        once the worker is gone."""
        reply = self._replies.get(timeout=timeout)
        if reply is None:
            raise EOFError
        return reply

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        conn = self._conn
        try:
            while True:
                # With no stream open the relay sleeps until the worker writes: a stream opens
                # for a batch, whose own reply (or first response) comes over this pipe.
                if self._open and not conn.poll(CANCEL_POLL_S):
                    self._pass_cancellations()
                    continue
                message = conn.recv()
                if message[0] == "responses":
                    for token, described, final in message[1]:
                        self._deliver(token, rebuild(described) if described else None, final)
                elif message[0] == "log":
                    workerlog.emit(message)
                elif message[0] in workerbls.REQUESTS:  # the model called another model
                    self._serve(message, self.send)
                else:
                    self._replies.put(message)
        except (EOFError, OSError):
            pass
        except Exception:  # a relay bug must not leave streams hanging
            log.exception("instance %s: the response relay failed", self._instance_name)
        self._replies.put(None)
        self._end_open_streams()

    def _deliver(self, token: int, result: Result | None, final: bool) -> None:
        with self._open_lock:
            sender = self._open.pop(token, None) if final else self._open.get(token)
            if final:
                self._cancel_sent.discard(token)
        if sender is None:
            return
        try:
            sender.send(result, final)
        except TritonError as error:  # the worker's sender enforces the same rules first
            log.warning("instance %s: %s", self._instance_name, error.message)

    def _pass_cancellations(self) -> None:
        with self._open_lock:
            gone = [
                token
                for token, sender in self._open.items()
                if token not in self._cancel_sent and sender.is_cancelled()
            ]
            self._cancel_sent.update(gone)
        for token in gone:
            self.send(("cancel", token))

    def _end_open_streams(self) -> None:
        with self._open_lock:
            senders, self._open = list(self._open.values()), {}
        error = InternalError(
            f"the worker process of model instance '{self._instance_name}' exited before it"
            " sent the final response"
        )
        for sender in senders:
            sender.abandon(error)


# -- the worker side ----------------------------------------------------------------------------
class WorkerStreams:
    """The worker's end: senders whose responses go over the pipe, coalesced (see the module
    docstring). Every message the worker sends goes through here, responses first."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        # How held-back responses go out, and how each is described for that.
        self._ship: Callable[[list[tuple[int, Described | None, bool]]], None] = self._to_pipe
        self._describe: Callable[[Result], Described] = describe
        # Reentrant: a ResponseSender collected while the lock is held (its finalizer ends its
        # stream, see responses.ResponseSender.__del__) sends through here from the same thread.
        self._lock = threading.RLock()
        self._cancelled: set[int] = set()
        self._pending: list[tuple[int, Described | None, bool]] = []
        self._pending_bytes = 0
        self._last_sent = 0.0  # time.monotonic() of the last message
        # The flusher thread (started when first needed) and when it must flush next.
        self._flush_due: float | None = None
        self._flusher_wake = threading.Condition(self._lock)
        self._flusher: threading.Thread | None = None

    def over_channel(self, channel: LaneWorkerChannel) -> WorkerStreams:
        """Streams of the batches the server's core sends over its ``channel`` (tokens the
        core gave): their responses go over that channel, coalesced alike; the cancellations
        the server sends over the pipe reach both."""
        streams = WorkerStreams(self._conn)
        streams._cancelled = self._cancelled
        streams._ship = channel.stream
        streams._describe = channel_described
        return streams

    def _to_pipe(self, pending: list[tuple[int, Described | None, bool]]) -> None:
        self._conn.send(("responses", pending))

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._flush()
            self._conn.send(message)
            self._last_sent = time.monotonic()

    def flush(self) -> None:
        """Send the responses held back now (before a batch's reply, which follows them)."""
        with self._lock:
            self._flush()

    def cancel(self, token: int) -> None:
        self._cancelled.add(token)

    def respond(
        self, token: int, described: Described | None, final: bool, size: int, first: bool
    ) -> None:
        """Send (or hold back, see the module docstring) one response of ``token``'s stream;
        ``size``: its tensors' bytes; ``first``: the stream's first response."""
        with self._lock:
            pending = self._pending
            pending.append((token, described, final))
            self._pending_bytes += size
            now = time.monotonic()
            if (
                final
                or first
                or now - self._last_sent >= LINGER_S
                or len(pending) >= COALESCE_COUNT
                or self._pending_bytes >= COALESCE_BYTES
            ):
                self._flush()
                self._last_sent = now
            elif self._flush_due is None:
                self._flush_due = self._last_sent + LINGER_S
                if self._flusher is None:
                    self._flusher = threading.Thread(
                        target=self._run_flusher, name="response-flusher", daemon=True
                    )
                    self._flusher.start()
                else:
                    self._flusher_wake.notify()

    def _flush(self) -> None:
        """Send the responses held back (the lock held)."""
        self._flush_due = None
        if self._pending:
            pending, self._pending, self._pending_bytes = self._pending, [], 0
            self._ship(pending)

    def _run_flusher(self) -> None:
        """Sends held-back responses once they are due, when the model sends nothing more."""
        with contextlib.suppress(OSError, ValueError), self._lock:  # the server went away
            while True:
                due = self._flush_due
                if due is None:
                    self._flusher_wake.wait()
                    continue
                now = time.monotonic()
                if now < due:
                    self._flusher_wake.wait(due - now)
                    continue
                self._flush()
                self._last_sent = now

    def sender(self, token: int, request: InferRequest) -> ResponseSender:
        """A decoupled sender for ``request``, whose ``cancelled`` tells whether its caller
        went away while its batch runs (the cancellation bytes)."""
        first = True

        def deliver(result: Result | None, final: bool) -> None:
            nonlocal first
            described = None if result is None else self._describe(result)
            size = (
                sum(t.data.nbytes for t in result.outputs)
                if isinstance(result, InferResponse)
                else 0
            )
            with contextlib.suppress(OSError, ValueError):  # the server went away
                self.respond(token, described, final, size, first)
            first = False
            if final:
                self._cancelled.discard(token)

        sink = _WorkerSink(self._cancelled, token, request)
        return ResponseSender(sink, request.id, decoupled=True, deliver=deliver)


class _WorkerSink:
    """What a worker-side sender asks whether its consumer went away."""

    __slots__ = ("_cancelled", "_request", "_token")

    def __init__(self, cancelled: set[int], token: int, request: InferRequest) -> None:
        self._cancelled = cancelled
        self._token = token
        self._request = request

    def cancelled(self) -> bool:
        return self._token in self._cancelled or self._request.cancelled
