"""gRPC ``ModelInfer`` calls handed to the Rust core whole.

For a model whose requests the core takes all the way (:mod:`tritonfast.runtime.lane`), a
unary ``ModelInfer`` call's message goes to the model's lane as received, from the
completion-queue thread as it arrives: the core decodes and checks it, queues it, runs its
batch on the worker and serializes the reply (``ModelInferResponse`` with
``raw_output_contents``), which the driver thread hands to the completion-queue thread (or
sends itself, for a lone call): the event loop sees such a call only when its answer is an
error or needs the reference encoder (response parameters). What the
core's decoder does not take on goes to the servicer (the reference path), which answers
every call as Triton does: request or tensor parameters (but a sequence's and system shared
memory's), typed ``contents``, CUDA shared memory, and every request its model refuses or
whose regions do not fit (the reference path words gRPC's errors); so do all calls while
tracing or header forwarding is on.

A ``ModelStreamInfer`` stream's requests to such a model go to its lane the same way
(:func:`stream_lane`, :class:`StreamReply`): the core serializes the request's
``ModelStreamInferResponse``, which the stream writes in its turn. A decoupled model's
responses are serialized by the core as its worker sends them and written as they come
(:class:`StreamedReplies`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from tritonfast._core import Lane, RequestReplies, grpc_model
from tritonfast.api.dataplane import DataPlane
from tritonfast.data.types import InferResponse
from tritonfast.errors import Code, TritonError, error_for
from tritonfast.frontends.grpc import codec
from tritonfast.runtime.lane import CoreLane, response_of
from tritonfast.runtime.responses import Room

if TYPE_CHECKING:
    from tritonfast.frontends.grpc.core import StreamWriter, _Call


def lane_of(dataplane: DataPlane, data: bytes) -> CoreLane | None:
    """The lane (a model's or an ensemble's) a ``ModelInferRequest`` as received (``data``)
    may be handed to whole; None when Python must take it (tracing or header forwarding on,
    an unknown model, one the core does not drive)."""
    if dataplane.tracer.enabled or dataplane.forwards_headers("GRPC"):
        return None
    target = grpc_model(data)
    return None if target is None else dataplane.lane_for(*target)


def stream_lane(dataplane: DataPlane, data: bytes) -> Lane | None:
    """As :func:`lane_of`, for a stream's request: a model's lane only (a stream's requests
    to an ensemble go through the stream session)."""
    lane = lane_of(dataplane, data)
    return lane if isinstance(lane, Lane) else None


class StreamReply:
    """Where the core's answer to one request of a stream goes: ``future``, resolved on the
    event loop with the serialized ``ModelStreamInferResponse``."""

    __slots__ = ("_data", "_future")

    def __init__(self, future: asyncio.Future[bytes], data: bytes) -> None:
        self._future = future
        self._data = data

    def send_early(self, described: tuple[Any, ...]) -> bool:
        """(Stream replies go out in request order, from the loop.)"""
        return False

    def answered(self, described: tuple[Any, ...]) -> None:
        future = self._future
        if future.done():  # cancelled: the stream is over
            return
        kind = described[0]
        if kind == "bytes":
            future.set_result(described[1])
            return
        message, _ = codec.parse_infer_request(self._data)
        if kind == "error":
            reply = codec.stream_error(described[2], message.id)
        else:  # a response with parameters: the reference encoder writes it
            response = response_of(described)
            assert isinstance(response, InferResponse)  # (errors came as "error")
            requested = [o.name for o in message.outputs] if message.outputs else None
            reply = codec.stream_reply(response, requested, message.id, True)
        future.set_result(reply.SerializeToString())


class StreamedReplies:
    """Where the core's responses to one request of a stream to a decoupled model go: each
    serialized reply handed to ``put`` as it comes, ``done`` resolved with the final flag.
    ``room``: how far the stream's writer may fall behind before the model's next responses
    are held back. With the call's ``writer`` (``direct``), the core queues the replies it
    serializes on the call itself (:attr:`replies`, handed to ``Lane.submit_grpc``) and the
    core's reader thread hands this sink only the replies the reference encoder writes
    (:meth:`write_here`), the call to start sending on, and the end (:meth:`streamed`);
    otherwise every reply is put on the event loop."""

    __slots__ = (
        "_data",
        "_done",
        "_first",
        "_put",
        "_started",
        "_writer",
        "direct",
        "replies",
        "room",
    )

    def __init__(
        self,
        put: Callable[[bytes], object],
        room: Room,
        done: asyncio.Future[None],
        data: bytes,
        *,
        writer: StreamWriter | None = None,
    ) -> None:
        self._put = put
        self.room = room
        self._done = done
        self._data = data
        self._writer = writer
        self.direct = writer is not None
        self.replies = None if writer is None else RequestReplies(writer.queue)
        self._started: int | None = perf_counter_ns()
        self._first: int | None = None  # when a reader thread wrote the first reply

    def time_to_first(self, now: int) -> int | None:
        """Nanoseconds from the hand-over to the first response (``now`` unless a reader
        thread queued it earlier), the first time it is asked once one came (see the
        first-response histogram); None after."""
        started, self._started = self._started, None
        if started is None:
            return None
        queued = [at for at in (self._first, self.replies and self.replies.first_at) if at]
        return min(queued, default=now) - started

    def write_here(self, described: tuple[Any, ...] | None, final: bool) -> None:
        """On the core's reader thread (``direct``): the reply to ``described`` queued on the
        call; with none (not the last), the call's sending started."""
        if described is None:
            if not final and self._writer is not None:
                self._writer.kick()  # (even when cancelled: others' replies wait behind)
            return
        if self._done.done():  # cancelled
            return
        if self._first is None:
            self._first = perf_counter_ns()
        self._put(self._reply(described, final))

    def streamed(self, described: tuple[Any, ...] | None, final: bool) -> None:
        done = self._done
        if done.done():  # cancelled: the stream is over
            return
        if described is not None:
            self._put(self._reply(described, final))
        if final:
            done.set_result(None)

    def _reply(self, described: tuple[Any, ...], final: bool) -> bytes:
        kind = described[0]
        if kind == "bytes":
            return bytes(described[1])
        message, _ = codec.parse_infer_request(self._data)
        if kind == "error":
            return codec.stream_error(described[2], message.id).SerializeToString()
        response = response_of(described)  # with parameters: the reference encoder's
        assert isinstance(response, InferResponse)  # (errors came as "error")
        requested = [o.name for o in message.outputs] if message.outputs else None
        return codec.stream_reply(response, requested, message.id, final).SerializeToString()


