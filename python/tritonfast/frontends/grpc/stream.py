"""``ModelStreamInfer``: many requests on one bidirectional stream, each answered by a stream
of responses, written as Triton writes them.

- Requests run concurrently (up to :data:`STREAM_WINDOW` at once; reading pauses beyond).
- A single-response model's reply goes out in request order, after the replies of the
  single-response requests read before it (for a model the core drives, the core decodes
  the request and serializes its reply: :mod:`.corepath`); a decoupled model's responses go
  out as they come, interleaved with everything else (those the core serializes are queued
  on the call by the core's reader threads themselves, when the gRPC engine allows: no turn
  of the event loop per response; and such a request, when small, is handed to the core by
  the completion-queue thread as it arrives, the loop counting it after the fact).
- Every reply carries the ``triton_final_response`` parameter (whether it is the request's
  last). A final flag with no response is written as an empty reply only when the request set
  ``triton_enable_empty_final_response``.
- A failed request is answered with a reply whose ``error_message`` is set (the stream stays
  open); a malformed message ends the stream with INVALID_ARGUMENT.
- The client going away (cancel, disconnect) cancels every request still in flight.
- Backpressure: once :data:`OUT_AHEAD` replies wait for the writer, or the call's own queue
  is full (the client reads more slowly than its requests are answered), reading the next
  request waits, and a decoupled request's next response waits too (its model's sends are
  held, see ``runtime.responses``).
  So a client that stops reading holds at most the replies of the requests already in flight
  (:data:`STREAM_WINDOW`) and :data:`OUT_AHEAD` more, whatever it sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import AsyncIterator
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from tritonfast._core import Lane
from tritonfast._proto import grpc_service_pb2 as pb
from tritonfast.data.types import InferResponse
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError
from tritonfast.frontends.grpc import codec
from tritonfast.frontends.grpc.corepath import StreamedReplies, StreamReply, stream_lane
from tritonfast.memory.bodybudget import COUNTED_BYTES
from tritonfast.runtime.responses import Room

if TYPE_CHECKING:
    from tritonfast.api.dataplane import DataPlane
    from tritonfast.frontends.grpc.core import StreamWriter

# How many requests of one stream may be in flight before reading pauses.
STREAM_WINDOW = 256
# How many replies may wait for the writer before reading and decoupled requests' responses
# wait too.
OUT_AHEAD = 16
# The request parameter that asks for flag-only final replies, and the reply parameter that
# marks a request's last reply.
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
FINAL_PARAMETER = codec.FINAL_PARAMETER

_END = object()  # the writer's signal that nothing more will come


class StreamSession:
    """One ``ModelStreamInfer`` call: reads requests, runs them, yields the replies."""

    def __init__(
        self,
        dataplane: DataPlane,
        requests: AsyncIterator[bytes],
        writer: StreamWriter | None = None,
    ) -> None:
        self._dataplane = dataplane
        self._budget = dataplane.body_budget
        self._requests = requests
        self._out: asyncio.Queue[Any] = asyncio.Queue()
        self._out_room = asyncio.Event()  # set while fewer than OUT_AHEAD replies wait
        self._out_room.set()
        # The same bound for the core's threads that stream decoupled models' replies in.
        self._room = Room(lambda: self._out.qsize() >= OUT_AHEAD, lambda: self._over)
        self._over = False
        # The call's writer, when its engine lets other threads write (see _start_in_core),
        # and the bound that holds them.
        self._direct: tuple[StreamWriter, Room] | None = None
        if writer is not None:
            room = Room(writer.full, writer.over)
            writer.hold_with(room.freed)
            self._direct = (writer, room)
        self._window = asyncio.Semaphore(STREAM_WINDOW)
        self._running: set[asyncio.Future[Any]] = set()
        self._loop = asyncio.get_running_loop()
        # With a writer other threads may write to, a decoupled model's requests the core
        # takes are handed to it from the completion-queue thread (see _take_here).
        if self._direct is not None and hasattr(requests, "take"):
            requests.take = self._take_here
        # Single-response requests' replies (messages, or bytes the core serialized), in
        # request order, until their turn.
        self._ordered: deque[asyncio.Future[Any]] = deque()
        self._reading_done = False
        self._read_error: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None

    async def replies(self) -> AsyncIterator[pb.ModelStreamInferResponse | bytes]:
        self._reader = asyncio.ensure_future(self._read())
        try:
            out, room = self._out, self._out_room
            while (reply := await out.get()) is not _END:
                if not room.is_set() and out.qsize() <= OUT_AHEAD // 2:
                    room.set()
                self._room.freed()
                yield reply
            if self._read_error is not None:
                raise self._read_error  # a malformed message ends the call with its status
        finally:
            self.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def cancel(self) -> None:
        """The call is over (the client may be gone): stop reading and cancel every request
        still in flight. Called by the RPC's done callback, which also runs when the call ends
        while its handler waits to write, outside this generator."""
        self._over = True
        if self._reader is not None:
            self._reader.cancel()
        for task in list(self._running):
            task.cancel()

    # -- reading ----------------------------------------------------------------------------
    async def _read(self) -> None:
        try:
            async for data in self._requests:
                # A client that does not take its replies gets no more of its requests read.
                # (Checked first: a wait() even on a set event makes a coroutine per message.)
                if not self._out_room.is_set():
                    await self._out_room.wait()
                if self._direct is not None and (room := self._direct[0].wait_room()) is not None:
                    await room
                # A large message counts against the server's body budget until its request
                # is over (up to STREAM_WINDOW of them may be in flight).
                held = len(data) if len(data) >= COUNTED_BYTES else 0
                if held and not self._budget.take(held):
                    self._refuse(self._budget.refusal(held).message)
                    continue
                lane = stream_lane(self._dataplane, data)
                if lane is not None:
                    try:
                        await self._window.acquire()
                    except BaseException:
                        self._budget.give(held)
                        raise
                    if self._start_in_core(lane, data, held):
                        continue
                    self._window.release()
                try:
                    message = pb.ModelInferRequest.FromString(data)
                    del data
                    await self._window.acquire()
                except DecodeError as error:
                    self._budget.give(held)
                    # Only this message fails; the stream goes on with the next one.
                    self._refuse(f"failed to parse the request message: {error}")
                    continue
                except BaseException:  # cancelled while waiting for room, or worse
                    self._budget.give(held)
                    raise
                self._start(message, held)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # e.g. a message that does not parse
            self._read_error = error
        finally:
            self._reading_done = True
            self._maybe_end()

    def _take_here(self, data: bytes) -> bool:
        """On the completion-queue thread, as a request arrives: a small one to a decoupled
        model whose lane takes it is handed to the lane from here, its replies written by the
        core's reader thread (see _start_in_core): the event loop then only keeps count, after
        the fact. False: the loop reads it (anything else, or no room now)."""
        direct = self._direct
        if (
            self._over
            or direct is None
            or len(data) >= COUNTED_BYTES
            or not self._out_room.is_set()
            or direct[0].full()
            or len(self._running) >= STREAM_WINDOW // 2
        ):
            return False
        lane = stream_lane(self._dataplane, data)
        if lane is None or not lane.decoupled:
            return False
        writer, room = direct
        over: asyncio.Future[Any] = self._loop.create_future()
        sink = StreamedReplies(writer.send, room, over, data, writer=writer)
        try:
            ticket = lane.submit_grpc(data, sink, True, sink.replies)
        except TritonError:  # (a full queue, say): the loop's path words it
            return False
        if ticket is None:
            return False
        with contextlib.suppress(RuntimeError):  # the loop is gone: so is the call
            self._loop.call_soon_threadsafe(self._taken, lane, ticket, over)
        return True

    def _taken(self, lane: Lane, ticket: Any, over: asyncio.Future[Any]) -> None:
        """On the loop: a request the completion-queue thread handed to the core, counted
        among those in flight (outside the reading window, which it never waited for)."""
        if self._over:
            lane.cancel(ticket)
            return
        over.add_done_callback(lambda done: lane.cancel(ticket) if done.cancelled() else None)
        self._running.add(over)
        over.add_done_callback(self._taken_over)

    def _taken_over(self, over: asyncio.Future[Any]) -> None:
        self._running.discard(over)
        self._maybe_end()

    def _refuse(self, text: str) -> None:
        """An error reply in the place of a message that could not be read."""
        refused: asyncio.Future[pb.ModelStreamInferResponse] = (
            asyncio.get_running_loop().create_future()
        )
        refused.set_result(codec.stream_error(text, ""))
        self._ordered.append(refused)
        self._flush_ordered(refused)

    def _put(self, reply: pb.ModelStreamInferResponse | bytes) -> None:
        """Queue ``reply`` for the writer; from :data:`OUT_AHEAD` waiting on, there is no room
        (until the writer has taken half)."""
        self._out.put_nowait(reply)
        if self._out.qsize() >= OUT_AHEAD:
            self._out_room.clear()

    def _start_in_core(self, lane: Lane, data: bytes, held: int) -> bool:
        """Hand a request to its model's lane whole (see ``corepath.stream_lane``): its
        serialized reply takes its turn like any single response (a decoupled model's
        replies go out as they come). False when the core leaves it to the session."""
        # Resolved with the serialized reply; for a decoupled model, once the final flag came
        # (each reply written as it came).
        over: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        sink: StreamReply | StreamedReplies
        if lane.decoupled and self._direct is not None:
            # The core's reader thread writes each reply to the call itself; only the end
            # comes to the loop.
            writer, room = self._direct
            sink = StreamedReplies(writer.send, room, over, data, writer=writer)
        elif lane.decoupled:
            sink = StreamedReplies(self._put, self._room, over, data)
        else:
            sink = StreamReply(over, data)
        replies = sink.replies if isinstance(sink, StreamedReplies) else None
        try:
            ticket = lane.submit_grpc(data, sink, True, replies)
        except TritonError:  # (a full queue, say): the session words it
            ticket = None
        if ticket is None:
            return False
        over.add_done_callback(lambda done: lane.cancel(ticket) if done.cancelled() else None)
        if not lane.decoupled:
            self._ordered.append(over)
            over.add_done_callback(self._flush_ordered)
        self._running.add(over)
        over.add_done_callback(functools.partial(self._finished, held))
        return True

    def _start(self, message: pb.ModelInferRequest, held: int) -> None:
        try:
            decoupled = self._dataplane.is_decoupled(message.model_name, message.model_version)
        except TritonError:
            decoupled = False  # the request fails; its error reply keeps its place in order
        task: asyncio.Task[Any]
        if decoupled:
            task = asyncio.ensure_future(self._run_decoupled(message))
        else:
            task = asyncio.ensure_future(self._single_reply(message))
            self._ordered.append(task)
            task.add_done_callback(self._flush_ordered)
        self._running.add(task)
        task.add_done_callback(functools.partial(self._finished, held))

    def _finished(self, held: int, task: asyncio.Future[Any]) -> None:
        if held:
            self._budget.give(held)
        self._running.discard(task)
        self._window.release()
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self._reading_done and not self._running and not self._ordered:
            self._out.put_nowait(_END)

    # -- answering --------------------------------------------------------------------------
    def _flush_ordered(self, _: object) -> None:
        """Write the single-response replies whose turn has come."""
        ordered = self._ordered
        while ordered and ordered[0].done():
            reply = ordered.popleft()
            if reply.cancelled():
                continue
            error = reply.exception()
            if error is not None:  # a bug, not a request error: the call ends with its status
                self._read_error = error
                self._out.put_nowait(_END)
                return
            self._put(reply.result())
        self._maybe_end()

    def _first_error(self, error: TritonError, message: pb.ModelInferRequest) -> TritonError:
        """Triton names an unknown model before what is wrong with the request."""
        try:
            self._dataplane.require_model(message.model_name, message.model_version)
        except TritonError as unknown:
            return unknown
        return error

    async def _single_reply(self, message: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        replies = [reply async for reply in self._replies(message)]
        if len(replies) != 1:
            return _error_reply(
                InternalError(f"expected a single response, got {len(replies)}"), message
            )
        return replies[0]

    async def _run_decoupled(self, message: pb.ModelInferRequest) -> None:
        room = self._out_room
        async for reply in self._replies(message):
            self._put(reply)
            if not room.is_set():
                await room.wait()

    async def _replies(
        self, message: pb.ModelInferRequest
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The replies to one request: its responses, or the error that stopped it."""
        failure: TritonError | None = None
        try:
            request = codec.decode_infer_request(message)
        except InvalidArgumentError as invalid:
            request, failure = None, self._first_error(invalid, message)
        if request is None:
            assert failure is not None
            yield _error_reply(failure, message)
            return
        empty_final = bool(request.parameters.pop(EMPTY_FINAL_PARAMETER, False))
        requested = [o.name for o in message.outputs] if message.outputs else None
        try:
            async for item in self._dataplane.stream(request):
                result = item.result
                encode_start = perf_counter_ns()
                if isinstance(result, InferResponse):
                    yield codec.stream_reply(result, requested, message.id, item.final)
                elif isinstance(result, TritonError):
                    yield _error_reply(result, message)
                elif empty_final:  # a bare final flag, written only when asked for
                    yield _empty_final(message)
                if item.final and request.trace is not None:
                    self._dataplane.trace_sent(request, "GRPC", encode_start, perf_counter_ns())
        except TritonError as error:
            failure = error
        if failure is not None:
            yield _error_reply(failure, message)


def _error_reply(error: TritonError, message: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    return codec.stream_error(error.message, message.id)


def _empty_final(message: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    reply = pb.ModelStreamInferResponse()
    response = reply.infer_response
    response.id = message.id
    response.model_name = message.model_name
    response.model_version = message.model_version
    response.parameters[FINAL_PARAMETER].bool_param = True
    return reply
