"""How a model version's requests reach its instances: the scheduler interface, and the
schedulers that stand in front of the Rust core's queues (:class:`DefaultScheduler`,
:class:`DynamicBatchScheduler`, :class:`SequenceScheduler`). An ensemble's scheduler, which has
no queue of its own, is :class:`~tritonfast.backends.ensemble.scheduler.EnsembleScheduler`.

Every scheduler takes a request in one of two ways: :meth:`Scheduler.infer` for a request
whose single response the caller awaits, :meth:`Scheduler.open_stream` for a request whose
responses the caller iterates (any model; the only way to a decoupled model's responses).
Both queue the request at once and raise Triton's error if it cannot be queued.

:class:`DynamicBatchScheduler` (``dynamic_batching`` with ``max_batch_size > 0``) applies every
field of Triton's ``ModelDynamicBatching``: preferred sizes, ``max_queue_delay_microseconds``,
priority levels with per-level queue policies (``max_queue_size``, timeouts with REJECT or
DELAY, ``allow_timeout_override``) and ``preserve_ordering``. A request's ``priority`` and
``timeout`` (microseconds) come from its parameters; requests batch together only when the
inputs whose shapes must match (variable-size inputs without ``allow_ragged_batch``, shape
tensors, and the set of inputs when some are optional) agree. :class:`DefaultScheduler` is
Triton's default scheduler: FIFO to idle instances, one request per execution, priorities and
timeouts ignored. :class:`SequenceScheduler` (``sequence_batching``) puts requests into the
Rust sequence batcher (see :mod:`.sequence`).

Each instance takes its batches from its own source: by default all instances of a version
share one queue; a scheduler that sets :attr:`QueueScheduler.per_instance_queues` gives each
instance a queue of its own (all recording into one set of statistics) and chooses the
instance for each request with :meth:`QueueScheduler.route`.

A request whose caller goes away (client disconnect, gRPC cancel) is removed from the queue if
it has not started; a running one is flagged (see :func:`.responses.is_cancelled`) and what it
answers is dropped.

:meth:`Scheduler.statistics` returns the model version's counters, in the layout of one
``model_stats`` entry of Triton's statistics extension (without ``name`` and ``version``)::

    {
        "last_inference": int,      # ms since the epoch when the last execution ended; 0: none
        "inference_count": int,     # sum of the batch sizes of successful requests
        "execution_count": int,     # model executions (batches)
        "inference_stats": {        # each {"count": int, "ns": int} (cumulative nanoseconds)
            "success": ..., "fail": ...,     # requests, with their request durations
            "queue": ...,                    # enqueue until an instance took the request
            "compute_input": ..., "compute_infer": ..., "compute_output": ...,
            "cache_hit": ..., "cache_miss": ...,   # zero; filled by ModelVersion.counters()
        },
        "batch_stats": [            # per executed batch size, smallest first
            {"batch_size": int, "compute_input": {"count", "ns"},
             "compute_infer": {...}, "compute_output": {...}},
        ],
        "failure_reasons": {"REJECTED": int, "CANCELED": int, "BACKEND": int, "OTHER": int},
    }

``success``, ``queue`` and the ``compute_*`` counts are per request (each request of a batch
adds its batch's compute durations); ``batch_stats`` counts executions. ``failure_reasons`` is
not part of Triton's JSON: it feeds ``nv_inference_request_failure{reason=...}``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from tritonfast._core import QUEUE_FULL_MESSAGE, Batch, QueuePolicy, RequestQueue, Ticket
from tritonfast._proto import model_config_pb2
from tritonfast.data.rawtensor import request_prefix
from tritonfast.data.types import (
    MODEL_PARAMETERS_ONLY,
    InferRequest,
    InferResponse,
    protocol_parameters,
)
from tritonfast.errors import CancelledError, TritonError, UnavailableError
from tritonfast.runtime.handle import Handle
from tritonfast.runtime.histogram import Histogram, first_response_buckets
from tritonfast.runtime.instance import InstanceLoop, Settle
from tritonfast.runtime.looprun import LoopExecution
from tritonfast.runtime.modelinstance import ModelInstance
from tritonfast.runtime.responses import (
    ResponseSender,
    ResponseStream,
    Result,
    Sink,
    is_cancelled,
    settle,
)
from tritonfast.runtime.sequence import (
    Controls,
    LoopDriver,
    SequenceInstance,
    SlotSource,
    SlotStates,
    batcher_for,
    correlation_id,
    slots_per_instance,
    state_specs,
)

if TYPE_CHECKING:
    from tritonfast.runtime.lane import CoreLane

# Triton's answer to a request whose queue timeout expired under the REJECT action.
REQUEST_TIMEOUT_MESSAGE = "Request timeout expired"
# Triton's answer to a request that arrives while the model's scheduler is stopping.
STOPPING_MESSAGE = (
    "Server is stopping, scheduler for model has stopped accepting new inference requests"
)
# What the requests of a sequence are answered with when an earlier one of it was cancelled.
SEQUENCE_CANCELLED_MESSAGE = "an earlier request of this sequence was cancelled"
# ... and a rescheduled request whose caller went away while it ran.
RESCHEDULED_CANCELLED_MESSAGE = "the request was cancelled"
# ... and a request of a sequence that waited in the backlog past a request's timeout.
SEQUENCE_EXPIRED_MESSAGE = "timeout of the corresponding sequence has been expired"
# What a decoupled request still open when its model stops is answered with.
STOPPED_MESSAGE = "the model stopped before it sent the final response of this request"
# What a request still queued or running when its model's time to stop (the exit timeout) is
# over is answered with.
UNLOADED_MESSAGE = (
    "the model was unloaded before the request finished: its queued and running requests had"
    " the exit timeout (--exit-timeout-secs) to finish"
)

# The correlation IDs given to requests of iterative sequence models that come without one:
# from high in the uint64 range, clear of the IDs clients choose.
ITERATIVE_IDS_FROM = 1 << 62

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_TIMEOUT_ACTIONS: dict[int, Literal["REJECT", "DELAY"]] = {
    model_config_pb2.ModelQueuePolicy.REJECT: "REJECT",
    model_config_pb2.ModelQueuePolicy.DELAY: "DELAY",
}


class Scheduler(abc.ABC):
    """Takes a model version's requests and hands them to its instances."""

    @abc.abstractmethod
    async def infer(self, request: InferRequest, batch_size: int) -> InferResponse:
        """Queue a single-response request and await its response (its error is raised)."""

    def submit(self, request: InferRequest, batch_size: int, sink: Future[Any]) -> bool:
        """Queue a single-response request from any thread, its response to be set on
        ``sink``; False when this scheduler cannot (the caller then uses :meth:`infer`)."""
        return False

    @abc.abstractmethod
    def open_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        """Queue ``request`` and return the stream of its responses (on the event loop).
        The caller must :meth:`~.ResponseStream.cancel` it if it stops reading early."""

    @abc.abstractmethod
    def statistics(self) -> dict[str, Any]:
        """The model version's statistics (layout in the module docstring)."""

    @abc.abstractmethod
    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        """``{name: (count, sum_us, [(quantile, us)])}`` when summaries are kept, else None."""

    @abc.abstractmethod
    def pending(self) -> int:
        """Requests waiting, not yet taken by an instance."""

    def first_response_histogram(self) -> Histogram | None:
        """Milliseconds from each decoupled request's arrival to its first response, when
        kept (``histogram_latencies``)."""
        return None

    def waiting_on_server(self) -> bool:
        """Whether every instance is blocked in a call to the server (BLS): a request from
        one of those calls could then never run."""
        return False

    @property
    def runs_on_loop(self) -> bool:
        """Whether the model's batches run on the event loop now (see looprun)."""
        return False

    def core_lane(self) -> CoreLane | None:
        """Where the core takes the version's requests all the way, when it does (see
        runtime.lane)."""
        return None

    @abc.abstractmethod
    def stop(self, timeout: float) -> None:
        """Stop taking work, let queued and running requests finish for at most ``timeout``
        seconds, answer what is left then with an error, and finalize the instances: every
        request gets an answer by the end of ``timeout``. Called off the event loop."""


