"""An instance's batches as the server's core hands them over (a worker process's over the
core's channel, an in-process instance's by a call): the requests read from the core's input
segment (:mod:`.segmentlayout`; large tensors in a client's shared memory mapped there,
:mod:`.sharedobjects`), the instance's ``execute`` run on them, and their results written
into the instance's own output segment and described for the core's reply
(:class:`Batches`). Worker processes use the same pieces for the batches their pipe brings
(:mod:`.worker`)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import orjson

from tritonfast.backends.base import PhaseClock
from tritonfast.backends.python import workerbls
from tritonfast.backends.python.segmentlayout import (
    Laid,
    TensorSlot,
    inline_tensors,
    raw_bytes,
    read_tensor,
    write_tensors,
)
from tritonfast.backends.python.sharedobjects import Place, SharedObjects, is_body_object
from tritonfast.data.types import (
    RELEASE_RESCHEDULE,
    InferRequest,
    InputTensor,
    OutputTensor,
    RequestedOutput,
)
from tritonfast.errors import InternalError, TritonError, UnavailableError
from tritonfast.memory.shmsegment import SegmentReader, SegmentWriter
from tritonfast.runtime.instance import backend_failed, miscounted
from tritonfast.runtime.modelinstance import ModelInstance
from tritonfast.runtime.responses import ResponseSender, Result

log = logging.getLogger(__name__)


class Streams(Protocol):
    """Where a decoupled batch's responses go (a worker's: see workerstream.WorkerStreams)."""

    def sender(self, token: int, request: InferRequest) -> ResponseSender: ...


class Calls(Protocol):
    """The calls to the server a batch's model may make while it runs (a worker's, over the
    channel: see workercalls.ChannelCalls)."""

    def open(self) -> None: ...
    def close(self) -> None: ...


class Batches:
    """One instance's batches: the segments they travel in, and the instance they run on."""

    def __init__(
        self,
        instance: ModelInstance,
        model_name: str,
        instance_name: str,
        output_prefix: str,
        in_batch: threading.Event | None = None,
    ) -> None:
        self.instance = instance
        self.model_name = model_name
        self.instance_name = instance_name
        self._in_batch = in_batch  # set while a batch runs, if given
        self._inputs = SegmentReader()
        self._cancel_flags = SegmentReader()
        self.outputs = SegmentWriter(output_prefix)
        self.objects = SharedObjects()

    def close(self) -> None:
        self.objects.close()
        self.outputs.close()
        self._inputs.close()
        self._cancel_flags.close()

    def flags(self, name: str, size: int) -> Any:
        """The batch's cancellation bytes, in the segment the server named."""
        return self._cancel_flags.map(name, size).buffer

    def requests(
        self, name: str, size: int, described: list[tuple[Any, ...]], flags: Any, *, copy: bool
    ) -> tuple[list[BatchRequest], dict[int, TritonError]]:
        """The batch's requests, over its input segment; and, by position, those that failed
        already (a client's object it could not map). ``flags``: the batch's cancellation
        bytes (None: its requests are never seen cancelled); ``copy``: see :func:`request_of`."""
        segment = self._inputs.map(name, size)
        self.objects.start_batch()
        requests: list[BatchRequest] = []
        failed: dict[int, TritonError] = {}
        for index, d in enumerate(described):
            try:
                requests.append(
                    request_of(
                        segment.buffer, self.model_name, d, flags, index, self.objects, copy=copy
                    )
                )
            except TritonError as error:
                failed[index] = error
        return requests, failed

    def execute(self, requests: list[BatchRequest]) -> Sequence[Result | None] | None:
        """Run the model on a batch's requests (the server may be called meanwhile)."""
        if self._in_batch is not None:
            self._in_batch.set()
        try:
            returned = (
                self.instance.execute(cast(list[InferRequest], requests), PhaseClock())
                if requests
                else []
            )
        finally:
            if self._in_batch is not None:
                self._in_batch.clear()
        for request in requests:
            request.detach()  # the cancellation bytes now belong to the next batch
        return cast(Sequence[Result | None] | None, returned)

    def _answers(self, requests: list[BatchRequest]) -> list[Result | None]:
        """What ``execute`` returned for each request (None: see its sender); a failure of
        the backend's own fails the batch, worded as the instance threads word it."""
        try:
            returned = self.execute(requests)
        except TritonError as failed:
            return [failed] * len(requests)
        except Exception as exc:  # a backend bug fails this batch, not the server
            log.exception("instance %s failed to execute a batch", self.instance_name)
            return [backend_failed(self.instance_name, exc)] * len(requests)
        if returned is None:
            return [None] * len(requests)
        if len(returned) != len(requests):
            return [miscounted(self.instance_name, len(returned), len(requests))] * len(requests)
        return list(returned)

    def run(
        self,
        batch: tuple[Any, ...],
        calls: Calls | None = None,
        streams: Streams | None = None,
    ) -> tuple[str, int, bytes, list[tuple[Any, ...]]]:
        """A batch from the core (as ``LaneWorkerChannel.next`` gives it): run, its outputs
        written; the reply's segment, its size, the outputs' bytes when they travel in the
        reply instead, and each request's result, as the core reads them (parameters as JSON
        text, errors by code name). With ``streams`` (a decoupled model's batch), each
        request's responses go through the sender made for its stream token instead, and its
        result says so."""
        model, version, name, size, flags_name, flags_size, described = batch
        requests, failed = self.requests(
            name,
            size,
            [
                (model, version, i, _parameters(p), o, s, _trace(t), places)
                for i, p, o, s, places, t, _ in described
            ],
            self.flags(flags_name, flags_size),
            copy=streams is not None,
        )
        if streams is not None:
            positions = [index for index in range(len(described)) if index not in failed]
            for index, request in zip(positions, requests, strict=True):
                request.sender = streams.sender(described[index][6], request)
        if calls is not None:
            calls.open()
        try:
            answers = self._answers(requests)
        finally:
            if calls is not None:
                calls.close()  # (waits for a call still in flight: its answer comes first)
        if streams is not None:
            return "", 0, b"", self._streamed(requests, answers, failed)
        results: list[Result | None] = [
            no_reschedule(request, self.instance_name)
            if request.release_flags & RELEASE_RESCHEDULE
            else answer_of(request, result, self.instance_name)
            for request, result in zip(requests, answers, strict=True)
        ]
        for index in sorted(failed):
            results.insert(index, failed[index])
        reply = channel_reply(
            self.outputs,
            results,
            [d[4] for d in described],
            self.objects,
            # (Only a worker that has a body object mapped may have outputs lying in one.)
            [_body_places(d[3]) for d in described] if self.objects.maps_bodies() else None,
        )
        self.objects.end_batch()
        return reply

    def _streamed(
        self,
        requests: list[BatchRequest],
        answers: list[Result | None],
        failed: dict[int, TritonError],
    ) -> list[tuple[Any, ...]]:
        """A decoupled batch's results: its responses went through its requests' senders;
        what ``execute`` returned (an error) ends a stream, as in-process streams end."""
        for request, result in zip(requests, answers, strict=True):
            if result is not None and request.sender is not None:
                with contextlib.suppress(TritonError):  # already closed
                    request.sender.send(result, final=True)
        results: list[tuple[Any, ...]] = [
            ("error", *_coded(no_reschedule(request, self.instance_name)))
            if request.release_flags & RELEASE_RESCHEDULE
            else ("streamed",)
            for request in requests
        ]
        for index in sorted(failed):
            results.insert(index, ("error", *_coded(failed[index])))
        return results


