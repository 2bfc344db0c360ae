"""One scheduler per loaded model version: the Rust request queue and its instance loops.

With ``dynamic_batching`` (and ``max_batch_size > 0``) the queue applies every field of
Triton's ``ModelDynamicBatching``: preferred sizes, ``max_queue_delay_microseconds``, priority
levels with per-level queue policies (``max_queue_size``, timeouts with REJECT or DELAY,
``allow_timeout_override``) and ``preserve_ordering``. A request's ``priority`` and ``timeout``
(microseconds) come from its parameters; requests batch together only when the inputs whose
shapes must match (variable-size inputs without ``allow_ragged_batch``, shape tensors, and the
set of inputs when some are optional) agree. Without dynamic batching it is Triton's default
scheduler: FIFO to idle instances, one request per execution, priorities and timeouts ignored.

A request whose awaiting task is cancelled (client disconnect, gRPC cancel) is removed from
the queue if it has not started; a running one completes and its result is dropped.

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
            "cache_hit": ..., "cache_miss": ...,   # always zero (no response cache)
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

import asyncio
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any, Literal

from tritonfast._core import QUEUE_FULL_MESSAGE, QueuePolicy, RequestQueue, Ticket
from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, Result
from tritonfast.errors import TritonError, UnavailableError
from tritonfast.runtime.instance import InstanceLoop
from tritonfast.runtime.looprun import LoopExecution
from tritonfast.runtime.rawtensor import request_prefix
from tritonfast.runtime.types import InferRequest, InferResponse

# Triton's answer to a request whose queue timeout expired under the REJECT action.
REQUEST_TIMEOUT_MESSAGE = "Request timeout expired"
# Triton's answer to a request that arrives while the model's scheduler is stopping.
STOPPING_MESSAGE = (
    "Server is stopping, scheduler for model has stopped accepting new inference requests"
)

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_TIMEOUT_ACTIONS: dict[int, Literal["REJECT", "DELAY"]] = {
    model_config_pb2.ModelQueuePolicy.REJECT: "REJECT",
    model_config_pb2.ModelQueuePolicy.DELAY: "DELAY",
}


class Scheduler:
    def __init__(
        self,
        name: str,
        config: model_config_pb2.ModelConfig,
        backends: list[Backend],
        loop: asyncio.AbstractEventLoop,
        *,
        latency_summaries: bool = False,
        loop_execution: bool = False,
    ) -> None:
        self._batching = config.HasField("dynamic_batching") and config.max_batch_size > 0
        preserve_ordering = False
        # Inputs whose shape (True: and content) must match within a batch.
        self._keyed: dict[str, bool] = {}
        self._optional_inputs = False
        if self._batching:
            batching = config.dynamic_batching
            self._queue = RequestQueue(
                config.max_batch_size,
                batching.max_queue_delay_microseconds,
                list(batching.preferred_batch_size),
                priority_levels=batching.priority_levels,
                default_priority_level=batching.default_priority_level,
                default_queue_policy=_queue_policy(batching.default_queue_policy),
                priority_queue_policy={
                    level: _queue_policy(policy)
                    for level, policy in batching.priority_queue_policy.items()
                },
                latency_summaries=latency_summaries,
            )
            preserve_ordering = batching.preserve_ordering
            self._keyed = _shape_checked_inputs(config)
            self._optional_inputs = any(tensor.optional for tensor in config.input)
        else:
            # Triton's default scheduler: one request per execution, FIFO to idle instances.
            self._queue = RequestQueue(latency_summaries=latency_summaries)
        self._needs_shape_key = bool(self._keyed) or self._optional_inputs
        self._loop = loop
        # preserve_ordering: batches settle in the order they left the queue.
        self._next_seq = 0
        self._held: dict[int, tuple[list[asyncio.Future[Any]], Sequence[Result]]] = {}
        deliver = self._deliver_in_order if preserve_ordering else self._deliver
        # Short executions may run on the event loop (see looprun) when every instance can.
        self._on_loop: LoopExecution | None = None
        if loop_execution and all(backend.may_run_on_event_loop for backend in backends):
            self._on_loop = LoopExecution(name, self._queue, loop)
        on_loop = self._on_loop
        self._instances = [
            InstanceLoop(
                f"{name}_{index}",
                self._queue,
                backend,
                deliver,
                self._reject,
                handoff=None if on_loop is None else (on_loop.handoff, index),
                observe=None if on_loop is None else on_loop.observe,
            )
            for index, backend in enumerate(backends)
        ]
        if on_loop is not None:
            settle = self._settle_in_order if preserve_ordering else _settle_batch
            on_loop.start(self._instances, settle)
        for instance in self._instances:
            instance.start()

    async def submit(self, request: InferRequest, batch_size: int) -> InferResponse:
        future: asyncio.Future[Any] = self._loop.create_future()
        if request.trace is not None:
            request.trace.stamp("QUEUE_START", perf_counter_ns())
            request.trace.record_tensors("TENSOR_QUEUE_INPUT", request.inputs)
        ticket = self._push(request, future, batch_size)
        try:
            return await future
        except asyncio.CancelledError:
            # The caller went away: drop the request if it has not started; a running one is
            # flagged (the model sees request.is_cancelled()) and its result is ignored.
            if not self._queue.cancel(ticket):
                request.cancelled = True
            raise

    def _push(self, request: InferRequest, future: asyncio.Future[Any], batch_size: int) -> Ticket:
        try:
            if not self._batching:
                # One request per execution; the batch size only feeds the statistics.
                return self._queue.push_cancellable((request, future), max(batch_size, 1))
            params = request.parameters
            priority = _unsigned(params.get("priority", 0), _U32) if params else 0
            timeout = _unsigned(params.get("timeout", 0), _U64) if params else 0
            shape_key = self._shape_key(request) if self._needs_shape_key else 0
            return self._queue.push_cancellable(
                (request, future), batch_size, priority, timeout, shape_key
            )
        except UnavailableError as exc:
            # Triton prefixes these with the request id ("<id_unknown>" without one).
            prefix = request_prefix(request.id)
            if exc.message == QUEUE_FULL_MESSAGE:
                raise UnavailableError(prefix + QUEUE_FULL_MESSAGE) from None
            if self._queue.closed:
                raise UnavailableError(prefix + STOPPING_MESSAGE) from None
            raise

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

    def statistics(self) -> dict[str, Any]:
        """The model version's statistics (layout in the module docstring), read lock-free."""
        return self._queue.statistics()

    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        """``{name: (count, sum_us, [(quantile, us)])}`` when summaries are kept, else None."""
        return self._queue.latency_summaries(quantiles)

    def pending(self) -> int:
        """Requests in the queue, not yet taken by an instance."""
        return len(self._queue)

    @property
    def runs_on_loop(self) -> bool:
        """Whether the model's batches run on the event loop now (see looprun)."""
        return self._on_loop is not None and self._on_loop.on_loop

    def stop(self, timeout: float) -> None:
        """Stop taking work, let queued and running requests finish, then finalize.

        Called off the event loop: batches already handed to the loop still need it to run."""
        if self._on_loop is not None:
            self._on_loop.stop()
        self._queue.close()
        for instance in self._instances:
            instance.join(timeout)
        if self._on_loop is not None:
            self._on_loop.unwatch()
        for instance in self._instances:
            instance.finalize()

    # -- completions (called on instance threads; settle on the event loop) ------------------
    def _deliver(
        self, seq: int, futures: list[asyncio.Future[Any]], results: Sequence[Result]
    ) -> None:
        self._loop.call_soon_threadsafe(_settle, futures, results)

    def _deliver_in_order(
        self, seq: int, futures: list[asyncio.Future[Any]], results: Sequence[Result]
    ) -> None:
        self._loop.call_soon_threadsafe(self._settle_in_order, seq, futures, results)

    def _settle_in_order(
        self, seq: int, futures: list[asyncio.Future[Any]], results: Sequence[Result]
    ) -> None:
        """Runs on the event loop: settle batches strictly in the order they left the queue."""
        held = self._held
        held[seq] = (futures, results)
        while (ready := held.pop(self._next_seq, None)) is not None:
            self._next_seq += 1
            _settle(*ready)

    def _reject(self, futures: list[asyncio.Future[Any]]) -> None:
        self._loop.call_soon_threadsafe(_fail_timed_out, futures)