class QueueScheduler(Scheduler):
    """Requests go through Rust request queues; one :class:`InstanceLoop` per instance takes
    its batches from its own source and runs them. Subclasses decide the queue's rules
    (:meth:`_new_queue`) and what each request is pushed with (:meth:`_push`)."""

    # One queue per instance (requests placed by route()) instead of one shared queue.
    per_instance_queues: ClassVar[bool] = False

    def __init__(
        self,
        name: str,
        config: model_config_pb2.ModelConfig,
        instances: list[ModelInstance],
        loop: asyncio.AbstractEventLoop,
        *,
        latency_summaries: bool = False,
        histogram_latencies: bool = False,
        loop_execution: bool = False,
        server: Handle | None = None,
    ) -> None:
        self._loop = loop
        self._decoupled = config.model_transaction_policy.decoupled
        self._first_response: Histogram | None = None
        if histogram_latencies and self._decoupled:
            self._first_response = Histogram(first_response_buckets(config))
        self._configure(config)
        first = self._new_queue(config, latency_summaries=latency_summaries)
        self._queues = [first]
        if self.per_instance_queues:
            self._queues += [
                self._new_queue(
                    config, latency_summaries=latency_summaries, share_statistics_with=first
                )
                for _ in instances[1:]
            ]
        preserve_ordering = config.dynamic_batching.preserve_ordering
        # preserve_ordering: batches settle in the order they left the queue.
        self._next_seq = 0
        self._held: dict[int, tuple[list[Sink], Sequence[Result | None] | None]] = {}
        deliver = self._deliver_in_order if preserve_ordering else self._deliver
        # Decoupled requests' senders still open, to end them if the model stops first.
        self._senders: weakref.WeakSet[ResponseSender] = weakref.WeakSet()
        # Short executions may run on the event loop (see looprun) when every instance can.
        self._on_loop: LoopExecution | None = None
        if (
            loop_execution
            and not self.per_instance_queues
            and all(
                instance.may_run_on_event_loop or instance.runs_elsewhere for instance in instances
            )
        ):
            self._on_loop = LoopExecution(name, first, loop)
        on_loop = self._on_loop
        settle = self._settle_in_order if preserve_ordering else self._settle_batch
        self._instances = [
            InstanceLoop(
                f"{name}_{index}",
                self._queues[index if self.per_instance_queues else 0],
                instance,
                deliver,
                self._reject,
                handoff=None if on_loop is None else (on_loop.handoff, index),
                observe=None if on_loop is None or instance.runs_elsewhere else on_loop.observe,
                on_server_call=None if on_loop is None else on_loop.calls_server,
                through_loop=(loop, settle),
                server=server,
            )
            for index, instance in enumerate(instances)
        ]
        if on_loop is not None:
            on_loop.start(self._instances, settle)
        self._start_instances(settle)

    def _start_instances(self, settle: Settle) -> None:
        """Start taking batches: each instance on its own thread."""
        for instance_loop in self._instances:
            instance_loop.start()

    # -- what subclasses decide -------------------------------------------------------------
    def _configure(self, config: model_config_pb2.ModelConfig) -> None:
        """Read what :meth:`_push` needs from ``config`` (before any queue is made)."""

    @abc.abstractmethod
    def _new_queue(self, config: model_config_pb2.ModelConfig, **options: Any) -> RequestQueue:
        """A queue with this scheduler's rules, made with ``options`` (``latency_summaries``,
        and ``share_statistics_with`` for the queues of the second instance on)."""

    @abc.abstractmethod
    def _push(
        self, queue: RequestQueue, request: InferRequest, sink: Sink, batch_size: int
    ) -> Ticket:
        """Push ``(request, sink)`` onto ``queue``."""

    def route(self, request: InferRequest) -> int:
        """Which instance's queue takes ``request`` (with :attr:`per_instance_queues`)."""
        return 0

    # -- taking requests --------------------------------------------------------------------
    async def infer(self, request: InferRequest, batch_size: int) -> InferResponse:
        future: asyncio.Future[Any] = self._loop.create_future()
        queue, ticket = self._enqueue(request, future, batch_size)
        return await answer_of(future, request, lambda: queue.cancel(ticket))

    def submit(self, request: InferRequest, batch_size: int, sink: Future[Any]) -> bool:
        self._enqueue(request, sink, batch_size)
        return True

    def open_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        stream = ResponseStream(self._loop)
        if self._decoupled:
            sender = request.sender = ResponseSender(stream, request.id, decoupled=True)
            self._senders.add(sender)
        queue, ticket = self._enqueue(request, stream, batch_size)
        histogram = self._first_response
        if histogram is not None:
            started = perf_counter_ns()
            stream.on_first(lambda: histogram.observe((perf_counter_ns() - started) / 1e6))

        # Holds the ticket, not the request: a sender the model drops must be collectable. A
        # running request sees the cancellation through its stream (responses.is_cancelled).
        def cancel() -> None:
            queue.cancel(ticket)

        stream.on_cancel(cancel)
        return stream

    def _enqueue(
        self, request: InferRequest, sink: Sink, batch_size: int
    ) -> tuple[RequestQueue, Ticket]:
        mark_enqueued(request, sink)
        queue = self._queues[self.route(request)] if self.per_instance_queues else self._queues[0]
        try:
            return queue, self._push(queue, request, sink, batch_size)
        except UnavailableError as exc:
            # Triton prefixes these with the request id ("<id_unknown>" without one).
            prefix = request_prefix(request.id)
            if exc.message == QUEUE_FULL_MESSAGE:
                raise UnavailableError(prefix + QUEUE_FULL_MESSAGE) from None
            if queue.closed:
                raise UnavailableError(prefix + STOPPING_MESSAGE) from None
            raise

    # -- state ----------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        return self._queues[0].statistics()  # per-instance queues share one set

    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        return self._queues[0].latency_summaries(quantiles)

    def pending(self) -> int:
        return sum(len(queue) for queue in self._queues)

    def first_response_histogram(self) -> Histogram | None:
        return self._first_response

    def waiting_on_server(self) -> bool:
        return all(instance.waiting_on_server for instance in self._instances)

    @property
    def runs_on_loop(self) -> bool:
        return self._on_loop is not None and self._on_loop.on_loop

    def stop(self, timeout: float) -> None:
        if self._on_loop is not None:
            self._on_loop.stop()
        for queue in self._queues:
            queue.close()
        for instance_loop in self._instances:
            instance_loop.unloading()
        deadline = time.monotonic() + timeout  # for all the instances together
        for instance_loop in self._instances:
            instance_loop.join(max(0.0, deadline - time.monotonic()))
        if self._on_loop is not None:
            self._on_loop.unwatch()
        self._finish_stopping(deadline)

    def _finish_stopping(self, deadline: float) -> None:
        """Once the time to stop is over: answer every request still queued or running, then
        finalize the instances (a worker still running a batch is stopped) and end the
        decoupled streams still open."""
        error = UnavailableError(UNLOADED_MESSAGE)
        for instance_loop in self._instances:
            instance_loop.abandon(error)
        for queue in self._queues:
            left = queue.abandon()
            if left:
                with contextlib.suppress(RuntimeError):  # the loop is gone: so are the callers
                    self._loop.call_soon_threadsafe(_fail, [item[1] for item in left], error)
        for instance_loop in self._instances:
            instance_loop.finalize(deadline)
        for sender in list(self._senders):
            sender.abandon(UnavailableError(STOPPED_MESSAGE))

    # -- completions (called on instance threads; settle on the event loop) ------------------
    def _deliver(
        self, seq: int, sinks: list[Sink], results: Sequence[Result | None] | None
    ) -> None:
        if results is None:
            return
        if all(type(sink) is Future for sink in sinks):
            # Only callers waiting on other threads (runtime.handle): answered from here.
            _settle(seq, sinks, results)
        else:
            self._loop.call_soon_threadsafe(_settle, seq, sinks, results)

    def _deliver_in_order(
        self, seq: int, sinks: list[Sink], results: Sequence[Result | None] | None
    ) -> None:
        self._loop.call_soon_threadsafe(self._settle_in_order, seq, sinks, results)

    def _settle_batch(
        self, seq: int, sinks: list[Sink], results: Sequence[Result | None] | None
    ) -> None:
        """Runs on the event loop: answer one batch's requests."""
        _settle(seq, sinks, results)

    def _settle_in_order(
        self, seq: int, sinks: list[Sink], results: Sequence[Result | None] | None
    ) -> None:
        """Runs on the event loop: settle batches strictly in the order they left the queue."""
        held = self._held
        held[seq] = (sinks, results)
        while (ready := held.pop(self._next_seq, None)) is not None:
            self._next_seq += 1
            self._settle_batch(self._next_seq - 1, *ready)

    def _reject(self, batch: Batch) -> None:
        sinks = [item[1] for item in batch.rejected]
        self._loop.call_soon_threadsafe(_fail, sinks, UnavailableError(REQUEST_TIMEOUT_MESSAGE))


