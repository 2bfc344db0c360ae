"""The event loop's end of a worker's pipe: the batches of an instance that runs elsewhere are
started and answered on the loop, with no thread of the server in between.

One :class:`LoopPipe` per worker process. The loop writes each batch's message itself and
watches the pipe for the worker's whole life (one reader, registered once), handling what the
worker sends, in order:

- the batch's reply: the instance's ``execute_later`` settles the batch and releases the
  instance;
- responses of decoupled requests (``"responses"``, see :mod:`.workerstream`): put straight
  into their requests' streams;
- model log records, and BLS calls (served on an executor thread, answered over the pipe);
- the end of the pipe: the worker died; the running batch fails, open streams end with an
  error.

Backpressure: once a stream holds :data:`~tritonfast.runtime.responses.STREAM_BUFFER`
responses its client has not taken, the loop stops reading the pipe; the worker's writes then
block when the pipe is full, and so do the model's sends. Reading resumes when that client
takes one or goes away. (A stream may hold one message's worth more than the bound: the
responses of a message are delivered together.) Once the model is unloading, the loop reads
on regardless, as Triton buffers: its requests must be able to finish. While reading is
paused, a worker that dies is noticed only once reading resumes (its client reads or goes
away).

The loop reads whatever the pipe holds in one system call and takes every whole message from
it (multiprocessing's framing: a 4-byte big-endian length, or -1 and an 8-byte one, then the
pickle), so a burst of messages costs one wake-up and one read.

Cancellation: while a batch runs or streams are open, the loop looks every
:data:`CANCEL_POLL_S` for requests whose clients went away: those of the running batch get
their byte in the cancellation segment raised, open streams are named to the worker
(``("cancel", token)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import struct
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from tritonfast.backends.python import workerbls, workerlog
from tritonfast.backends.python.workerstream import rebuild
from tritonfast.data.types import InferRequest
from tritonfast.errors import InternalError
from tritonfast.runtime.responses import STREAM_BUFFER, ResponseSender, ResponseStream
from tritonfast.runtime.responses import is_cancelled as request_cancelled

# How often the loop passes new cancellations on to the worker, while there are any to see.
CANCEL_POLL_S = 0.005
# The most one read of the pipe takes.
READ_BYTES = 1 << 20

log = logging.getLogger(__name__)

# Called with the worker's reply to a batch, or None when the worker died first.
OnReply = Callable[[tuple[Any, ...] | None], None]


def flag_cancelled(requests: list[InferRequest], flags: Any) -> None:
    """Raise the cancellation byte of each request of a batch whose caller went away."""
    for index, request in enumerate(requests):
        if request_cancelled(request):
            flags[index] = 1


# How long finalize waits for the loop to stop watching a pipe it is about to close.
UNWATCH_WAIT_S = 5.0


class LoopPipe:
    """Drives one worker from the event loop (see the module docstring). Create it on the
    loop; every method but :meth:`send`, :meth:`stop_holding_back` and :meth:`finalize` runs
    there. ``unbounded``: the model is unloading already (see :meth:`stop_holding_back`)."""

    def __init__(
        self,
        conn: Connection,
        loop: asyncio.AbstractEventLoop,
        instance_name: str,
        cancel_flags: Any,
        serve: Callable[[tuple[Any, ...], Callable[[tuple[Any, ...]], None]], None],
        *,
        unbounded: bool = False,
    ) -> None:
        self._conn = conn
        self._serve = serve  # answers the worker's calls to the server (off the loop)
        self._loop = loop
        self._fd = conn.fileno()
        self._instance_name = instance_name
        self._flags = cancel_flags  # the cancellation segment's bytes
        self._send_lock = threading.Lock()  # BLS answers are written from executor threads
        self._batch: tuple[list[InferRequest], OnReply] | None = None
        self._streams: dict[int, ResponseSender] = {}
        self._cancel_sent: set[int] = set()
        self._blocked_by: ResponseStream | None = None  # reading paused until it is read
        self._poll: asyncio.TimerHandle | None = None
        self._on_finalized: Callable[[], None] | None = None
        self._received = bytearray()  # read from the pipe, not yet taken as messages
        self._unbounded = unbounded  # unloading: no more pauses, the requests must finish
        self.closed = False  # the worker finalized or died: this pipe is done
        self._watch()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop that reads the pipe."""
        return self._loop

    def _watch(self) -> None:
        # uvloop makes the descriptor non-blocking; writes (and the connection's own reads,
        # once this pipe is done) expect whole messages, so it goes back to blocking, before
        # any thread writes again. Reads here only follow readiness, and take what is there.
        with self._send_lock:
            self._loop.add_reader(self._fd, self._readable)
            os.set_blocking(self._fd, True)

    # -- starting batches ---------------------------------------------------------------------
    def send(self, message: tuple[Any, ...]) -> None:
        """Write one message to the worker (from any thread)."""
        with self._send_lock:
            self._conn.send(message)

    def run(
        self,
        message: tuple[Any, ...],
        requests: list[InferRequest],
        on_reply: OnReply,
        senders: dict[int, ResponseSender] | None = None,
    ) -> None:
        """Start one batch (``message`` describes it); ``senders``: a decoupled batch's
        requests' senders by token. Raises OSError if the worker is gone (nothing of the batch
        is kept then)."""
        self.send(message)
        if senders:
            for token, sender in senders.items():
                self._streams[token] = sender
                sink = sender.sink
                if isinstance(sink, ResponseStream):
                    sink.on_taken(self._taken)
        self._batch = (requests, on_reply)
        self._arm_poll()

    def forget(self, tokens: list[int]) -> None:
        """Streams whose requests were rescheduled: their next batch brings them under new
        tokens (the responses go on to the same senders)."""
        for token in tokens:
            self._streams.pop(token, None)
            self._cancel_sent.discard(token)

    # -- what the worker sends ------------------------------------------------------------------
    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, READ_BYTES)
        except OSError:
            chunk = b""
        if not chunk:  # the worker's end closed: it died
            self.died()
            return
        self._received += chunk
        self._take_messages()

    def _take_messages(self) -> None:
        """Handle every whole message received, until reading pauses or the pipe is done."""
        received = self._received
        start = 0
        try:
            while self._blocked_by is None and not self.closed:
                left = len(received) - start
                if left < 4:
                    break
                (size,) = struct.unpack_from("!i", received, start)
                header = 4
                if size == -1:
                    if left < 12:
                        break
                    (size,) = struct.unpack_from("!Q", received, start + 4)
                    header = 12
                if left < header + size:
                    break
                body = start + header
                start = body + size
                try:
                    with memoryview(received) as view:  # released before the buffer is trimmed
                        message = pickle.loads(view[body:start])
                except Exception:  # the stream of messages is broken: as good as dead
                    log.exception(
                        "instance %s: unreadable message from its worker", self._instance_name
                    )
                    self.died()
                    return
                try:
                    self._dispatch(message)
                except Exception:  # handled once, badly, never twice
                    log.exception(
                        "instance %s: a message from its worker failed", self._instance_name
                    )
        finally:
            if start and not self.closed:
                del received[:start]

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "responses":
            self._forward(message[1])
        elif kind == "log":
            workerlog.emit(message)
        elif kind in workerbls.REQUESTS:  # the model calls another model: not on the loop
            self._loop.run_in_executor(None, self._serve, message, self.send)
        elif kind == "finalized":
            self._close()
            self._finalized()
        else:
            batch, self._batch = self._batch, None
            if batch is not None:
                batch[1](message)

    def _forward(self, responses: list[tuple[int, Any, bool]]) -> None:
        """Put a message's responses into their streams; pause reading behind a full one."""
        streams = self._streams
        full: ResponseStream | None = None
        for token, described, final in responses:
            sender = streams.get(token)
            if sender is None:  # its stream ended (cancelled, or the server stopped it)
                continue
            if final:
                del streams[token]
                self._cancel_sent.discard(token)
            sender.forward(rebuild(described) if described else None, final)
            sink = sender.sink
            if not final and isinstance(sink, ResponseStream) and sink.waiting >= STREAM_BUFFER:
                full = sink
        if full is not None and self._blocked_by is None and not (self.closed or self._unbounded):
            self._blocked_by = full
            self._loop.remove_reader(self._fd)
            self._arm_poll()  # a client that goes away instead of reading resumes it too

    def _taken(self) -> None:
        """A client took a response: read on if it was the one reading was paused for."""
        blocked = self._blocked_by
        if blocked is not None and blocked.waiting < STREAM_BUFFER:
            self._resume()

    def _resume(self) -> None:
        self._blocked_by = None
        if not self.closed:
            self._take_messages()  # those read before the pause first
            if self._blocked_by is None and not self.closed:
                self._watch()

    # -- cancellation -------------------------------------------------------------------------
    def _arm_poll(self) -> None:
        if self._poll is None and not self.closed and (self._batch or self._streams):
            self._poll = self._loop.call_later(CANCEL_POLL_S, self._check)

    def _check(self) -> None:
        self._poll = None
        batch = self._batch
        if batch is not None:
            flag_cancelled(batch[0], self._flags)
        gone = [
            token
            for token, sender in self._streams.items()
            if token not in self._cancel_sent and sender.is_cancelled()
        ]
        for token in gone:
            self._cancel_sent.add(token)
            with contextlib.suppress(OSError):  # a dead worker is noticed by the reader
                self.send(("cancel", token))
        blocked = self._blocked_by
        if blocked is not None and (blocked.cancelled or blocked.finished):
            self._resume()
        self._arm_poll()

    # -- the end ------------------------------------------------------------------------------
    def finalize(self, timeout: float) -> bool:
        """Off the loop: have the worker finalize its model and wait until it has (or died, or
        ``timeout`` passed). False when the loop cannot do it (not running): the caller then
        talks to the worker itself."""
        done = threading.Event()

        def start() -> None:
            self._on_finalized = done.set
            if self.closed:
                done.set()
                return
            self._read_regardless()
            try:
                self.send(("finalize",))
            except OSError:
                self.died()

        try:
            if not self._loop.is_running():
                return False
            self._loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop closed
            return False
        if not done.wait(timeout):
            # No answer: the caller ends the worker and closes the pipe, which must not stay
            # watched by the loop (its descriptor number will be reused).
            closed = threading.Event()

            def close() -> None:
                self._close()
                closed.set()

            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(close)
                # One turn of the loop, whatever time the caller had left: the caller closes
                # the descriptor next (bounded, should the loop itself be stuck).
                closed.wait(UNWATCH_WAIT_S)
        return True

    def busy(self) -> bool:
        """Whether the worker runs a batch or a decoupled request's responses are still to
        come (read from any thread: a moment's view)."""
        return self._batch is not None or bool(self._streams)

    def stop_holding_back(self) -> None:
        """From any thread: read on whatever the clients do (the model is unloading)."""
        with contextlib.suppress(RuntimeError):  # the loop closed
            self._loop.call_soon_threadsafe(self._read_regardless)

    def _read_regardless(self) -> None:
        self._unbounded = True
        if self._blocked_by is not None:
            self._resume()

    def died(self) -> None:
        """The worker is gone: end its open streams and batch with an error, stop watching."""
        self._close()
        streams, self._streams = self._streams, {}
        error = InternalError(
            f"the worker process of model instance '{self._instance_name}' exited before it"
            " sent the final response"
        )
        for sender in streams.values():
            sender.abandon(error)
        batch, self._batch = self._batch, None
        if batch is not None:
            batch[1](None)
        self._finalized()

    def _finalized(self) -> None:
        hook, self._on_finalized = self._on_finalized, None
        if hook is not None:
            hook()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._blocked_by is None:
            self._loop.remove_reader(self._fd)
            with contextlib.suppress(OSError):  # (already closed)
                os.set_blocking(self._fd, True)
        self._blocked_by = None
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