def _body_places(slots: list[tuple[Any, ...]]) -> list[Place]:
    """The places of a request's inputs that lie in the server's body object."""
    return [slot[5] for slot in slots if slot[5] is not None and is_body_object(slot[5][0])]


def _coded(error: TritonError) -> tuple[str, str]:
    return (error.code.value, error.message)


def _trace(token: int) -> workerbls.TraceToken | None:
    """A request's trace as the instance holds it (its token; 0: untraced)."""
    return workerbls.TraceToken(token) if token else None


class BatchRequest(InferRequest):
    """A request in the worker: ``cancelled`` reads its byte of the cancellation segment; its
    ``sink``, made when first asked for (by the model's response sender), is the future the
    worker takes the one response of a request answered through its sender from."""

    __slots__ = ("_flags", "_index", "_sink")
    _flags: Any
    _index: int
    _sink: concurrent.futures.Future[Any] | None

    @property  # type: ignore[override]
    def sink(self) -> concurrent.futures.Future[Any]:
        sink = self._sink
        if sink is None:
            sink = self._sink = concurrent.futures.Future()
        return sink

    @sink.setter
    def sink(self, value: Any) -> None:
        self._sink = value

    @property  # type: ignore[override]
    def cancelled(self) -> bool:
        flags = self._flags  # None once its batch returned
        return flags is not None and bool(flags[self._index])

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        pass  # only the server raises the flag

    def detach(self) -> None:
        """Its batch returned: from now on only the server's cancel messages count."""
        self._flags = None