class DefaultScheduler(QueueScheduler):
    """Triton's default scheduler: one request per execution, FIFO to idle instances."""

    def _new_queue(self, config: model_config_pb2.ModelConfig, **options: Any) -> RequestQueue:
        return RequestQueue(**options)

    def _push(
        self, queue: RequestQueue, request: InferRequest, sink: Sink, batch_size: int
    ) -> Ticket:
        # One request per execution; the batch size only feeds the statistics.
        return queue.push_cancellable((request, sink), max(batch_size, 1))


class DynamicBatchScheduler(QueueScheduler):
    """Triton's dynamic batcher (see the module docstring)."""

    def _configure(self, config: model_config_pb2.ModelConfig) -> None:
        # Inputs whose shape (True: and content) must match within a batch.
        self._keyed = shape_checked_inputs(config)
        self._optional_inputs = any(tensor.optional for tensor in config.input)
        self._needs_shape_key = bool(self._keyed) or self._optional_inputs

    def _new_queue(self, config: model_config_pb2.ModelConfig, **options: Any) -> RequestQueue:
        return dynamic_queue(config, **options)

    def _push(
        self, queue: RequestQueue, request: InferRequest, sink: Sink, batch_size: int
    ) -> Ticket:
        params = protocol_parameters(request.parameters)
        priority = unsigned_parameter(params.get("priority", 0), _U32) if params else 0
        timeout = unsigned_parameter(params.get("timeout", 0), _U64) if params else 0
        shape_key = self._shape_key(request) if self._needs_shape_key else 0
        return queue.push_cancellable((request, sink), batch_size, priority, timeout, shape_key)

    def _shape_key(self, request: InferRequest) -> int:
        """A hash of what must match for requests to share a batch (0 to 2**64 - 1)."""
        keyed = self._keyed
        parts: list[object] = []
        for tensor in request.inputs:
            with_content = keyed.get(tensor.name)
            if with_content is None:
                if self._optional_inputs:
                    parts.append(tensor.name)
            elif with_content:
                parts.append((tensor.name, tuple(tensor.shape[1:]), tensor.data.tobytes()))
            else:
                parts.append((tensor.name, tuple(tensor.shape[1:])))
        return hash(frozenset(parts)) & _U64


