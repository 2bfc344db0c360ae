"""A gRPC server on grpcio's core, without grpc.aio's per-call machinery.

Why: grpc.aio runs several Python tasks, futures and checks for every call; on 2 vCPUs
that is ~0.2-0.4 ms of CPU per RPC before a handler runs, and a bare grpc.aio echo server
tops out at about half of what the same echo does on grpcio's core.
This module drives the core directly (``grpc._cython.cygrpc``, the layer grpcio's own
synchronous server is built on) and keeps everything else asyncio: handlers are the same
``async def Method(request, context)`` coroutines and async generators grpc.aio calls.

How a call flows:

- One thread waits on the completion queue with the GIL released and handles each event;
  while it waits, grpcio's core reads the connections on it (as :mod:`.transport` starts grpcio).
  A message of many MiB takes that thread tens of milliseconds to read and copy, during which
  no other call would move; so once one has come in, a second thread polls the same queue
  until they stop coming (:class:`_Helper`). Only then: two threads taking the GIL in turn
  for small calls cost about a tenth of the throughput.
- A new call: its close (``RECV_CLOSE_ON_SERVER``, which reports cancellation and deadline
  expiry) and, for a unary request, its one message are asked for at once.
- When the request is in, the handler starts on the event loop (one ``call_soon_threadsafe``
  per call); a unary reply leaves in one batch (initial metadata, message, status) from the
  loop, and its completion needs nothing more. A unary call the core answers whole
  (``Method.whole``: ``ModelInfer`` to a model on a lane) skips the loop: its small message
  is handed to the core right here, and the core's driver thread sends the reply or hands
  it back to this thread (:mod:`.corepath`).
- A cancelled call cancels its handler's task. Streams read one message at a time, each step
  an awaited batch. A streaming reply's messages are queued by the loop (or by another
  thread: the core's reader threads queue a decoupled model's responses themselves) and sent
  one after another, each started as the previous one completes by a thread of its own
  (:class:`StreamWriter`, :class:`_Sender`): neither the loop nor the completion-queue thread
  waits for each send or does its transport work.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc._cython import cygrpc

from tritonfast._core import CallReplies
from tritonfast.memory.bodybudget import COUNTED_BYTES, BodyBudget

log = logging.getLogger("tritonfast.grpc")

_NO_FLAGS = 0
_BUFFER_HINT = cygrpc.WriteFlag.buffer_hint
_OK = cygrpc.StatusCode.ok
_QUEUE_TIMEOUT = cygrpc.CompletionType.queue_timeout
_QUEUE_SHUTDOWN = cygrpc.CompletionType.queue_shutdown
# Calls asked for ahead of time, so that a burst of new calls never waits for us.
_CALLS_AHEAD = 64
# How long a stopping server goes on refusing new calls on open connections before it shuts
# down (see CoreServer.stop).
DRAIN_GRACE_S = 0.5
# Messages of one streaming reply that may wait to be sent before its handler waits for room.
_STREAM_AHEAD = 16
# A request message this large starts the second polling thread (see _Helper). A 64 MiB message
# holds the thread that reads it about 45 ms on 2 vCPUs, mostly page faults of fresh buffers;
# a 4 MiB one about 3 ms, which one thread absorbs better than two contend.
LARGE_MESSAGE = 16 << 20
# The second thread stops after this long without a large message ...
HELPER_IDLE_S = 2.0
# ... checked this often while it waits on the queue.
_HELPER_TICK_S = 0.25


class _Abort(Exception):
    """Raised by ``context.abort``: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


@dataclass(frozen=True)
class Method:
    """What a method's path runs: grpc's own ``RpcMethodHandler`` fields."""

    request_streaming: bool
    response_streaming: bool
    handler: Callable[..., Any]
    deserialize: Callable[[bytes], Any] | None
    serialize: Callable[[Any], bytes] | None
    # For a unary method the core may answer whole (ModelInfer): given the call and its
    # request, hands it to the core and returns True, or returns False (the handler runs).
    # Called on the completion-queue thread (the only one polling) for a message below the
    # body budget's threshold, else on the loop.
    whole: Callable[[_Call, bytes], bool] | None = None

    @classmethod
    def of(cls, handler: grpc.RpcMethodHandler) -> Method:
        function = (
            handler.unary_unary
            or handler.unary_stream
            or handler.stream_unary
            or handler.stream_stream
        )
        return cls(
            handler.request_streaming,
            handler.response_streaming,
            function,
            handler.request_deserializer,
            handler.response_serializer,
        )


