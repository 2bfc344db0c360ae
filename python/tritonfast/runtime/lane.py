"""The scheduler of models whose requests the Rust core takes all the way: their lane
(:class:`tritonfast._core.Lane`) holds the version's queue, forms its batches on one driver
thread per instance, hands them to the instances' worker processes through shared memory and
the core's channel, and answers HTTP requests itself, writing their responses on their
connections. This module gives the lane what only Python has: requests that arrive through
Python (gRPC, the HTTP reference path, models' calls, ensembles) go into the same queue
(:meth:`LaneScheduler.infer`, :meth:`~LaneScheduler.submit`,
:meth:`~LaneScheduler.open_stream`), are answered from the driver threads once per batch
(:meth:`LaneScheduler._deliver`), and the workers are started again when they die.

A decoupled model's responses are streamed: each request's as its worker sends them, handed to
its stream here (:meth:`LaneScheduler._streamed`) or, for a gRPC stream's request the core
decoded, serialized by the core for the stream's writer.

A version takes this path (:func:`lane_eligible`) when every instance is a worker the core
can drive (:class:`CoreDriven`) and its scheduler is the default, the dynamic
batcher without shape tensors, or the sequence batcher (the core adds each request's control
inputs and implicit states) without iterative sequences, and without implicit state for a
decoupled model; everything else keeps the queue schedulers of :mod:`.scheduler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from tritonfast._core import (
    EventWriter,
    InferSignature,
    Lane,
    LaneCompletions,
    LaneTicket,
    LaneWorkerLink,
    OutStream,
    RequestQueue,
    SequenceBatcher,
)
from tritonfast._proto import model_config_pb2
from tritonfast.data import rawtensor
from tritonfast.data.types import (
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    protocol_parameters,
)
from tritonfast.errors import Code, InvalidArgumentError, TritonError, error_for
from tritonfast.memory.sharedmemory import NO_DATA
from tritonfast.runtime.handle import Handle
from tritonfast.runtime.histogram import Histogram, first_response_buckets
from tritonfast.runtime.instance import Caller
from tritonfast.runtime.modelinstance import ModelInstance
from tritonfast.runtime.responses import ResponseStream, Result, Room, Sink, settle, stream_room
from tritonfast.runtime.scheduler import (
    STOPPED_MESSAGE,
    UNLOADED_MESSAGE,
    Scheduler,
    answer_of,
    dynamic_queue,
    mark_enqueued,
    shape_checked_inputs,
    unsigned_parameter,
)
from tritonfast.runtime.sequence import batcher_for, core_controls, correlation_id
from tritonfast.runtime.validate import RequestValidator

log = logging.getLogger(__name__)

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
# How long a driver waits for a batch to fail while its worker cannot be started again,
# before it tries once more to start one.
_RETRY_WAIT_S = 0.2
_COMPUTE_STAMPS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


@runtime_checkable
class CoreDriven(Protocol):
    """An instance whose worker the core can drive (``backends/python/process.py``)."""

    def core_link(self, loop: asyncio.AbstractEventLoop) -> LaneWorkerLink:
        """The core's link to the current worker (its pipe watched on ``loop`` meanwhile)."""
        ...

    def core_died(self) -> TritonError:
        """The worker went away in a batch: see it out; the error that batch gets."""
        ...

    def core_restart(self) -> TritonError | None:
        """Start a worker again; the error its batches get when it cannot."""
        ...

    core_running: Callable[[], bool] | None
    """Set by the scheduler: whether the core runs a batch on the instance now."""

    core_caller: Caller | None
    """Set by the scheduler: whose calls its model's calls to the server are."""


class StreamingDriven(CoreDriven, Protocol):
    """A worker the core drives whose model may be decoupled (``process.py``)."""

    def core_cancel(self, token: int) -> None:
        """Tell the worker that the consumer of stream ``token`` (a decoupled request whose
        batch returned) went away."""
        ...