class SequenceScheduler(QueueScheduler):
    """Triton's sequence batcher (see :mod:`.sequence`): the Rust core pins each sequence to
    an instance slot; each instance takes its batches from its own :class:`SlotSource`."""

    per_instance_queues = True

    def __init__(
        self,
        name: str,
        config: model_config_pb2.ModelConfig,
        instances: list[ModelInstance],
        loop: asyncio.AbstractEventLoop,
        *,
        model_dir: Path | None = None,
        server: Handle | None = None,
        **options: bool,
    ) -> None:
        self._instance_count = len(instances)
        self._sources: list[SlotSource] = []
        controls = Controls(config)
        specs = state_specs(config, model_dir)
        slots = slots_per_instance(config)
        decoupled = config.model_transaction_policy.decoupled
        # An iterative sequence (Triton's "generative sequence"): each request is a sequence
        # of its own, run again for as long as its backend reschedules it.
        self._iterative = config.sequence_batching.iterative_sequence
        self._iteration_ids = itertools.count(ITERATIVE_IDS_FROM)
        iterations = self if self._iterative else None
        wrapped: list[ModelInstance] = [
            SequenceInstance(
                instance, controls, SlotStates(specs, slots), loop, decoupled, iterations
            )
            for instance in instances
        ]
        # Batches formed at once, for instances in worker processes: the loop takes them
        # itself (see LoopDriver), no instance thread.
        self._driver: LoopDriver | None = None
        self._loop_driven = bool(instances) and all(i.runs_elsewhere for i in wrapped)
        batching = config.sequence_batching
        if (
            batching.direct.max_queue_delay_microseconds
            or batching.oldest.max_queue_delay_microseconds
        ):
            self._loop_driven = False
        super().__init__(name, config, wrapped, loop, server=server, **options)

    def _start_instances(self, settle: Settle) -> None:
        if not self._loop_driven:
            super()._start_instances(settle)
            return
        self._driver = LoopDriver(
            self._loop, self._sources, self._instances, settle, _fail_sequence_rejected
        )

    def stop(self, timeout: float) -> None:
        driver = self._driver
        if driver is None:
            super().stop(timeout)
            return
        self._batcher.close()
        for instance_loop in self._instances:
            instance_loop.unloading()
        deadline = time.monotonic() + timeout
        driver.finish(timeout)
        self._finish_stopping(deadline)

    def _new_queue(self, config: model_config_pb2.ModelConfig, **options: Any) -> Any:
        if "share_statistics_with" not in options:  # the first instance's: make the batcher
            self._batcher = batcher_for(
                config.name,
                config,
                self._instance_count,
                latency_summaries=bool(options.get("latency_summaries")),
            )
        source = SlotSource(self._batcher, len(self._sources))
        self._sources.append(source)
        return source

    def _push(self, queue: Any, request: InferRequest, sink: Sink, batch_size: int) -> Any:
        params = protocol_parameters(request.parameters)
        if self._iterative and not correlation_id(params):
            # A request of an iterative sequence model needs no ID: it gets one of its own
            # (kept apart from the model's parameters when they are all the model's).
            if params is not request.parameters:
                params = request.parameters[MODEL_PARAMETERS_ONLY] = {}
            params["sequence_id"] = next(self._iteration_ids)
            params["sequence_start"] = True
        ticket = self._batcher.push(
            (request, sink),
            correlation_id(params),
            bool(params.get("sequence_start")),
            bool(params.get("sequence_end")),
            batch_size,
            unsigned_parameter(params.get("timeout", 0), _U64),
        )
        if self._driver is not None:
            self._driver.poke()
        return ticket

    # -- iterative sequences (runtime.sequence.Iterations) -----------------------------------
    def reschedule(self, request: InferRequest) -> None:
        """Queue a request its backend rescheduled again, in its sequence (START and END off,
        as Triton has it), for the same caller."""
        if is_cancelled(request):
            # Its caller went away: it does not run again, and its sequence ends here (Triton
            # drops a cancelled request when its turn comes and frees the slot).
            self.end(request)
            self._end_rescheduled(request, CancelledError(RESCHEDULED_CANCELLED_MESSAGE))
            return
        params = protocol_parameters(request.parameters)
        params["sequence_start"] = params["sequence_end"] = False
        try:
            self._push(None, request, request.sink, 1)
        except TritonError as error:  # its sequence is gone (cancelled meanwhile): it ends
            self._end_rescheduled(request, error)

    def _end_rescheduled(self, request: InferRequest, error: TritonError) -> None:
        if request.sender is not None:
            request.sender.abandon(error)
        else:
            self._loop.call_soon_threadsafe(settle, request.sink, error, True)

    def end(self, request: InferRequest) -> None:
        """A request ran without being rescheduled: its sequence is over."""
        self._batcher.end(correlation_id(protocol_parameters(request.parameters)))

    def pending(self) -> int:
        return len(self._batcher)

    def _reject(self, batch: Batch) -> None:
        self._loop.call_soon_threadsafe(_fail_sequence_rejected, batch)

    def _deliver(
        self, seq: int, sinks: list[Sink], results: Sequence[Result | None] | None
    ) -> None:
        sinks, results = _without_null_requests(sinks, results)
        super()._deliver(seq, sinks, results)

    def _settle_batch(
        self, seq: int, sinks: list[Sink], results: Sequence[Result | None] | None
    ) -> None:
        _settle(seq, *_without_null_requests(sinks, results))