class GrpcCorePath:
    """``Method.whole`` of ``ModelInfer``: hands calls to their models' lanes."""

    def __init__(self, dataplane: DataPlane) -> None:
        self._dataplane = dataplane

    def __call__(self, call: _Call, data: bytes) -> bool:
        lane = lane_of(self._dataplane, data)
        if lane is None:
            return False
        try:
            ticket = lane.submit_grpc(data, _Reply(call, data))
        except TritonError:  # (a full queue, say): the reference path answers it
            return False
        if ticket is None:
            return False
        call.core_ticket = (lane, ticket)
        call.server.add_running(1)
        return True


class _Reply:
    """Where the core's answer to one call goes: sent from the driver thread that answered
    it, or from the event loop (an error, an answer the reference encoder writes)."""

    __slots__ = ("_call", "_data")

    def __init__(self, call: _Call, data: bytes) -> None:
        self._call = call
        self._data = data

    def send_early(self, described: tuple[Any, ...]) -> bool:
        """On the driver thread that answered the call (GIL held): a serialized reply goes
        from here, and the call is over, with no wake-up of the event loop. A lone call's
        reply is sent at once; with other calls running, it is handed to the completion-queue
        thread through an empty batch (see ``_Call.reply``): sent from the driver thread it
        would hold it, and the GIL, from the next batch (gRPC c=16: 12.6k calls/s against
        15.3k). True: nothing is left for :meth:`answered`."""
        call = self._call
        if described[0] != "bytes" or call.cancelled or call.budgeted:
            return False
        call.metadata_sent = True
        call.payload = described[1]
        if call.server.running <= 1:
            call.send_reply(None)
        else:
            call.call.start_server_batch((), call.send_reply)
        call.server.add_running(-1)
        call.core_ticket = None
        call.over()
        return True

    def answered(self, described: tuple[Any, ...]) -> None:
        call = self._call
        call.server.add_running(-1)
        call.core_ticket = None
        if call.cancelled:  # the call is over already
            return
        kind = described[0]
        if kind == "bytes":  # (a call of the body budget's: see send_early)
            call.reply(described[1])
        elif kind == "error":
            error = error_for(Code(described[1]), described[2])
            call.finish(codec.grpc_status(error).value[0], error.message)
        else:  # a response with parameters: the reference encoder writes it
            response = response_of(described)
            assert isinstance(response, InferResponse)  # (errors came as "error")
            call.reply(self._encode(response))
        call.over()

    def _encode(self, response: InferResponse) -> bytes:
        request, _ = codec.parse_infer_request(self._data)
        requested = [o.name for o in request.outputs] if request.outputs else None
        return codec.serialize_infer_response(response, requested, request.id)