class LaneCaller:
    """An instance the core drives, as the calls its model makes through the server's Python
    see it (:class:`~tritonfast.runtime.instance.Caller`): while a call is in flight during
    one of its batches, the instance counts as waiting on the server, in the lane's count,
    which the calls the core takes itself keep too."""

    def __init__(self, name: str, server: Handle, lane: Lane, index: int) -> None:
        self.name = name
        self.server: Handle | None = server
        self._lane = lane
        self._index = index

    def calls_server(self) -> None:
        """(Its batches never run on the event loop.)"""

    @contextlib.contextmanager
    def calling_server(self) -> Iterator[None]:
        self._lane.calling(self._index, True)
        try:
            yield
        finally:
            self._lane.calling(self._index, False)


# --backend-config=<backend>,core-path=on|off: whether the backend's versions the core can drive
# take its path (on by default; off keeps the server's Python on every request of them).
CORE_PATH_SETTING = "core-path"
CORE_PATH_VALUES = ("on", "off")


def core_path_on(backend: str, settings: Mapping[str, str]) -> bool:
    """Whether ``backend``'s settings leave the core's path on; Triton's kind of error for a
    value that is neither."""
    value = settings.get(CORE_PATH_SETTING, "on")
    if value not in CORE_PATH_VALUES:
        raise InvalidArgumentError(
            f"--backend-config={backend},{CORE_PATH_SETTING} must be one of"
            f" {', '.join(CORE_PATH_VALUES)}, not '{value}'"
        )
    return value == "on"


def lane_scheduler(
    name: str,
    config: model_config_pb2.ModelConfig,
    instances: list[ModelInstance],
    loop: asyncio.AbstractEventLoop,
    server: Handle | None,
    version: int,
    options: Mapping[str, bool],
    trace_token: Callable[[Any], int] | None = None,
    model_dir: Path | None = None,
) -> LaneScheduler | None:
    """A backend's version on the core's path: its :class:`LaneScheduler` when ``server``
    can take one (None: it cannot, the backend schedules the version its own way). The
    backend has decided that the core takes it (:func:`core_path_on`, :func:`lane_eligible`).
    ``model_dir`` holds what the config refers to (initial states' files)."""
    if server is None or server.lane_completions is None:
        return None
    return LaneScheduler(
        name,
        config,
        instances,
        loop,
        version=str(version),
        server=server,
        completions=server.lane_completions,
        latency_summaries=bool(options.get("latency_summaries")),
        histogram_latencies=bool(options.get("histogram_latencies")),
        trace_token=trace_token,
        model_dir=model_dir,
    )


def lane_eligible(config: model_config_pb2.ModelConfig, instances: list[ModelInstance]) -> bool:
    """Whether the core can take ``config``'s requests all the way to ``instances``."""
    if not instances:
        return False
    if config.HasField("ensemble_scheduling"):
        return False
    if config.HasField("sequence_batching"):
        batching = config.sequence_batching
        if batching.iterative_sequence:
            return False
        if batching.state and config.model_transaction_policy.decoupled:
            return False  # (the reference scheduler gives them their initial states only)
    if any(shape_checked_inputs(config).values()):  # shape tensors: batched by content
        return False
    if config.dynamic_batching.preserve_ordering and len(instances) > 1:
        return False
    return all(isinstance(i, CoreDriven) for i in instances)


def signature_of(config: model_config_pb2.ModelConfig) -> InferSignature:
    """``config``'s inputs and outputs as the core checks requests against them (those of
    the reference path's validator)."""
    validator = RequestValidator(config)
    return InferSignature(
        config.name,
        config.max_batch_size,
        [(s.name, s.datatype, list(s.dims), s.optional) for s in validator.inputs.values()],
        list(validator.outputs),
    )