def _without_null_requests(
    sinks: list[Sink], results: Sequence[Result | None] | None
) -> tuple[list[Sink], Sequence[Result | None] | None]:
    """A sequence batch's sinks and results without its null requests' (they have no sink:
    their answers go nowhere)."""
    if results is None or None not in sinks:
        return sinks, results
    kept = [(sink, result) for sink, result in zip(sinks, results, strict=True) if sink]
    return [sink for sink, _ in kept], [result for _, result in kept]


def create_scheduler(
    name: str,
    config: model_config_pb2.ModelConfig,
    instances: list[ModelInstance],
    loop: asyncio.AbstractEventLoop,
    *,
    model_dir: Path | None = None,
    server: Handle | None = None,
    **options: bool,
) -> Scheduler:
    """The queue-backed scheduler ``config`` asks for, started with ``instances`` (``options``:
    the scheduler's keyword arguments: ``latency_summaries``, ``histogram_latencies`` and
    ``loop_execution``; ``model_dir`` holds what the config refers to, such as initial
    states; ``server``: the server whose models the instances' code reaches). What a backend
    with a scheduler of its own uses instead (ensembles) is its backend's
    ``create_scheduler``."""
    if config.HasField("sequence_batching"):
        return SequenceScheduler(
            name, config, instances, loop, model_dir=model_dir, server=server, **options
        )
    kind: type[QueueScheduler] = DefaultScheduler
    if config.HasField("dynamic_batching") and config.max_batch_size > 0:
        kind = DynamicBatchScheduler
    return kind(name, config, instances, loop, server=server, **options)


