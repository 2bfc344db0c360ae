"""The response stream: what one request yields, from the instance that runs it to the
frontend that writes it.

A request yields zero or more responses and then a final flag (Triton's
``TRITONSERVER_RESPONSE_COMPLETE_FINAL``); the final flag may come with the last response or
alone. Each response is an :class:`~tritonfast.data.types.InferResponse` or a
:class:`~tritonfast.errors.TritonError` (an error response; the stream goes on until final).

Two sides:

- :class:`ResponseStream`, the consumer, lives on the event loop: the frontend iterates it
  (``async for item in stream``) and writes each :class:`Streamed` item as it comes.
  A request whose caller awaits its single response has a plain future instead (the fast
  path); :func:`settle` hands a response to either.
- The producer is either the scheduler settling a whole batch of single-response requests at
  once, or a :class:`ResponseSender` that the model calls from any thread: a decoupled
  request's passes every response on; a single-response request's (made on demand by
  :func:`sender_of`) takes exactly one, with Triton's errors for anything else. Senders hand
  their responses to the loop through the loop's :class:`LoopMailbox`, so that one wake-up of
  the loop delivers every response sent since the last.

Backpressure: a decoupled request's sender lets at most :data:`STREAM_BUFFER` responses wait
for its consumer (sent but not yet taken from the stream); the next :meth:`ResponseSender.send`
blocks until the consumer (the client, through the frontend's writes) takes one, or goes
away. A slow reader therefore holds its model's sending thread, never unbounded memory.

Cancellation flows the other way: :meth:`ResponseStream.cancel` (the client went away) calls
the scheduler's hook, which drops a queued request (a running one sees its stream cancelled);
the producer sees it through :meth:`ResponseSender.is_cancelled` or :func:`is_cancelled`.
What is sent after that is dropped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import weakref
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import InternalError, TritonError

# One response: the outputs, or the error that takes their place.
Result = InferResponse | TritonError

# Triton's answers to sends a request's mode does not allow.
SENDER_CLOSED_MESSAGE = "Unable to send response. Response sender has been closed."
ONE_RESPONSE_MESSAGE = (
    "Unable to send response. Non-decoupled model cannot send more than one response."
)
FINAL_FIRST_MESSAGE = (
    "Unable to send response. Non-decoupled model cannot send complete final before sending a"
    " response."
)
# The error that ends a stream whose sender was dropped before it sent the final flag.
SENDER_DROPPED_MESSAGE = (
    "the model released the response sender of request '{id}' without sending the final flag"
)


# How many responses of a decoupled request may wait for its consumer before send() blocks.
STREAM_BUFFER = 16
# How often a blocked send() looks whether the consumer went away.
_CREDIT_POLL_S = 0.05

# Where a request's responses go: a ResponseStream, or the future of a single-response request.
Sink = Any


class Streamed(NamedTuple):
    """One item of a response stream: a response (None with a bare final flag) and whether
    it is the last."""

    result: Result | None
    final: bool


class ResponseStream:
    """The responses of one request, in the order they were sent; lives on the event loop.
    Iterating yields :class:`Streamed` items and stops after the final one."""

    __slots__ = (
        "_items",
        "_loop",
        "_on_cancel",
        "_on_first",
        "_on_taken",
        "_waiter",
        "cancelled",
        "finished",
    )

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Streamed] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._on_cancel: Callable[[], None] | None = None
        self._on_taken: Callable[[], None] | None = None
        self._on_first: Callable[[], None] | None = None
        self.finished = False  # the final item has been put
        self.cancelled = False  # the consumer went away before the final item

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """What :meth:`cancel` does besides dropping what comes next (set by the scheduler)."""
        self._on_cancel = hook

    def on_first(self, hook: Callable[[], None]) -> None:
        """Called (on the loop) when the first response or final flag arrives."""
        self._on_first = hook

    def on_taken(self, hook: Callable[[], None]) -> None:
        """Called each time the consumer takes a response (the producer's backpressure)."""
        self._on_taken = hook

    # -- the producer side (on the loop) ------------------------------------------------------
    def put(self, result: Result | None, final: bool) -> None:
        if self.finished or self.cancelled:
            return
        if self._on_first is not None:
            hook, self._on_first = self._on_first, None
            hook()
        self.finished = final
        self._items.append(Streamed(result, final))
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- the consumer side ------------------------------------------------------------------
    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> Streamed:
        items = self._items
        while not items:
            if self.finished or self.cancelled:
                raise StopAsyncIteration
            waiter = self._waiter = self._loop.create_future()
            await waiter
        item = items.popleft()
        if self._on_taken is not None and item.result is not None:
            self._on_taken()
        return item

    @property
    def waiting(self) -> int:
        """Items put and not yet taken by the consumer."""
        return len(self._items)

    def cancel(self) -> None:
        """The consumer is gone: drop what is still to come and tell the producer."""
        if self.finished or self.cancelled:
            return
        self.cancelled = True
        self._items.clear()
        hook, self._on_cancel = self._on_cancel, None
        if hook is not None:
            hook()


# How often a producer held back by a Room looks whether it should stop waiting.
ROOM_POLL_S = 0.05


class Room:
    """How far a stream's consumer (on the event loop) may fall behind a producer on another
    thread: the producer waits (:meth:`wait`) while ``full()``, until the consumer takes
    something (:meth:`freed`), ``over()`` says the stream is done, or the producer's ``stop``."""

    __slots__ = ("_freed", "_full", "_over")

    def __init__(self, full: Callable[[], bool], over: Callable[[], bool]) -> None:
        self._full = full
        self._over = over
        self._freed = threading.Event()

    def wait(self, stop: Callable[[], bool]) -> None:
        while self._full() and not self._over() and not stop():
            self._freed.clear()
            if self._full():
                self._freed.wait(ROOM_POLL_S)

    def freed(self) -> None:
        """From the consumer's side: it took something."""
        self._freed.set()


def stream_room(stream: ResponseStream) -> Room:
    """A :class:`Room` of :data:`STREAM_BUFFER` responses for ``stream``'s producer."""
    room = Room(
        lambda: stream.waiting >= STREAM_BUFFER, lambda: stream.cancelled or stream.finished
    )
    stream.on_taken(room.freed)
    return room


class LoopMailbox:
    """Runs callbacks posted from any thread on one event loop, in the order posted; one
    wake-up of the loop runs everything posted since the last."""

    __slots__ = ("_lock", "_loop", "_posted", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the loop's entry in _mailboxes goes with the loop (a server that stopped).
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._posted: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._scheduled = False

    def post(self, callback: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._posted.append((callback, args))
            if self._scheduled:
                return
            self._scheduled = True
        loop = self._loop()
        if loop is None:  # the server is gone, and so is whoever waited
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
            loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            posted, self._posted = self._posted, deque()
            self._scheduled = False
        for callback, args in posted:
            callback(*args)


# One mailbox per event loop (each server has its own loop), dropped with its loop.
_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMailbox] = (
    weakref.WeakKeyDictionary()
)
_mailboxes_lock = threading.Lock()


def mailbox_for(loop: asyncio.AbstractEventLoop) -> LoopMailbox:
    """The one mailbox of ``loop`` (made on first use)."""
    mailbox = _mailboxes.get(loop)
    if mailbox is None:
        with _mailboxes_lock:
            mailbox = _mailboxes.setdefault(loop, LoopMailbox(loop))
    return mailbox


def task_stream(
    loop: asyncio.AbstractEventLoop,
    request: InferRequest,
    answer: Callable[[ResponseStream], Coroutine[Any, Any, None]],
    running: set[asyncio.Task[Any]],
) -> ResponseStream:
    """A stream for ``request``, filled by the coroutine ``answer(stream)`` run as a task on
    ``loop`` (kept in ``running`` until it ends); cancelling the stream cancels the task. For
    schedulers that run a request as a coroutine of their own (ensembles, a Dynamo route)."""
    stream = ResponseStream(loop)
    request.sink = stream
    task = loop.create_task(answer(stream))
    running.add(task)
    task.add_done_callback(running.discard)

    def cancel() -> None:
        task.cancel()

    stream.on_cancel(cancel)
    return stream


def settle(sink: Sink, result: Result | None, final: bool) -> None:
    """Hand one response to ``sink``: a :class:`ResponseStream` or the future a
    single-response request awaits (on the loop), or the ``concurrent.futures.Future`` a caller
    on another thread waits on (from any thread). A future takes the response with the final
    flag."""
    if isinstance(sink, ResponseStream):
        sink.put(result, final)
    elif not sink.done() and result is not None:
        if isinstance(result, TritonError):
            sink.set_exception(result)
        else:
            sink.set_result(result)


class ResponseSender:
    """The producer's handle on one request's responses: :meth:`send` from any thread, the
    last time with ``final=True``.

    A decoupled request's sender passes every response on as it comes. A single-response
    request's sender (Triton allows models to answer through it too) accepts exactly one
    response, with the final flag or before it, and delivers it with the final flag."""

    __slots__ = (
        "__weakref__",
        "_closed",
        "_credit",
        "_deliver",
        "_held",
        "_lock",
        "_sent",
        "_sink",
        "decoupled",
        "request_id",
    )

    def __init__(
        self,
        sink: Sink,
        request_id: str,
        *,
        decoupled: bool,
        deliver: Callable[[Result | None, bool], None] | None = None,
    ) -> None:
        """``deliver(result, final)`` passes each response on; by default it is settled into
        ``sink`` on the sink's event loop (through the loop's mailbox)."""
        self._sink = sink
        if deliver is None:
            if isinstance(sink, concurrent.futures.Future):
                # A caller waiting on another thread (runtime.handle): set from here.
                deliver = functools.partial(settle, sink)
            else:
                deliver = functools.partial(mailbox_for(sink.get_loop()).post, settle, sink)
        self._deliver = deliver
        # Responses the consumer may still be sent before it takes one (see STREAM_BUFFER).
        self._credit: threading.Semaphore | None = None
        if decoupled and isinstance(sink, ResponseStream):
            self._credit = threading.Semaphore(STREAM_BUFFER)
            sink.on_taken(self._credit.release)
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0
        self._held: Result | None = None  # a single-response request's response, until final
        self.decoupled = decoupled
        self.request_id = request_id

    def send(self, result: Result | None = None, final: bool = False) -> None:
        """Send one response (or, with ``result`` None, only the final flag). Raises
        :class:`~tritonfast.errors.InternalError` with Triton's message for a send the
        request's mode does not allow. Blocks while :data:`STREAM_BUFFER` responses wait for
        the consumer."""
        credit = self._credit
        if credit is not None and result is not None:
            while not credit.acquire(timeout=_CREDIT_POLL_S):
                if self.is_cancelled():
                    break  # what is sent now is dropped
        with self._lock:
            if self._closed:
                raise InternalError(SENDER_CLOSED_MESSAGE)
            if not self.decoupled:
                if result is not None and self._sent:
                    raise InternalError(ONE_RESPONSE_MESSAGE)
                if result is None and final and not self._sent:
                    raise InternalError(FINAL_FIRST_MESSAGE)
            if result is not None:
                self._sent += 1
            self._closed = final
            if not self.decoupled:
                if not final:
                    self._held = result
                    return
                result = self._held if result is None else result
                self._held = None
            elif result is None and not final:
                return
        self._deliver(result, final)

    def deliver_held(self) -> bool:
        """A single-response request whose model sent its response without the final flag and
        then failed: the response goes out now, with the final flag (Triton sent it when the
        model did, so the failure no longer reaches the client). True if there was one."""
        with self._lock:
            held = self._held
            if self._closed or held is None:
                return False
            self._held = None
            self._closed = True
        self._deliver(held, True)
        return True

    def forward(self, result: Result | None, final: bool) -> None:
        """On the sink's event loop: pass on a response that a sender elsewhere (a worker's)
        already checked against the rules, without waiting for credit (the caller applies
        backpressure of its own). Dropped once the final flag went."""
        with self._lock:
            if self._closed:
                return
            self._closed = final
        settle(self._sink, result, final)

    @property
    def sink(self) -> Sink:
        """Where the responses go."""
        return self._sink

    @property
    def closed(self) -> bool:
        """Whether the final flag was sent."""
        return self._closed

    def is_cancelled(self) -> bool:
        """Whether the consumer went away (what is sent from now on is dropped)."""
        sink = self._sink
        return sink.cancelled if isinstance(sink, ResponseStream) else sink.cancelled()

    def abandon(self, error: TritonError) -> None:
        """End the request with ``error`` unless the final flag was sent already."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._held = None
        self._deliver(error, True)

    def __del__(self) -> None:
        if not self._closed:  # never leave the consumer waiting for a final flag
            self.abandon(InternalError(SENDER_DROPPED_MESSAGE.format(id=self.request_id)))


def sender_of(request: InferRequest) -> ResponseSender:
    """``request``'s sender, made on first use for a single-response request."""
    sender = request.sender
    if sender is None:
        sender = request.sender = ResponseSender(request.sink, request.id, decoupled=False)
    return sender


def is_cancelled(request: InferRequest) -> bool:
    """Whether ``request``'s caller went away (its responses are dropped from now on)."""
    if request.cancelled:
        return True
    sink = request.sink
    if sink is None:
        return False
    return sink.cancelled if isinstance(sink, ResponseStream) else sink.cancelled()