class LaneScheduler(Scheduler):
    """A version's requests through its :class:`~tritonfast._core.Lane` (module docstring)."""

    def __init__(
        self,
        name: str,
        config: model_config_pb2.ModelConfig,
        instances: list[ModelInstance],
        loop: asyncio.AbstractEventLoop,
        *,
        version: str,
        server: Handle,
        completions: LaneCompletions,
        latency_summaries: bool = False,
        histogram_latencies: bool = False,
        trace_token: Callable[[Any], int] | None = None,
        model_dir: Path | None = None,
    ) -> None:
        self._loop = loop
        # A decoupled model's requests' responses are streamed (see _streamed); the time to
        # each request's first is kept with histogram_latencies.
        self._decoupled = config.model_transaction_policy.decoupled
        self._first_response: Histogram | None = None
        if histogram_latencies and self._decoupled:
            self._first_response = Histogram(first_response_buckets(config))
        self._unloading = False  # (streamed responses are held back no more then)
        # A traced request's token for its worker (the parent of the calls its model makes).
        self._trace_token = trace_token
        self._name = name
        self._instances = instances
        self._metrics = server.custom_metrics.workers
        dynamic = config.HasField("dynamic_batching") and config.max_batch_size > 0
        self._sequences = config.HasField("sequence_batching")
        # The queue rules of the scheduler this one stands in for.
        template: RequestQueue | SequenceBatcher
        if self._sequences:
            template = batcher_for(
                config.name, config, len(instances), latency_summaries=latency_summaries
            )
        elif dynamic:
            template = dynamic_queue(config, latency_summaries=latency_summaries)
        else:
            template = RequestQueue(latency_summaries=latency_summaries)
        self.lane = Lane(
            signature_of(config),
            version,
            template,
            completions,
            self._deliver,
            dynamic=dynamic,
            keyed_inputs=list(shape_checked_inputs(config)),
            keyed_by_names=any(tensor.optional for tensor in config.input),
            instances=len(instances),
            registry=server.lane_registry,
            controls=core_controls(config, model_dir) if self._sequences else None,
            regions=server.shared_memory_regions,
            streamed=self._streamed if self._decoupled else None,
            cancel_stream=self._cancel_stream if self._decoupled else None,
        )
        for index, instance in enumerate(instances):
            driven = cast(CoreDriven, instance)
            driven.core_running = functools.partial(self.lane.running, index)
            driven.core_caller = LaneCaller(f"{name}_{index}", server, self.lane, index)
        self._threads = [
            threading.Thread(
                target=self._drive, args=(index, instance), name=f"{name}_{index}", daemon=True
            )
            for index, instance in enumerate(instances)
        ]
        for thread in self._threads:
            thread.start()

    # -- the drivers ------------------------------------------------------------------------
    def _drive(self, index: int, instance: Any) -> None:
        """Instance ``index``'s batches, run by the core on its worker until the lane closes;
        a worker that dies fails its batch and is started again."""
        try:
            link = instance.core_link(self._loop)
            while self.lane.drive(index, link) == "died":
                del link  # its channel and segments go with the worker
                error = instance.core_died()
                self.lane.fail_held(index, error.code.value, error.message)
                if not self._restart(index, instance):
                    return
                link = instance.core_link(self._loop)
        except Exception:  # a bug: the version's requests would wait forever
            log.exception("the driver of %s_%d failed", self._name, index)
            failed = f"the driver of {self._name} failed"
            self.lane.abandon(Code.INTERNAL.value, failed)
            self.lane.end_streams(Code.INTERNAL.value, failed)

    def _restart(self, index: int, instance: Any) -> bool:
        """Start the worker again; while it cannot, each batch fails with why. False once the
        lane is closed and empty."""
        while True:
            failed = instance.core_restart()
            if failed is None:
                return True
            while True:
                answered = self.lane.fail_next(
                    index, failed.code.value, failed.message, _RETRY_WAIT_S
                )
                if answered is None:
                    return False
                if answered:
                    break  # the next batch tries to start it again

    def _deliver(self, items: list[tuple[Any, tuple[Any, ...]]], extra: bytes, marks: Any) -> None:
        """On a driver thread: a batch's answers to requests that came through Python, and the
        worker's custom metrics when they changed."""
        if extra:
            source, state = pickle.loads(extra)
            self._metrics.update(source, state)
        on_loop: list[tuple[Any, Any]] = []
        for sink, described in items:
            if type(sink) is not _Sink:  # a frontend's (LaneAnswer): it reads the answer
                if not sink.send_early(described):
                    on_loop.append((sink, described))
                continue
            result = response_of(described)
            if marks[0]:
                _count(sink.request, marks)
            if type(sink.target) is Future:  # a caller waiting on another thread
                settle(sink.target, result, True)
            else:
                on_loop.append((sink, result))
        if on_loop:
            with contextlib.suppress(RuntimeError):  # the loop is gone: so are the callers
                self._loop.call_soon_threadsafe(_settle_all, on_loop)

    def _streamed(self, items: list[tuple[Any, tuple[Any, ...] | None, bool]]) -> None:
        """On a worker's reader thread: a decoupled model's responses, as the worker sent
        them (a result None: a bare final flag, or, to a gRPC stream's request whose replies
        the core queues on its call, not final, the call's sending to start); then held back
        while a stream they went to has as many waiting as its client may be ahead."""
        on_loop: list[tuple[Any, Any, bool]] = []
        for sink, described, final in items:
            if type(sink) is not _Sink:  # a frontend's (a gRPC stream's request): it reads it
                if sink.direct:  # it writes each reply from here; the loop sees it end
                    sink.write_here(described, final)
                    if final:
                        on_loop.append((sink, None, final))
                    continue
                on_loop.append((sink, described, final))
                continue
            result = None if described is None else response_of(described)
            target = sink.target
            if type(target) is Future:  # a caller waiting on another thread
                settle(target, result, final)
                continue
            on_loop.append((sink, result, final))
        if on_loop:
            with contextlib.suppress(RuntimeError):  # the loop is gone: so are the callers
                self._loop.call_soon_threadsafe(self._settle_streamed, on_loop)
        self._hold_back(items)

    def _hold_back(self, items: list[tuple[Any, Any, bool]]) -> None:
        """Backpressure: while a stream just sent to holds :data:`STREAM_BUFFER` responses
        its client has not taken (or a gRPC stream's writer as many replies), this worker's
        responses wait here, and so, once the channel fills, do its model's sends. Not once
        the model is unloading: its requests must be able to finish."""
        for sink, described, final in items:
            room = sink.room
            if not final and described is not None and room is not None:
                room.wait(self._stopping)

    def _stopping(self) -> bool:
        return self._unloading

    def _settle_streamed(self, items: list[tuple[Any, Any, bool]]) -> None:
        """On the event loop: streamed responses, in the order they came (a frontend's
        request's first one observed here; Python's requests' in open_stream)."""
        histogram = self._first_response
        for sink, result, final in items:
            if type(sink) is _Sink:
                settle(sink.target, result, final)
                continue
            if histogram is not None:
                elapsed = sink.time_to_first(perf_counter_ns())
                if elapsed is not None:
                    histogram.observe(elapsed / 1e6)
            sink.streamed(result, final)

    def _cancel_stream(self, instance: int, token: int) -> None:
        """The consumer of an open stream (its batch over) went away: its worker is told."""
        cast(StreamingDriven, self._instances[instance]).core_cancel(token)

    # -- taking requests --------------------------------------------------------------------
    def _enqueue(
        self,
        request: InferRequest,
        sink: Sink,
        batch_size: int,
        streamed: bool = False,
        events: EventWriter | None = None,
    ) -> LaneTicket:
        """``streamed``: ``sink`` is a stream its responses are held back for (see
        _hold_back); ``events``: the writer of its responses as Server-Sent Events."""
        mark_enqueued(request, sink)
        params = request.parameters
        protocol = protocol_parameters(params)
        priority = timeout = 0  # (the lane applies them only under the dynamic batcher)
        if protocol:
            priority = unsigned_parameter(protocol.get("priority", 0), _U32)
            timeout = unsigned_parameter(protocol.get("timeout", 0), _U64)
        # (A decoupled request outlives its batch: its worker gets copies, and its responses
        # are not written into a client's memory there.)
        places = None if self._decoupled else request.input_places
        inputs = [
            (t.name, t.datatype, list(t.shape), *_input_data(t, places)) for t in request.inputs
        ]
        outputs = None if request.outputs is None else [o.name for o in request.outputs]
        output_places = None
        if request.output_places and not self._decoupled:
            output_places = [(n, _place(p)) for n, p in request.output_places.items()]
        text = json.dumps(params, default=str) if params else ""
        trace = 0
        if request.trace is not None and self._trace_token is not None:
            trace = self._trace_token(request.trace)
        sequence = None
        if self._sequences:
            sequence = (
                correlation_id(protocol),
                bool(protocol.get("sequence_start")),
                bool(protocol.get("sequence_end")),
            )
        return self.lane.submit(
            request.id,
            inputs,
            outputs,
            output_places,
            text,
            priority,
            timeout,
            batch_size,
            _Sink(sink, request, stream_room(sink) if streamed else None),
            trace,
            sequence,
            events,
        )

    async def infer(self, request: InferRequest, batch_size: int) -> InferResponse:
        future: asyncio.Future[Any] = self._loop.create_future()
        ticket = self._enqueue(request, future, batch_size)
        return await answer_of(future, request, lambda: self.lane.cancel(ticket))

    def submit(self, request: InferRequest, batch_size: int, sink: Future[Any]) -> bool:
        self._enqueue(request, sink, batch_size)
        return True

    def open_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        stream = ResponseStream(self._loop)
        # (A decoupled model's responses may be written as events by the core itself.)
        events = request.event_writer if self._decoupled else None
        started = perf_counter_ns()
        ticket = self._enqueue(request, stream, batch_size, self._decoupled, events)
        self._watch(stream, ticket, events, started)
        return stream

    def _watch(
        self,
        stream: ResponseStream,
        ticket: LaneTicket,
        events: EventWriter | None,
        started: int,
    ) -> None:
        """A request queued at ``started`` (``perf_counter_ns``): the time to its first
        response observed, its consumer going away cancelling it."""
        lane = self.lane
        histogram = self._first_response
        if histogram is not None:

            def first() -> None:
                # (The core's writer wrote the first response before the stream heard of it.)
                at = (events.first_at if events is not None else 0) or perf_counter_ns()
                histogram.observe((at - started) / 1e6)

            stream.on_first(first)

        def cancel() -> None:
            lane.cancel(ticket)

        stream.on_cancel(cancel)

    # -- state ------------------------------------------------------------------------------
    def core_lane(self) -> Lane:
        return self.lane

    def waiting_on_server(self) -> bool:
        return self.lane.stuck()

    def statistics(self) -> dict[str, Any]:
        return self.lane.statistics()

    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        return self.lane.latency_summaries(quantiles)

    def pending(self) -> int:
        return len(self.lane)

    def first_response_histogram(self) -> Histogram | None:
        return self._first_response

    def stop(self, timeout: float) -> None:
        self.lane.close()
        self._unloading = True
        for instance in self._instances:
            instance.unloading()
        deadline = time.monotonic() + timeout
        for instance in self._instances:
            instance.stop_by(deadline)
        # (A driver returns once its queue is empty and its decoupled streams have ended.)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        # Time is up: what is still queued is answered, streams still open end, the workers
        # finalize (one still running a batch is stopped, which fails that batch), the
        # drivers end.
        self.lane.abandon(Code.UNAVAILABLE.value, UNLOADED_MESSAGE)
        self.lane.end_streams(Code.UNAVAILABLE.value, STOPPED_MESSAGE)
        for instance in self._instances:
            instance.finalize()
        for thread in self._threads:
            thread.join(5.0)
        self.lane.abandon(Code.UNAVAILABLE.value, UNLOADED_MESSAGE)