def mark_enqueued(request: InferRequest, sink: Sink) -> None:
    """A request going into a queue: its trace's queue start, its phases' clock, its sink."""
    if request.trace is not None:
        request.trace.stamp("QUEUE_START", perf_counter_ns())
        request.trace.record_tensors("TENSOR_QUEUE_INPUT", request.inputs)
    if request.phases is not None:
        request.phases.enqueued = perf_counter_ns()
    request.sink = sink


async def answer_of(
    future: asyncio.Future[Any], request: InferRequest, cancel: Callable[[], bool]
) -> InferResponse:
    """The response ``future`` gets for a queued ``request``. When the caller goes away the
    request is dropped if it has not started (``cancel`` returns True); a running one is
    flagged (the model sees ``request.is_cancelled()``) and its result is ignored."""
    try:
        return cast(InferResponse, await future)
    except asyncio.CancelledError:
        if not cancel():
            request.cancelled = True
        raise


def _settle(seq: int, sinks: list[Sink], results: Sequence[Result | None] | None) -> None:
    """Runs on the event loop: each request of one batch gets its one response, with the
    final flag (None: the request, or every request, is answered through its sender)."""
    if results is None:
        return
    for sink, result in zip(sinks, results, strict=True):
        if result is not None:
            settle(sink, result, True)