def no_reschedule(request: BatchRequest, instance_name: str) -> TritonError:
    """A request the model rescheduled, though the core drives only models that cannot be
    (no iterative sequence): it ends with Triton's error."""
    return InternalError(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model"
        f" instance '{instance_name}' does not support rescheduling: it takes"
        " sequence_batching { iterative_sequence: true }"
    )


def _parameters(text: str) -> dict[str, Any]:
    """A request's parameters from their JSON text. A string the server's Python read from a
    body that is not UTF-8 holds lone surrogates, which the text escapes and orjson refuses:
    Python's own parser reads those as the server's Python had them."""
    if not text:
        return {}
    try:
        return orjson.loads(text)  # type: ignore[no-any-return]
    except orjson.JSONDecodeError:
        return json.loads(text)  # type: ignore[no-any-return]


def channel_head(
    model_name: str, model_version: Any, response_id: str | None, parameters: Any
) -> tuple[str, str, str, str, str]:
    """A response's ``("ok", model, version, id, parameters)`` as the core's channel carries
    them (parameters as JSON text, empty for none), before its outputs."""
    text = orjson.dumps(parameters, default=str).decode() if parameters else ""
    return ("ok", model_name, str(model_version), response_id or "", text)


def release_flags(
    requests: list[BatchRequest], failed: dict[int, TritonError], count: int
) -> list[int] | None:
    """The release flags the model set (pb_utils set_release_flags), in the batch's order;
    None when it set none."""
    if not any(request.release_flags for request in requests):
        return None
    flags = [0] * count
    positions = (index for index in range(count) if index not in failed)
    for index, request in zip(positions, requests, strict=False):
        flags[index] = request.release_flags
    return flags


def answer_of(request: BatchRequest, result: Result | None, instance_name: str) -> Result:
    """A request's response: the one ``execute`` returned, or else the one the model sent
    through its response sender (waited for: the model may send it from a thread of its own,
    after ``execute`` returned)."""
    if result is not None:
        return result
    sink = request._sink
    if request.sender is None or sink is None:  # (a sink alone: is_cancelled() asked for one)
        return InternalError(
            f"model instance '{instance_name}' returned no response for request"
            f" '{request.id}' and did not use its response sender"
        )
    try:
        return cast(Result, sink.result())
    except TritonError as error:
        return error


def request_of(
    buffer: Any,
    model: str,
    described: tuple[Any, ...],
    flags: Any,
    index: int,
    objects: SharedObjects,
    *,
    copy: bool,
) -> BatchRequest:
    """A request of the batch in ``buffer``; ``copy``: its inputs are copied out of the
    segment (a decoupled model's requests outlive their batch: threads or coroutines of the
    model may read them after ``execute`` returned, when the segment holds the next batch)."""
    model_name, model_version, request_id, parameters, output_names, slots, trace, _ = described
    request = BatchRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        trace=trace,
        inputs=[
            InputTensor(
                slot[0], slot[1], slot[2], read_tensor(buffer, slot, model, objects, copy=copy)
            )
            for slot in slots
        ],
        outputs=None if output_names is None else [RequestedOutput(n) for n in output_names],
        parameters=parameters,
    )
    request._flags = flags
    request._index = index
    return request


def describe_results(
    writer: SegmentWriter,
    results: list[Result | None],
    places: list[dict[str, Place] | None],
    objects: SharedObjects,
    bodies: list[list[Place]] | None = None,
) -> tuple[str, str, int, list[tuple[Any, ...]]]:
    """The reply to a batch over a worker's pipe: outputs with a place in a client's object
    written there, those lying in their request's body object (``bodies``: each request's
    inputs read there) described by their place there, the others written into the writer's
    segment. None: a rescheduled request (no response yet)."""
    laid = _laid_results(results, places, objects, bodies)
    tensors = [tensor for outputs in laid for tensor in outputs]
    name, size, slots = _written(writer, tensors, results)
    return "results", name, size, _described(results, slots, _pipe_head, ("none",))