class CoreLane(Protocol):
    """Where a frontend hands an inference request whole: a model version's
    :class:`~tritonfast._core.Lane`, or an :class:`~tritonfast._core.EnsembleLane` (an
    ensemble whose steps all run on lanes, run by the core). A submit returns what
    :meth:`cancel` takes, or None when the reference path must answer the request."""

    def submit_http(
        self,
        body: bytes | np.ndarray,
        json_length: int,
        stream: OutStream,
        minor: int,
        keep_alive: bool,
        token: int,
        body_object: tuple[str, int, int] | None = None,
    ) -> object | None: ...

    def submit_generate_http(
        self, body: bytes | np.ndarray, stream: OutStream, minor: int, keep_alive: bool, token: int
    ) -> object | None: ...

    def submit_generate_events(
        self, body: bytes | np.ndarray, stream: OutStream, token: int
    ) -> object | None: ...

    def submit_grpc(self, message: bytes, sink: Any) -> object | None: ...

    def cancel(self, ticket: Any) -> bool: ...


class LaneAnswer(Protocol):
    """A frontend's sink (a gRPC call the core answers whole): reads the answer as the core
    described it, on the driver thread and then, unless that settled it, on the event loop."""

    def send_early(self, described: tuple[Any, ...]) -> bool:
        """On the driver thread, first: what of the answer may go out from there; True when
        nothing is left for :meth:`answered`."""
        ...

    def answered(self, described: tuple[Any, ...]) -> None: ...