class Context:
    """The part of ``grpc.aio.ServicerContext`` our handlers use; a streaming reply's also
    has its :class:`StreamWriter` (``writer``), which threads may write to directly."""

    __slots__ = ("_call", "_metadata", "writer")

    def __init__(self, call: _Call, metadata: tuple[tuple[str, Any], ...]) -> None:
        self._call = call
        self._metadata = metadata
        self.writer: StreamWriter | None = None

    def add_done_callback(self, callback: Callable[[Context], None]) -> None:
        """Call ``callback(context)`` on the event loop once the RPC is over (finished or
        cancelled)."""
        call = self._call
        if call.done_callbacks is None:
            call.done_callbacks = []
        call.done_callbacks.append(lambda: callback(self))

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Abort(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata


def _status_op(code: Any, details: str) -> cygrpc.SendStatusFromServerOperation:
    return cygrpc.SendStatusFromServerOperation(None, code, details, _NO_FLAGS)


def _ignore(event: Any) -> None:
    """The tag of batches whose completion needs nothing (a unary reply, a status)."""


class _Call:
    """One RPC: lives from its arrival until its handler is done or it is cancelled."""

    __slots__ = (
        "budgeted",
        "call",
        "cancelled",
        "core_ticket",
        "counted",
        "done_callbacks",
        "metadata",
        "metadata_sent",
        "method",
        "payload",
        "server",
        "task",
    )

    def __init__(self, server: CoreServer, call: Any, method: Method, metadata: Any) -> None:
        self.server = server
        self.call = call
        self.method = method
        self.metadata = metadata
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False
        self.metadata_sent = False
        self.payload: bytes | None = None
        self.done_callbacks: list[Callable[[], None]] | None = None  # made on first use
        # One entry while the call counts among the server's unary calls in progress: the
        # thread that pops it (one step under the GIL) ends the count, whichever comes first.
        self.counted: list[None] = []
        self.budgeted = 0  # bytes of its request counted against the body budget
        # (lane, ticket) while the core answers the call whole (Method.whole).
        self.core_ticket: tuple[Any, Any] | None = None

    # -- on the completion-queue thread ------------------------------------------------------
    def on_close(self, event: Any) -> None:
        if event.batch_operations[0].cancelled():
            self.server.call_soon(self.cancel)

    def on_first_message(self, event: Any) -> None:
        data = event.batch_operations[0].message()
        if data is not None and len(data) >= LARGE_MESSAGE:
            self.server.helper.wanted()
        if data is not None and len(data) >= COUNTED_BYTES:
            if not self.server.body_budget.take(len(data)):
                self.call.start_server_batch(
                    (
                        cygrpc.SendInitialMetadataOperation(None, _NO_FLAGS),
                        _status_op(
                            cygrpc.StatusCode.unavailable,
                            self.server.body_budget.refusal(len(data)).message,
                        ),
                    ),
                    _ignore,
                )
                self.server.call_soon(self.over)
                return
            self.budgeted = len(data)
        if data is None:
            return  # the call was cancelled before its request arrived (on_close saw it)
        whole = self.method.whole
        tried = False
        if (
            whole is not None
            and not self.budgeted
            and not self.cancelled
            and self.server.helper.idle()
        ):
            if whole(self, data):
                return  # the core has it: no loop wake-up for the call to start
            tried = True
        # (On the loop the core is asked, unless it refused here already.)
        self.server.call_soon(self.start, data, tried)

    # -- on the event loop -------------------------------------------------------------------
    def start(self, data: bytes | None, tried_whole: bool = False) -> None:
        if self.cancelled:
            # Its cancellation may have been handled first, on the other polling thread,
            # before its message counted against the budget: give that back too.
            self.over()
            return
        whole = self.method.whole
        if not tried_whole and whole is not None and data is not None and whole(self, data):
            return
        self.task = self.server.loop.create_task(self.run(data))

    def cancel(self) -> None:
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()
        if self.core_ticket is not None:
            lane, ticket = self.core_ticket
            self.core_ticket = None
            if lane.cancel(ticket):  # taken out before it ran: the core will not answer it
                self.server.add_running(-1)
        self.over()

    def over(self) -> None:
        """The RPC is over: run its done callbacks, once. On the loop; for a call the core
        answered whole (no handler, no done callbacks, no budgeted bytes), on the driver
        thread that answered it."""
        if self.budgeted:
            self.server.body_budget.give(self.budgeted)
            self.budgeted = 0
        if self.counted:
            self.server.unary_over(self)
        callbacks, self.done_callbacks = self.done_callbacks, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:
                log.exception("a done callback of %s failed", self.method.handler)

    async def run(self, data: bytes | None) -> None:
        method = self.method
        context = Context(self, self.metadata)
        if method.response_streaming:
            context.writer = StreamWriter(self)
        # Counted from the task's first step: a task cancelled before it never runs this.
        self.server.add_running(1)
        try:
            if method.request_streaming:
                request: Any = _Requests(self)
            else:
                assert data is not None  # a unary call starts once its message is in
                request = method.deserialize(data) if method.deserialize else data
            if context.writer is not None:
                await self._stream_replies(method.handler(request, context), context.writer)
                self.finish(_OK, "")
            else:
                reply = await method.handler(request, context)
                payload = method.serialize(reply) if method.serialize else reply
                self.reply(payload)
        except _Abort as abort:
            self.finish(abort.code.value[0], abort.details)
        except asyncio.CancelledError:
            if not self.cancelled:  # the server is stopping, not the client
                self.finish(cygrpc.StatusCode.cancelled, "the server is shutting down")
            raise
        except Exception as error:
            log.exception("unexpected error in the gRPC handler of %s", self.method.handler)
            self.finish(cygrpc.StatusCode.unknown, f"Unexpected {type(error)}: {error}")
        finally:
            self.server.add_running(-1)
            self.over()

    async def _stream_replies(self, replies: Any, writer: StreamWriter) -> None:
        if not hasattr(replies, "__aiter__"):  # a coroutine that answers with abort()
            await replies
            return
        serialize = self.method.serialize
        async for reply in replies:
            room = writer.write(serialize(reply) if serialize else reply)
            if room is not None:
                await room
        await writer.drained()

    def reply(self, payload: bytes) -> None:
        """Send a unary reply: from the completion-queue thread, bounced there through an
        empty batch (which completes at once). The transport work of a send runs on the
        thread that starts it; on that thread it costs half what it costs on the loop, which
        would also contend with the completion-queue thread for the call. A lone call's
        reply (no other handler running) is sent from the loop: there the bounce would only
        add a thread switch to its latency (measured at gRPC c=1: 2057 req/s from the loop
        against 1900 with the bounce)."""
        self.metadata_sent = True
        self.payload = payload
        if self.server.running > 1:
            self.call.start_server_batch((), self.send_reply)
        else:
            self.send_reply(None)

    def send_reply(self, event: Any) -> None:  # on the completion-queue thread
        payload, self.payload = self.payload, None
        self.call.start_server_batch(
            (
                cygrpc.SendInitialMetadataOperation(None, _NO_FLAGS),
                cygrpc.SendMessageOperation(payload, _NO_FLAGS),
                _status_op(_OK, ""),
            ),
            _ignore,
        )

    def finish(self, code: Any, details: str) -> None:
        if self.cancelled:
            return  # the core has ended the call already
        status = _status_op(code, details)
        if self.metadata_sent:
            operations: tuple[Any, ...] = (status,)
        else:
            self.metadata_sent = True
            operations = (cygrpc.SendInitialMetadataOperation(None, _NO_FLAGS), status)
        self.call.start_server_batch(operations, _ignore)

    def batch(self, operations: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Start ``operations``; the future gets the completion event (on the loop)."""
        future = self.server.loop.create_future()
        server = self.server

        def completed(event: Any) -> None:  # on the completion-queue thread
            server.call_soon(_resolve, future, event)

        self.call.start_server_batch(operations, completed)
        return future


class StreamWriter:
    """Sends a streaming call's messages in order, each started as the previous one
    completes (grpc allows one send in flight per call; see :class:`_Sender`). The messages wait
    in :attr:`queue` (the core's ``CallReplies``), where the core's reader threads queue a
    decoupled model's replies without the GIL, and where :meth:`send` queues those of any
    other thread (the loop's, among others). Whoever queues a message on an idle call starts
    the sending (:meth:`kick`). A message with more queued behind it goes with grpc's buffer
    hint: grpc may hold it until the next one, so a burst leaves in a few large writes, not
    one write (and one wake-up of the client) each; the last one queued goes without, which
    sends it and everything held. :meth:`write` hands the loop a future to wait on when
    :data:`_STREAM_AHEAD` are queued, resolved once half of them are sent; other threads
    wait while the queue is :meth:`full` (told through :meth:`hold_with`; the core's reader
    threads wait in the queue itself)."""

    __slots__ = ("_call", "_freed", "_idle", "_lock", "_room", "queue")

    def __init__(self, call: _Call) -> None:
        self._call = call
        self.queue = CallReplies(_STREAM_AHEAD)
        # Guards the loop's futures against the completion-queue thread's sends.
        self._lock = threading.Lock()
        self._room: asyncio.Future[Any] | None = None
        self._idle: asyncio.Future[Any] | None = None
        # Set when the queue is down to half after being full, for threads held by ``room``.
        self._freed: Callable[[], None] | None = None

    def over(self) -> bool:
        """Whether nothing more will be sent (a send failed, or the client went away)."""
        return self.queue.over or self._call.cancelled

    def full(self) -> bool:
        return self.queue.full()

    def hold_with(self, freed: Callable[[], None]) -> None:
        """``freed()`` is called (on the completion-queue thread) whenever a full queue is
        down to half: the signal of the room that holds the threads that :meth:`send`."""
        self._freed = freed

    def send(self, payload: bytes) -> bool:
        """Queue ``payload`` from any thread; False when the call is over (dropped)."""
        if self._call.cancelled:
            return False
        idle = self.queue.push(payload)
        if idle is None:
            return False
        if idle:
            self.kick()
        return True

    def kick(self) -> None:
        """Start sending: whoever queued a message on an idle call calls this (once). The
        first message goes without the buffer hint, whatever follows it: it leaves at once
        (a stream's first response, say), not with the next one."""
        taken = self.queue.next()
        if taken is not None:
            self.start(taken[0], _NO_FLAGS)

    def start(self, payload: bytes, flags: int) -> None:
        """Start one send (the kicking thread's, or the sender thread's)."""
        call = self._call
        message = cygrpc.SendMessageOperation(payload, flags)
        try:
            if call.metadata_sent:
                call.call.start_server_batch((message,), self._sent)
            else:
                call.metadata_sent = True
                operations = (cygrpc.SendInitialMetadataOperation(None, _NO_FLAGS), message)
                call.call.start_server_batch(operations, self._sent)
        except Exception:  # (the call is gone): nothing more is sent
            log.debug("a stream's send could not start", exc_info=True)
            self._next(sent=False)

    def write(self, payload: bytes) -> asyncio.Future[Any] | None:  # on the loop
        """Queue ``payload``; a future to wait on when the queue is full (see wait_room)."""
        self.send(payload)
        return self.wait_room()

    def wait_room(self) -> asyncio.Future[Any] | None:  # on the loop
        """A future resolved once a full queue is down to half; None when it is not full."""
        with self._lock:
            if self.queue.over or not self.queue.full():
                return None
            if self._room is None:
                self._room = self._call.server.loop.create_future()
            return self._room

    async def drained(self) -> None:
        """Wait until every queued message is sent (or the call ended)."""
        with self._lock:
            if not self.queue.sending or self.queue.over:
                return
            self._idle = self._call.server.loop.create_future()
        await self._idle

    def _sent(self, event: Any) -> None:  # on the completion-queue thread
        self._next(event.success)

    def _next(self, sent: bool) -> None:
        """A send completed (``sent``: it went): the next one goes to the sender thread."""
        wake = []
        freed = None
        queue = self.queue
        with self._lock:
            if not sent:
                queue.end()
                taken = None
            else:
                taken = queue.next()
            left = 0 if taken is None else taken[1]
            half = taken is None or left <= _STREAM_AHEAD // 2
            if self._room is not None and half:
                wake.append(self._room)
                self._room = None
            # (Once per drain: the queue shrinks by one per send.)
            if taken is None or left == _STREAM_AHEAD // 2:
                freed = self._freed
            if taken is None and self._idle is not None:
                wake.append(self._idle)
                self._idle = None
        for future in wake:
            self._call.server.call_soon(_resolve, future, None)
        if freed is not None:
            freed()
        if taken is not None:
            self._call.server.sender.put(self, taken[0], _BUFFER_HINT if left else _NO_FLAGS)


class _Sender:
    """The thread that starts a streaming call's sends after the first (see
    :meth:`StreamWriter._sent`). grpc's core does a send's transport work (framing, the
    socket's write, and whatever else the connection has queued meanwhile) on the thread that
    starts it; on the completion-queue thread, under a stream of replies, that kept the
    arrival of every other message waiting (a new request's first response under full load:
    2.2 to 2.6 ms with the sends started there, 0.5 to 0.7 ms from here, at two thirds of the
    responses a second). Started with the first such send, stopped with the server."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[StreamWriter, bytes, int] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def put(self, writer: StreamWriter, payload: bytes, flags: int) -> None:
        self._queue.put((writer, payload, flags))
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stopped:
                    self._thread = threading.Thread(target=self._run, name="grpc-send", daemon=True)
                    self._thread.start()

    def stop(self) -> None:
        """Ends the thread once what is queued is started."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _run(self) -> None:
        get = self._queue.get
        while (item := get()) is not None:
            writer, payload, flags = item
            writer.start(payload, flags)


def _resolve(future: asyncio.Future[Any], event: Any) -> None:
    if not future.done():
        future.set_result(event)


def _cancel(future: asyncio.Future[Any]) -> None:
    future.cancel()


class _Requests:
    """A streaming call's requests, read one message at a time. The handler may set
    :attr:`take`: a function the completion-queue thread offers each message to as it
    arrives; a message it takes (True) never reaches the loop, and the next one is asked for
    from that thread at once, so that a request the core can take leaves without a turn of
    the event loop."""

    __slots__ = ("_call", "take")

    def __init__(self, call: _Call) -> None:
        self._call = call
        self.take: Callable[[bytes], bool] | None = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    def _receive(self) -> asyncio.Future[Any]:
        """The next message's completion event that :attr:`take` did not take."""
        call = self._call
        future = call.server.loop.create_future()
        receive = (cygrpc.ReceiveMessageOperation(_NO_FLAGS),)

        def completed(event: Any) -> None:  # on the completion-queue thread
            take = self.take
            data = event.batch_operations[0].message()
            if take is not None and data is not None and take(data):
                try:
                    call.call.start_server_batch(receive, completed)
                except Exception:  # the call is over: so is the reading (its task ends)
                    call.server.call_soon(_cancel, future)
                return
            call.server.call_soon(_resolve, future, event)

        call.call.start_server_batch(receive, completed)
        return future

    async def __anext__(self) -> Any:
        event = await self._receive()
        data = event.batch_operations[0].message()
        if data is None:
            raise StopAsyncIteration
        if len(data) >= LARGE_MESSAGE:
            self._call.server.helper.wanted()
        deserialize = self._call.method.deserialize
        return deserialize(data) if deserialize else data


class _Helper:
    """A second thread on the completion queue, running while large messages come in.

    grpcio's core reads a connection on whichever thread polls the queue when its data
    arrives; with one thread, the calls of every other connection wait while it reads (and
    cygrpc copies) a large message. Started by the first large message, stopped
    :data:`HELPER_IDLE_S` after the last one."""

    def __init__(self, server: CoreServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._until = 0.0

    def wanted(self) -> None:  # on a completion-queue thread, or the loop (streams)
        with self._lock:
            self._until = time.monotonic() + HELPER_IDLE_S
            if self._thread is None and not self._server.stopping:
                self._thread = threading.Thread(target=self._run, name="grpc-core-2", daemon=True)
                self._thread.start()

    def idle(self) -> bool:
        """Whether it is not polling: the completion-queue thread is the only one."""
        return self._thread is None

    def join(self) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while self._server.poll_once(time.time() + _HELPER_TICK_S):
            with self._lock:
                if time.monotonic() >= self._until:
                    self._thread = None
                    return


class CoreServer:
    """Serves ``methods`` (path -> :class:`Method`) on the event loop ``loop``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        methods: Mapping[str, Method],
        options: list[tuple[str, Any]],
        body_budget: BodyBudget,
        refused_while_draining: Mapping[str, str] | None = None,
    ) -> None:
        """``refused_while_draining``: the paths of the calls refused with ``UNAVAILABLE`` once
        the server drains (see :meth:`stop`), each with its words; the others are served."""
        self.loop = loop
        self.body_budget = body_budget  # what large request messages count against
        self._methods = {path.encode(): method for path, method in methods.items()}
        self._refused = {
            path.encode(): text for path, text in (refused_while_draining or {}).items()
        }
        self._queue = cygrpc.CompletionQueue()
        self._server = cygrpc.Server(tuple(options), False)
        self._server.register_completion_queue(self._queue)
        self._thread = threading.Thread(target=self._serve, name="grpc-core", daemon=True)
        self.helper = _Helper(self)
        self.sender = _Sender()
        self.stopping = False
        self._stopped: asyncio.Future[None] = loop.create_future()
        # Draining (see stop): new calls are refused while the unary calls received finish.
        self._refusing = False
        # One entry per unary call received and not over (a deque, as _running below).
        self._unary_live: collections.deque[None] = collections.deque()
        self._unary_idle: asyncio.Future[None] | None = None
        # Handlers started and calls handed to the core, not yet finished, one entry each:
        # counted on the loop, on the completion-queue thread (which hands small unary calls
        # to the core as their message arrives, Method.whole) and on the core's driver
        # threads (which end them), read anywhere. A deque's append and pop are each one step
        # under the GIL; with a lock, a thread the GIL passed to while another held the lock
        # would wait for the GIL to come back to it.
        self._running: collections.deque[None] = collections.deque()

    def add_insecure_port(self, address: str) -> int:
        return int(self._server.add_http2_port(address.encode()))

    def add_secure_port(self, address: str, credentials: Any) -> int:
        """Listen on ``address`` with TLS (``credentials``: ``grpc.ssl_server_credentials``)."""
        return int(self._server.add_http2_port(address.encode(), credentials._credentials))

    def start(self) -> None:
        self._server.start()
        for _ in range(_CALLS_AHEAD):
            self._request_call()
        self._thread.start()

    async def stop(self, grace: float | None) -> None:
        """Drain, then stop: calls that arrive from now on, on connections already open, are
        refused with ``UNAVAILABLE`` (those named to refuse, see the constructor), while every
        unary call already received is answered;
        then the server shuts down (no new connections), giving streams what is left of
        ``grace`` seconds before cancelling them."""
        started = self.loop.time()
        if not self._refusing:
            self._refusing = True
            if self._unary_live:
                idle = self._unary_idle = self.loop.create_future()
                if not self._unary_live:  # the last one ended before it could see the future
                    _resolve(idle, None)
            # Calls already on their way are refused cleanly rather than killed by the
            # shutdown: refusing goes on for DRAIN_GRACE_S at least.
            grace_over = asyncio.ensure_future(asyncio.sleep(DRAIN_GRACE_S))
            waits = [grace_over] if self._unary_idle is None else [grace_over, self._unary_idle]
            with contextlib.suppress(asyncio.TimeoutError):  # (TimeoutError from 3.11)
                await asyncio.wait_for(asyncio.shield(asyncio.gather(*waits)), grace)
        if grace is not None:
            grace = max(0.0, grace - (self.loop.time() - started))
        if not self.stopping:
            self.stopping = True
            self._server.shutdown(self._queue, self._on_shutdown)
        try:
            await asyncio.wait_for(asyncio.shield(self._stopped), grace)
        except asyncio.TimeoutError:
            self._server.cancel_all_calls()
            await self._stopped
        await asyncio.to_thread(self._thread.join)
        await asyncio.to_thread(self.helper.join)
        await asyncio.to_thread(self.sender.stop)
        self._server.destroy()

    def unary_over(self, call: _Call) -> None:
        """Unary call ``call`` ended (once, whichever thread asks first): the drain waits for
        the last one."""
        try:
            call.counted.pop()
        except IndexError:  # another thread ended it first
            return
        self._unary_live.pop()
        idle = self._unary_idle
        if idle is not None and not self._unary_live:
            self.call_soon(_resolve, idle, None)

    @property
    def running(self) -> int:
        return len(self._running)

    def add_running(self, delta: int) -> None:
        """One call more (``delta`` 1) or less (-1) running."""
        if delta > 0:
            self._running.append(None)
            return
        # (Not contextlib.suppress: its with-statement costs more than the pop, on every call.)
        try:  # noqa: SIM105
            self._running.pop()
        except IndexError:  # (never counted: nothing to take back)
            pass

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback`` on the event loop (from the completion-queue thread)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: the process is exiting
            self.loop.call_soon_threadsafe(callback, *args)

    # -- the completion-queue thread ----------------------------------------------------------
    def _request_call(self) -> None:
        self._server.request_call(self._queue, self._queue, self._on_new_call)

    def _serve(self) -> None:
        while self.poll_once(None):
            pass

    def poll_once(self, deadline: float | None) -> bool:
        """Wait for one event until ``deadline`` (``time.time()``; None: no end) and handle
        it; False once the queue is shut down."""
        event = self._queue.poll(deadline)
        kind = event.completion_type
        if kind is _QUEUE_SHUTDOWN:
            return False
        if kind is not _QUEUE_TIMEOUT:
            event.tag(event)
        return True

    def _on_new_call(self, event: Any) -> None:
        if not event.success:  # the server is shutting down
            return
        if not self.stopping:
            self._request_call()
        call = event.call
        method = self._methods.get(event.call_details.method)
        if method is None:
            call.start_server_batch(
                (
                    cygrpc.SendInitialMetadataOperation(None, _NO_FLAGS),
                    _status_op(cygrpc.StatusCode.unimplemented, "Method not found!"),
                ),
                _ignore,
            )
            return
        refusal = self._refused.get(event.call_details.method) if self._refusing else None
        if refusal is not None:
            call.start_server_batch(
                (
                    cygrpc.SendInitialMetadataOperation(None, _NO_FLAGS),
                    _status_op(cygrpc.StatusCode.unavailable, refusal),
                ),
                _ignore,
            )
            return
        rpc = _Call(self, call, method, event.invocation_metadata)
        if not method.request_streaming:
            rpc.counted.append(None)
            self._unary_live.append(None)
        call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(_NO_FLAGS),), rpc.on_close)
        if method.request_streaming:
            self.call_soon(rpc.start, None)
        else:
            call.start_server_batch(
                (cygrpc.ReceiveMessageOperation(_NO_FLAGS),), rpc.on_first_message
            )

    def _on_shutdown(self, event: Any) -> None:
        """Every call is over: close the queue (the thread ends) and tell ``stop``."""
        self._queue.shutdown()
        self.call_soon(_resolve, self._stopped, None)