def channel_reply(
    writer: SegmentWriter,
    results: list[Result | None],
    places: list[dict[str, Place] | None],
    objects: SharedObjects,
    bodies: list[list[Place]] | None = None,
) -> tuple[str, int, bytes, list[tuple[Any, ...]]]:
    """The reply to a batch over the core's channel: as :func:`describe_results`, but small
    outputs travel in the reply itself (:func:`inline_tensors`), and the results are as the
    channel carries them (:func:`channel_head`)."""
    laid = _laid_results(results, places, objects, bodies)
    tensors = [tensor for outputs in laid for tensor in outputs]
    inline = inline_tensors(tensors)
    if inline is not None:
        data, slots = inline
        name, size = "", 0
    else:
        data = b""
        name, size, slots = _written(writer, tensors, results)
    unanswered = ("error", "INTERNAL", "a request that is not decoupled was rescheduled")
    return name, size, data, _described(results, slots, channel_head, unanswered)


def _laid_results(
    results: list[Result | None],
    places: list[dict[str, Place] | None],
    objects: SharedObjects,
    bodies: list[list[Place]] | None,
) -> list[list[Laid]]:
    """Each result's outputs to describe (see :func:`laid_output`); a result whose outputs
    cannot be becomes the error."""
    laid: list[list[Laid]] = []
    for index, (result, placed) in enumerate(zip(results, places, strict=True)):
        if result is None or isinstance(result, TritonError):
            laid.append([])
            continue
        body = bodies[index] if bodies is not None else []
        try:
            laid.append([laid_output(t, placed, objects, body) for t in result.outputs])
        except TritonError as error:
            results[index] = error
            laid.append([])
    return laid


def _written(
    writer: SegmentWriter, tensors: list[Laid], results: list[Result | None]
) -> tuple[str, int, list[TensorSlot]]:
    """The tensors written into the writer's segment; when shared memory has no room for
    them, the batch fails: every result (but a rescheduled request's) becomes the error."""
    try:
        return write_tensors(writer, tensors) if tensors else ("", 0, [])
    except UnavailableError as full:
        results[:] = [None if result is None else full for result in results]
        return "", 0, []


def _pipe_head(
    model_name: str, model_version: Any, response_id: str | None, parameters: Any
) -> tuple[Any, ...]:
    return ("ok", model_name, model_version, response_id, parameters)


def _described(
    results: list[Result | None],
    slots: list[TensorSlot],
    head: Callable[[str, Any, str | None, Any], tuple[Any, ...]],
    unanswered: tuple[Any, ...],
) -> list[tuple[Any, ...]]:
    """Each result as a reply describes it: ``(*head, slots)`` (its outputs' slots, in
    order), ``("error", code, message)``, or ``unanswered`` (None: a rescheduled request)."""
    described: list[tuple[Any, ...]] = []
    position = 0
    for result in results:
        if result is None:
            described.append(unanswered)
        elif isinstance(result, TritonError):
            described.append(("error", result.code.value, result.message))
        else:
            count = len(result.outputs)
            parts = head(result.model_name, result.model_version, result.id, result.parameters)
            described.append((*parts, slots[position : position + count]))
            position += count
    return described


def laid_output(
    tensor: OutputTensor,
    places: dict[str, Place] | None,
    objects: SharedObjects,
    body: list[Place] | None = None,
) -> Laid:
    """An output to describe; one bound for a client's object is written there first, and
    one that lies in an input of ``body`` (the request's inputs in its body object) is
    described by its place there."""
    place = places.get(tensor.name) if places is not None else None
    if place is None and body and tensor.datatype != "BYTES":
        raw = raw_bytes(tensor.datatype, tensor.data)  # (a view, unless it must convert)
        found = objects.body_place_of(raw, body)
        if found is not None:
            return (tensor.name, tensor.datatype, tensor.shape, raw, found)
    window = None
    if place is not None:
        # Changed since the server looked: the server writes it, as in-process.
        with contextlib.suppress(TritonError):
            window = objects.window(place)
    if place is None or window is None:
        return (tensor.name, tensor.datatype, tensor.shape, tensor.data, None)
    raw = raw_bytes(tensor.datatype, tensor.data)
    SharedObjects.put(window, raw, tensor.name)
    return (tensor.name, tensor.datatype, tensor.shape, raw, place)