def _fail(sinks: list[Sink], error: TritonError) -> None:
    """Runs on the event loop: answer requests with ``error``."""
    for sink in sinks:
        settle(sink, error, True)


def _fail_sequence_rejected(batch: Batch) -> None:
    """Runs on the event loop: answer a sequence batch's rejected requests, those of a sequence
    cancelled by one of its earlier requests' cancellation, or (``expired``) of a backlog
    sequence whose timeout passed before it got a slot (in Triton's words)."""
    sinks = [item[1] for item in batch.rejected]
    if batch.expired:
        _fail(sinks, UnavailableError(SEQUENCE_EXPIRED_MESSAGE))
    else:
        _fail(sinks, CancelledError(SEQUENCE_CANCELLED_MESSAGE))


def _queue_policy(policy: model_config_pb2.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        _TIMEOUT_ACTIONS.get(policy.timeout_action, "REJECT"),
        policy.default_timeout_microseconds,
        policy.allow_timeout_override,
        policy.max_queue_size,
    )


def dynamic_queue(config: model_config_pb2.ModelConfig, **options: Any) -> RequestQueue:
    """A queue with the rules of ``config``'s dynamic batcher (``options``: the queue's own,
    such as ``latency_summaries``)."""
    batching = config.dynamic_batching
    return RequestQueue(
        config.max_batch_size,
        batching.max_queue_delay_microseconds,
        list(batching.preferred_batch_size),
        priority_levels=batching.priority_levels,
        default_priority_level=batching.default_priority_level,
        default_queue_policy=_queue_policy(batching.default_queue_policy),
        priority_queue_policy={
            level: _queue_policy(policy) for level, policy in batching.priority_queue_policy.items()
        },
        **options,
    )


def shape_checked_inputs(config: model_config_pb2.ModelConfig) -> dict[str, bool]:
    """Inputs whose shapes must be equal to batch together, as Triton decides: shape tensors
    (their contents too) and variable-size inputs that do not allow ragged batches."""
    checked: dict[str, bool] = {}
    for tensor in config.input:
        if tensor.is_shape_tensor:
            checked[tensor.name] = True
        elif not tensor.allow_ragged_batch and any(dim == -1 for dim in tensor.dims):
            checked[tensor.name] = False
    return checked


def unsigned_parameter(value: object, limit: int) -> int:
    """A request parameter as an unsigned integer within ``limit`` (anything else: 0)."""
    if not isinstance(value, int) or value <= 0:
        return 0
    return min(value, limit)