def response_of(described: tuple[Any, ...]) -> Result:
    """A request's result as the lane describes it: an ``InferResponse`` or an error."""
    if described[0] == "error":
        return error_for(Code(described[1]), described[2])
    _, model_name, model_version, response_id, parameters, outputs = described
    return InferResponse(
        model_name,
        model_version,
        response_id,
        [
            OutputTensor(name, datatype, shape, NO_DATA, in_shared_memory=True)
            if in_place  # the worker wrote it into the client's shared memory
            else OutputTensor(
                name, datatype, shape, rawtensor.from_raw(datatype, shape, raw, name, model_name)
            )
            for name, datatype, shape, raw, in_place in outputs
        ],
        json.loads(parameters) if parameters else {},
    )


class _Sink:
    """What the lane hands back with a Python request's result: where it goes, the request
    (for its trace and phase counts), and for a streamed one how far its consumer may fall
    behind."""

    __slots__ = ("request", "room", "target")

    def __init__(self, target: Sink, request: InferRequest, room: Room | None = None) -> None:
        self.target = target
        self.request = request
        self.room = room


def _settle_all(items: list[tuple[Any, Any]]) -> None:
    """On the event loop: a batch's answers (to frontends' sinks, as the lane described
    them)."""
    for sink, result in items:
        if type(sink) is _Sink:
            settle(sink.target, result, True)
        else:
            sink.answered(result)


