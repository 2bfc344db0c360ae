"""HTTP/1.1 connections served on aiohttp's request parser, without aiohttp's web server.

aiohttp's low-level ``web.Server`` spends more CPU on each request (request and response
objects, a payload writer, several writes per answer) than everything else our frontend and
an in-process model do together: on 2 vCPUs, the load generator on the same cores, a bare
``web.Server`` answering a fixed body manages 8-13k requests a second at concurrency 16, while
the same loop feeding aiohttp's C parser from a protocol of its own and writing each answer in
one call manages 18-30k. So each connection here is an asyncio protocol that feeds aiohttp's
parser (``aiohttp.http.HttpRequestParser``, the llhttp-based one aiohttp's own server uses)
and writes :class:`~tritonfast.frontends.http.answer.Answer` objects straight to the
transport.

What the protocol keeps of HTTP/1.1:
- requests on one connection are answered in the order they came (pipelining), one at a
  time; a client sending far ahead is paused;
- keep-alive as the request asks (HTTP/1.0 and ``Connection: close`` close after the answer);
  a keep-alive connection quiet for :data:`IDLE_TIMEOUT_S` is closed;
  a connection whose request body was not read to its end is closed after the answer;
- ``Expect: 100-continue`` gets ``100 Continue`` when the handler starts;
- a message the parser rejects gets ``400 Bad Request`` and the connection is closed;
- a client that disconnects cancels its handler, so a queued inference request is dropped;
- large bodies are written part by part, waiting while the socket's buffer is full;
- a large request body with a ``Content-Length`` is received straight into one pooled buffer
  (:class:`DirectBody`): the kernel copies it there, with no bytes objects in between.

An inference request to a model the core drives whole is handed to the core
(:mod:`.corepath`) instead of a handler task: the core writes its answer on the connection's
stream and names it in the server's completions, whose descriptor the loop watches; the
connection then serves its next request.

Where it can, a connection hands its answers to the core's writer thread
(:class:`tritonfast._core.Outbox`) instead of writing them on the event loop: a ``send`` on
loopback costs the loop thread about a fifth of its time at concurrency 16, and the writer
does it on the other core, without the GIL. A lone request's answer (no other being served)
is sent by the loop itself, which has nothing else to do. Large answers still go through the
transport (no extra copy, flow control by ``drain``). Bytes are kept in order by taking one
way only while the other has nothing left to send.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp.http import HttpProcessingError, HttpRequestParser

from tritonfast._core import Outbox, OutStream
from tritonfast.errors import TritonError
from tritonfast.frontends.http.answer import Answer, chunk, head, json_answer
from tritonfast.frontends.http.request import (
    DIRECT_BODY_BYTES,
    DIRECT_READ_BYTES,
    MAX_BODY_BYTES,
    DirectBody,
    Request,
)
from tritonfast.memory.bodybudget import BodyBudget

if TYPE_CHECKING:
    from tritonfast.frontends.http.corepath import CorePath
    from tritonfast.runtime.lane import CoreLane

log = logging.getLogger("tritonfast.http")

# Bytes of a request body buffered before the socket stops being read (aiohttp's default).
READ_LIMIT = 1 << 16
# Bytes asked of the socket at a time (the size of uvloop's own receive buffer). At most
# DIRECT_BODY_BYTES, so that a direct body always has bytes left to receive past its head.
READ_BYTES = 1 << 18
assert READ_BYTES <= DIRECT_BODY_BYTES
# Bodies under this size are joined with their head and written in one call.
JOIN_BYTES = 1 << 16
# Bytes the writer thread may hold unsent for one connection before its next answer waits.
MAX_UNSENT = 1 << 20
# Pipelined requests waiting on one connection before it stops being read.
MAX_WAITING = 16
# At shutdown, how long the writer thread may take to send the answers it still holds.
FINISH_S = 5.0
# How long a stopping server keeps idle keep-alive connections open for a request a client
# may already have sent (answered, with the connection closed after it).
DRAIN_GRACE_S = 0.5
# A keep-alive connection with no request for this long is closed (aiohttp's default).
IDLE_TIMEOUT_S = 75.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_INTERNAL_ERROR = json_answer(b'{"error":"Internal Server Error"}', 500)


Handler = Callable[[Request], Awaitable[Answer]]


def _pieces(data: bytes) -> list[bytes] | tuple[bytes]:
    """``data`` cut after each head's end but the last (when more follows it) or left whole:
    the parser then returns the requests of one piece before it reads the next, so a
    malformed message loses none of the requests sent whole before it in the same read (the
    parser gives up on all it was fed at once). A single request, or one whose body ends the
    read, stays whole: no second head end follows the first."""
    end = data.find(b"\r\n\r\n")
    if end < 0 or (len(data) > _SCANNED_BYTES and _body_fills(data, end)):
        return (data,)
    if data.find(b"\r\n\r\n", end + 4) < 0:
        return (data,)
    pieces = []
    start = 0
    while end >= 0 and end + 4 < len(data):
        pieces.append(data[start : end + 4])
        start = end + 4
        end = data.find(b"\r\n\r\n", start)
    pieces.append(data[start:])
    return pieces


# Reads longer than this are looked at for a large body's first bytes before they are
# searched for a second head (the search costs ~0.1 ms for a read of 256 KiB).
_SCANNED_BYTES = 1 << 16


def _body_fills(data: bytes, end: int) -> bool:
    """Whether the body the first head (ending at ``end``) declares reaches past the end of
    ``data``: no other head can follow in it."""
    head = data[:end].lower()
    at = head.find(b"\ncontent-length:")
    if at < 0:
        return False
    line_end = head.find(b"\r", at + 16)
    value = head[at + 16 : line_end if line_end >= 0 else len(head)].strip()
    return value.isdigit() and end + 4 + int(value) >= len(data)


def _refusal(err: HttpProcessingError) -> Answer:
    """The answer to a message the parser rejected (the connection closes after it)."""
    body = f"{err.code}, message: {err.message}".encode("utf-8", "replace")
    return Answer(err.code or 400, (body,), "text/plain; charset=utf-8")


class HttpConnection(asyncio.BufferedProtocol):
    """One client connection. A buffered protocol (uvloop honours that only for one that is
    not also a plain ``Protocol``), so it chooses where each read lands: the server's read
    buffer, or a direct body. It also gives the flow control aiohttp's parser and body
    streams expect of their protocol (``pause_reading``/``resume_reading``, ``connected``)."""

    __slots__ = (
        "_direct",
        "_drain_waiter",
        "_ended",
        "_handle",
        "_held",
        "_loop",
        "_out",
        "_parser",
        "_reading_paused",
        "_server",
        "_serving",
        "_task",
        "_waiting",
        "_writing_paused",
        "_yielding",
        "last_data",
        "transport",
    )

    def __init__(self, handle: Handler, server: HttpServer) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser: HttpRequestParser | None = None
        self._reading_paused = False  # by a body stream over its limit
        self._writing_paused = False  # the transport's buffer is over its high-water mark
        self._drain_waiter: asyncio.Future[None] | None = None
        self._handle = handle
        self._server = server
        # Requests to answer in order; an Answer in their place refuses a broken message.
        self._waiting: deque[Request | Answer] = deque()
        # What answers the request being served: a handler task, or the core.
        self._task: asyncio.Task[None] | _InCore | None = None
        self._serving: Request | None = None  # the request the task answers
        self._ended = False  # the client half-closed: it sends nothing more
        self._held = False  # reading stopped because too many requests wait
        self._yielding = False  # reading stopped until the loop's next turn (a large body)
        self._out: OutStream | None = None  # the writer thread's stream, when there is one
        self._direct: DirectBody | None = None  # a body being received straight to its buffer
        self.last_data = self._loop.time()  # when bytes last came in

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # answers go whole: Nagle's delay gains nothing
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._parser = self._new_parser()
        self._server.connections.add(self)
        self._out = self._server.open_stream(sock)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("connection lost"))
        if self._out is not None:
            self._out.close()  # the socket closes once the writer has sent what it holds
        self._server.forget(self)
        # Bodies of requests that will never be answered give their budget back now, not when
        # the collector gets to this connection.
        for item in self._waiting:
            if isinstance(item, Request):
                item.release()
        self._waiting.clear()
        self._parser = None
        if self._task is not None:
            self._task.cancel()  # drops the request from the queue if it has not run
        if self._direct is not None:
            self._direct.done.cancel()
            self._direct.release()
            self._direct = None

    def _new_parser(self) -> HttpRequestParser:
        protocol: Any = self  # the parser types it as aiohttp's BaseProtocol; it is duck-typed
        return HttpRequestParser(
            protocol,
            self._loop,
            READ_LIMIT,
            max_line_size=8190,
            max_field_size=8190,
            auto_decompress=False,  # inference bodies are inflated by the handler
        )

    # -- flow control, as aiohttp's parser and StreamReader expect of their protocol ----------
    @property
    def connected(self) -> bool:
        return self.transport is not None

    def pause_reading(self) -> None:
        """A body stream holds more than its limit: stop reading until it is drained."""
        self._reading_paused = True
        if self._parser is not None:
            self._parser.pause_reading()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self, resume_parser: bool = True) -> None:
        # Body streams call this after every read below their limit: only a pause (theirs,
        # which also paused the parser) has anything to undo.
        if not self._reading_paused:
            return
        self._reading_paused = False
        if resume_parser:
            self.data_received(b"")  # lets the parser go on with what it held back
        if not self._reading_paused and not self._held and self.transport is not None:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _drained(self) -> None:
        """Waits until the transport's buffer is below its low-water mark again."""
        if self.transport is None:
            raise ConnectionResetError("connection lost")
        if not self._writing_paused:
            return
        if self._drain_waiter is None:
            self._drain_waiter = self._loop.create_future()
        await self._drain_waiter

    # -- reading --------------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is None:
            return self._server.read_buffer
        room = direct.room()
        # None: over the body budget; its request is answered 503, its bytes are dropped.
        return self._server.read_buffer if room is None else room

    def buffer_updated(self, nbytes: int) -> None:
        direct = self._direct
        if direct is None:
            self.data_received(bytes(self._server.read_buffer[:nbytes]))
            return
        self.last_data = self._loop.time()
        if direct.received(nbytes):
            self._direct = None  # what comes next is the next request's head
        elif nbytes >= DIRECT_READ_BYTES:
            # A whole read's worth came and more is likely waiting: the transport would read
            # again at once (up to 32 times), keeping every other client waiting meanwhile.
            self._yield_reading()

    def _yield_reading(self) -> None:
        """Stop reading until the loop's next turn, so that the other connections' events
        (and the callbacks they made ready) come first."""
        transport = self.transport
        if transport is None or self._yielding:
            return
        self._yielding = True
        transport.pause_reading()
        self._loop.call_soon(self._end_yield)

    def _end_yield(self) -> None:
        self._yielding = False
        if self.transport is not None and not self._reading_paused and not self._held:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None:
            return
        self.last_data = self._loop.time()
        request = None
        try:
            for piece in _pieces(data):
                messages, _, _ = parser.feed_data(piece)
                for message, payload in messages:
                    request = Request(message, payload, self._server.body_budget)
                    self._waiting.append(request)
        except HttpProcessingError as err:
            self._parser = None  # nothing after a broken message can be trusted
            self._waiting.append(_refusal(err))
        else:
            if request is not None and not request.content.is_eof():
                self._receive_directly(request)
        if self._task is None and self._waiting:
            self._serve_next()
        if len(self._waiting) > MAX_WAITING and not self._held and self.transport is not None:
            self._held = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        """The client has sent all it will (a half-close, e.g. ``shutdown(SHUT_WR)``): answer
        the requests it sent whole, in order, then close, as Triton does. A request whose body
        stops short can never be answered: the connection closes when its turn comes (at
        once if it is being served)."""
        self._ended = True
        serving = self._serving
        if serving is not None and not serving.body_received():
            return False  # its handler waits for bytes that will never come
        return self._task is not None or bool(self._waiting)  # else: nothing left, close

    def _receive_directly(self, request: Request) -> None:
        """Receives the rest of a large body (whose head was just parsed) straight into its
        buffer; a fresh parser then reads the next request."""
        length = request.content_length
        if (
            request.method != "POST"  # only POST routes read a body worth a pool buffer
            or length is None
            or not DIRECT_BODY_BYTES <= length <= MAX_BODY_BYTES
            or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
        ):
            return
        # Taking what the stream holds resumes reading when the stream had paused it, and
        # resuming serves the next request: not before the request has its body.
        paused, self._reading_paused = self._reading_paused, False
        try:
            body = DirectBody(length, request.content.read_nowait(), self._loop, request.budget)
        except (MemoryError, ValueError, TritonError):  # no buffer that large: the stream reads it
            self._reading_paused = paused
            return
        request.body = body
        self._parser = self._new_parser()
        if paused and not self._held and self.transport is not None:
            self.transport.resume_reading()
        # One read never holds a whole direct body besides its head (READ_BYTES is at most
        # DIRECT_BODY_BYTES), so the body is not complete yet; if it were, nothing is left
        # to receive.
        if not body.complete():
            self._direct = body

    def _serve_next(self) -> None:
        item = self._waiting.popleft()
        if self._ended and isinstance(item, Request) and not item.body_received():
            if self.transport is not None:  # cut short by a half-close: nothing to answer
                self.transport.close()
            return
        if isinstance(item, Request):
            self._serving = item  # from now: eof_received must see it before its task runs
        if self._held and len(self._waiting) <= MAX_WAITING // 2 and self.transport is not None:
            self._held = False
            if not self._reading_paused:
                self.transport.resume_reading()
        if isinstance(item, Request):
            if self._to_core(item):
                return
            if self._core_once_received(item):
                self._task = self._loop.create_task(self._to_core_when_received(item))
                return
        self._task = self._loop.create_task(self._serve(item))

    def _core_once_received(self, request: Request) -> bool:
        """Whether ``request``, whose large body is still arriving into a buffer of its own,
        goes to the core once it has."""
        body, core = request.body, self._server.core_path
        return (
            body is not None
            and not body.complete()
            and core is not None
            and core.lane_of(request) is not None
        )

    async def _to_core_when_received(self, request: Request) -> None:
        """Waits for ``request``'s body, then hands it to the core, or serves it on the
        reference path (a body over the budget, say, whose error is worded there)."""
        body = request.body
        assert body is not None
        with contextlib.suppress(TritonError):  # (the reference path answers it)
            await body.done
        if not self._to_core(request):
            await self._serve(request)

    def _to_core(self, request: Request) -> bool:
        """Hand ``request`` to the core, when its model's lane takes it (see corepath)."""
        server = self._server
        core = server.core_path
        out = self._out
        transport = self.transport
        if (
            core is None
            or out is None
            or transport is None
            or server.closing
            or transport.get_write_buffer_size()  # the answers before it must go first
        ):
            return False
        taken = core.submit(request, out)
        if taken is None:
            return False
        lane, ticket, token = taken
        self._task = _InCore(self, lane, ticket, token)
        server.serving += 1
        server.in_core[token] = self
        return True

    def core_answered(self) -> None:
        """The core wrote the answer of the request it was handed: serve the next one."""
        server = self._server
        server.serving -= 1
        self._task = None
        request, self._serving = self._serving, None
        if request is not None:
            request.release()
        transport = self.transport
        if transport is None:
            return
        # Its answer kept the connection open (it was handed over before the server began
        # to stop): a next request is answered, with the connection's close, as any is.
        if self._waiting:
            self._serve_next()
        elif self._ended:  # the client sends nothing more: every answer is out
            transport.close()
        elif server.closing:  # closed once no request came for the drain's grace
            self._loop.call_later(DRAIN_GRACE_S, self.close_when_idle, self._loop.time())

    async def _serve(self, item: Request | Answer) -> None:
        transport = self.transport
        if transport is None:
            return
        if isinstance(item, Answer):
            await self._write(item, (1, 1), keep_alive=False)
            transport.close()
            return
        server = self._server
        server.serving += 1
        try:
            if item.version >= (1, 1) and item.headers.get("Expect", "").lower() == "100-continue":
                self._send(_CONTINUE)
            item.out = self._direct_out(item)
            try:
                answer = await self._handle(item)
            except Exception:
                log.exception("HTTP request %s %s failed", item.method, item.path)
                answer = _INTERNAL_ERROR
            keep_alive = item.keep_alive and item.body_received() and not server.closing
            if answer.stream is not None and item.version < (1, 1):
                keep_alive = False  # the body ends where the connection does
            await self._write(answer, item.version, keep_alive)
        except ConnectionError:  # the client left while a large answer was going out
            return
        finally:
            server.serving -= 1
            self._serving = None
            item.release()
        if not keep_alive:
            transport.close()
            return
        self._task = None
        if self._waiting:
            self._serve_next()
        elif self._ended:  # the client sends nothing more: every answer is out
            transport.close()

    async def _write(self, answer: Answer, version: tuple[int, int], keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if answer.stream is not None:
            await self._write_stream(answer, answer.stream, version, keep_alive)
            return
        length = answer.length
        out = self._out
        if length < JOIN_BYTES or (out is not None and out.unsent):
            self._send(b"".join([head(answer, length, version, keep_alive), *answer.parts]))
            if out is not None and out.unsent > MAX_UNSENT:
                await self._writer_caught_up(out)
        else:
            transport.write(head(answer, length, version, keep_alive))
            for part in answer.parts:  # straight from the model's arrays, no joined copy
                transport.write(part if type(part) is bytes else memoryview(part))
                if self._writing_paused:
                    await self._drained()
        if answer.sent is not None:
            answer.sent()

    async def _write_stream(
        self,
        answer: Answer,
        stream: AsyncIterator[bytes],
        version: tuple[int, int],
        keep_alive: bool,
    ) -> None:
        """A streamed answer: the head and parts at once, then each piece as the stream
        yields it, then the body's end. The client going away cancels this (and so the
        stream's producer) through the connection's task."""
        chunked = version >= (1, 1)
        frame = chunk if chunked else bytes
        if not answer.written:
            first = [frame(bytes(part)) for part in answer.parts]
            self._send(b"".join([head(answer, None, version, keep_alive), *first]))
        try:
            async for piece in stream:
                self._send(frame(piece))
                await self._caught_up()
        finally:
            if isinstance(stream, AsyncGenerator):
                await stream.aclose()
        if chunked:
            self._send(chunk(b""))
        if answer.sent is not None:
            answer.sent()

    async def _caught_up(self) -> None:
        """Waits while this connection's unsent bytes are over their bound."""
        out = self._out
        if out is not None and out.unsent > MAX_UNSENT:
            await self._writer_caught_up(out)
        elif self._writing_paused:
            await self._drained()

    async def _writer_caught_up(self, out: OutStream) -> None:
        """Waits while the writer thread holds more than :data:`MAX_UNSENT` of this
        connection's bytes: a client that reads slowly (or not at all) then holds up only its
        own next answer, and what the server keeps for it stays bounded. Polled, with a
        growing interval: only such a client ever gets here."""
        interval = 0.001
        while out.unsent > MAX_UNSENT and self.transport is not None:
            await asyncio.sleep(interval)
            interval = min(interval * 2, 0.05)

    def _direct_out(self, request: Request) -> OutStream | None:
        """The writer-thread stream another thread may write ``request``'s streamed answer on
        (its head included): a keep-alive HTTP/1.1 request, with nothing of an earlier answer
        left in the transport and the server not closing."""
        out, transport = self._out, self.transport
        if (
            out is None
            or transport is None
            or transport.get_write_buffer_size()
            or request.version != (1, 1)
            or not request.keep_alive
            or self._server.closing
        ):
            return None
        return out

    def _send(self, data: bytes) -> None:
        """Writes ``data`` through the writer thread, unless the transport still holds bytes
        of a large answer (which must reach the socket first). With no other request being
        served, the loop has nothing better to do than the ``send`` itself, which spares the
        answer the writer's wake-up (~30 µs of p50 at concurrency 1)."""
        transport = self.transport
        out = self._out
        if out is None or transport is None or transport.get_write_buffer_size():
            if transport is not None:
                transport.write(data)
            return
        try:
            if self._server.serving > 1:
                out.write(data)
            else:
                out.write_now(data)
        except ConnectionError:
            # The peer is gone. The transport may not notice by itself: after a half-close it
            # reads no more, and the writer thread does the writing.
            transport.abort()

    def close_when_idle(self, quiet_since: float | None = None) -> None:
        """Close now if no request is being answered (and, with ``quiet_since``, nothing
        came in after it); else the answer closes it if the server is closing."""
        quiet = quiet_since is None or self.last_data < quiet_since
        if quiet and self._task is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self._out is not None:
            self._out.abort()
        if self.transport is not None:
            self.transport.abort()


class _InCore:
    """A request the core is answering, in place of a handler task: cancelling it (the
    connection was lost) takes the request out of its queue if it has not run."""

    __slots__ = ("_connection", "_lane", "_ticket", "_token")

    def __init__(
        self, connection: HttpConnection, lane: CoreLane, ticket: object, token: int
    ) -> None:
        self._connection = connection
        self._lane = lane
        self._ticket = ticket
        self._token = token

    def cancel(self) -> None:
        server = self._connection._server
        if server.in_core.pop(self._token, None) is not None:
            server.serving -= 1
        self._lane.cancel(self._ticket)


class HttpServer:
    """A listening socket and its connections; :meth:`close` lets answers in progress finish."""

    def __init__(
        self,
        handle: Handler,
        body_budget: BodyBudget,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        core_path: CorePath | None = None,
    ) -> None:
        self.connections: set[HttpConnection] = set()
        # Inference requests handed to the core whole, and the connections awaiting their
        # answers by token (see corepath).
        self.core_path = core_path
        self.in_core: dict[int, HttpConnection] = {}
        self.body_budget = body_budget  # what large request bodies count against
        self.closing = False
        self.serving = 0  # requests between their handler's start and their answer's write
        self._handle = handle
        self._server: asyncio.Server | None = None
        self._all_closed = asyncio.Event()
        self._idle_timeout_s = idle_timeout_s
        self._sweeper: asyncio.Task[None] | None = None
        self._outbox: Outbox | None = None
        self._stream_refused = False  # warned once that a socket could not be duplicated
        # Where every connection's reads land (one at a time: a read is handed on before the
        # loop reads again), unless a direct body takes them.
        self.read_buffer = memoryview(bytearray(READ_BYTES))

    def open_stream(self, sock: Any) -> OutStream | None:
        """A writer-thread stream for a new connection's socket (the transport's ``socket``
        extra); ``None`` (answers then go through the transport) if it cannot be reached."""
        if self._outbox is None or sock is None:
            return None
        try:
            return self._outbox.open(sock.fileno())
        except (OSError, ValueError) as error:  # e.g. out of descriptors: the loop sends
            if not self._stream_refused:
                self._stream_refused = True
                log.warning("HTTP answers sent on the event loop for some connections: %s", error)
            return None

    def forget(self, connection: HttpConnection) -> None:
        self.connections.discard(connection)
        if self.closing and not self.connections:
            self._all_closed.set()

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        """Listen on ``host:port`` (HTTPS with ``tls``: answers then go through the TLS
        transport, not the writer thread, which would write past the encryption)."""
        loop = asyncio.get_running_loop()
        self._outbox = Outbox() if tls is None else None
        self._server = await loop.create_server(
            lambda: HttpConnection(self._handle, self),
            host,
            port,
            backlog=1024,
            reuse_address=True,
            ssl=tls,
        )
        self._sweeper = loop.create_task(self._close_idle_connections())
        if self.core_path is not None:
            if self._outbox is None:  # (TLS: answers go through the transports)
                self.core_path = None
            else:
                loop.add_reader(self.core_path.completions.fileno(), self._answered_by_core)

    def _answered_by_core(self) -> None:
        """The core answered requests: their connections serve their next ones."""
        assert self.core_path is not None
        in_core = self.in_core
        for token in self.core_path.completions.take():
            connection = in_core.pop(token, None)
            if connection is not None:  # (else: its connection was lost meanwhile)
                connection.core_answered()

    async def _close_idle_connections(self) -> None:
        """Every few seconds, close keep-alive connections quiet for the idle timeout (one
        sweep rather than a timer per request)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._idle_timeout_s / 4)
            quiet_since = loop.time() - self._idle_timeout_s
            for connection in list(self.connections):
                connection.close_when_idle(quiet_since)

    async def close(self) -> None:
        """Stop listening; let open connections finish (each answer from now on closes its
        connection, and for :data:`DRAIN_GRACE_S` an idle connection may still bring the
        request its client already sent); then close the idle ones, wait for the busy ones
        to answer, and for the writer thread to send those answers (up to :data:`FINISH_S`).
        Whatever is still open when this is cancelled (a shutdown timeout) is aborted."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        if self.connections:
            # Closing an idle connection at once would reset a request already on its way
            # (the client cannot know the server was about to close): wait for them first.
            with contextlib.suppress(asyncio.TimeoutError):  # (TimeoutError from 3.11)
                await asyncio.wait_for(asyncio.shield(self._all_closed.wait()), DRAIN_GRACE_S)
            for connection in list(self.connections):
                connection.close_when_idle()
            try:
                await self._all_closed.wait()
            finally:
                for connection in list(self.connections):
                    connection.abort()
        if self.core_path is not None:
            asyncio.get_running_loop().remove_reader(self.core_path.completions.fileno())
        if self._outbox is not None:
            # An answer handed over just before its connection closed may not be sent yet.
            await asyncio.to_thread(self._outbox.finish, FINISH_S)