def _settle_batch(seq: int, futures: list[asyncio.Future[Any]], results: Sequence[Result]) -> None:
    _settle(futures, results)


def _settle(futures: list[asyncio.Future[Any]], results: Sequence[Result]) -> None:
    """Runs on the event loop: complete every future of one batch."""
    for future, result in zip(futures, results, strict=True):
        if future.done():  # the caller went away (cancelled)
            continue
        if isinstance(result, TritonError):
            future.set_exception(result)
        else:
            future.set_result(result)


def _fail_timed_out(futures: list[asyncio.Future[Any]]) -> None:
    """Runs on the event loop: answer requests whose queue timeout expired (REJECT)."""
    for future in futures:
        if not future.done():
            future.set_exception(UnavailableError(REQUEST_TIMEOUT_MESSAGE))


def _queue_policy(policy: model_config_pb2.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        _TIMEOUT_ACTIONS.get(policy.timeout_action, "REJECT"),
        policy.default_timeout_microseconds,
        policy.allow_timeout_override,
        policy.max_queue_size,
    )


def _shape_checked_inputs(config: model_config_pb2.ModelConfig) -> dict[str, bool]:
    """Inputs whose shapes must be equal to batch together, as Triton decides: shape tensors
    (their contents too) and variable-size inputs that do not allow ragged batches."""
    checked: dict[str, bool] = {}
    for tensor in config.input:
        if tensor.is_shape_tensor:
            checked[tensor.name] = True
        elif not tensor.allow_ragged_batch and any(dim == -1 for dim in tensor.dims):
            checked[tensor.name] = False
    return checked


def _unsigned(value: object, limit: int) -> int:
    """A request parameter as an unsigned integer within ``limit`` (anything else: 0)."""
    if not isinstance(value, int) or value <= 0:
        return 0
    return min(value, limit)