def _count(request: InferRequest, marks: Any) -> None:
    """A request's trace stamps and phase counts from its batch's compute marks."""
    start, input_end, output_start, end = marks
    if request.trace is not None:
        for name, ns in zip(_COMPUTE_STAMPS, marks, strict=True):
            request.trace.stamp(name, ns)
    phases = request.phases
    if phases is not None:
        if phases.enqueued:
            phases.queue += max(0, start - phases.enqueued)
        phases.compute_input += input_end - start
        phases.compute_infer += output_start - input_end
        phases.compute_output += end - output_start


def _input_data(tensor: InputTensor, places: dict[str, Any] | None) -> tuple[np.ndarray, Any]:
    """An input's wire bytes, and where the worker finds it in a client's shared memory when
    it can read it there (else None: the bytes are copied for it)."""
    place = places.get(tensor.name) if places is not None else None
    if place is not None and place.still_registered():
        return np.ascontiguousarray(tensor.data).reshape(-1).view(np.uint8), _place(place)
    return _wire_bytes(tensor.datatype, tensor.data), None


def _place(place: Any) -> tuple[str, int, int, int, int]:
    """An ObjectPlace as the core takes it."""
    return (place.path, place.device, place.inode, place.offset, place.byte_size)


def _wire_bytes(datatype: str, data: Any) -> np.ndarray:
    """A tensor's wire bytes as a C-contiguous uint8 array."""
    raw = rawtensor.to_raw(datatype, data)
    if isinstance(raw, bytes | bytearray | memoryview):
        return np.frombuffer(raw, np.uint8)
    return np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
