"""Triton's sequence batcher for stateful models (``sequence_batching``).

Routing, slots, the backlog, batch formation and idle release happen in the Rust core
(:class:`~tritonfast._core.SequenceBatcher`): every request of a sequence (correlation ID)
runs on the instance slot its START took, one at a time, in arrival order. This module adds
what the server hands the model with each request, as Triton does:

* **Control inputs** (``control_input``): START, END, READY as the two values of
  ``int32_false_true`` / ``fp32_false_true`` / ``bool_false_true``; CORRID as the request's
  correlation ID in the control's ``data_type``. Each is a one-element tensor (``[1, 1]`` for a
  batching model, ``[1]`` otherwise).
* **Null requests**: with the direct strategy a batch covers the slots up to the highest one
  with work, and a slot without a request gets a request whose inputs are zeros shaped like
  the batch's first request, READY false, START and END false, CORRID 0. Its responses are
  dropped and it is not counted in the statistics.
* **Implicit state** (``state``): each slot keeps its sequence's state. The model gets it as
  the input ``input_name`` (the ``initial_state``, or zeros, on START) and returns the next
  state as the output ``output_name``, which the server keeps and removes from the response.
  A model that returns no state output keeps its current state. Null requests get a copy of
  the initial state, so a slot's real state is never touched. Unlike Triton, which implements
  this in its ONNX Runtime, TensorRT and PyTorch backends only, it works for every backend.
  States of decoupled models are not captured (their responses bypass the batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tritonfast._core import Batch, SequenceBatcher
from tritonfast._proto.model_config_pb2 import ModelConfig, ModelSequenceBatching
from tritonfast.config.sequence import initial_state_path
from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES, WIRE_DATATYPES
from tritonfast.data.types import (
    RELEASE_RESCHEDULE,
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
    protocol_parameters,
)
from tritonfast.runtime.modelinstance import ModelInstance, PhaseClock
from tritonfast.runtime.responses import ResponseSender, ResponseStream, Result

if TYPE_CHECKING:
    from tritonfast.runtime.instance import InstanceLoop, Settle

log = logging.getLogger(__name__)

Control = ModelSequenceBatching.Control
_U64 = (1 << 64) - 1


def correlation_id(parameters: dict[str, Any]) -> int | str:
    """A request's correlation ID (0: none). gRPC carries it as int64: negative values wrap
    to uint64, as in Triton."""
    value = parameters.get("sequence_id", 0)
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value & _U64
    return value if isinstance(value, str) else 0


def batcher_for(name: str, config: ModelConfig, instances: int, **options: Any) -> SequenceBatcher:
    """The Rust sequence batcher ``config`` asks for."""
    batching = config.sequence_batching
    # An iterative sequence ends when its request is not rescheduled, never by the idle rule
    # (one execution of it may outlast the idle time).
    idle = _U64 if batching.iterative_sequence else batching.max_sequence_idle_microseconds
    if batching.HasField("oldest"):
        oldest = batching.oldest
        return SequenceBatcher(
            name,
            instances,
            config.max_batch_size,
            strategy="oldest",
            max_queue_delay_us=oldest.max_queue_delay_microseconds,
            max_candidate_sequences=oldest.max_candidate_sequences,
            preferred_batch_sizes=list(oldest.preferred_batch_size),
            max_sequence_idle_us=idle,
            **options,
        )
    return SequenceBatcher(
        name,
        instances,
        config.max_batch_size,
        strategy="direct",
        max_queue_delay_us=batching.direct.max_queue_delay_microseconds,
        minimum_slot_utilization=batching.direct.minimum_slot_utilization,
        max_sequence_idle_us=idle,
        **options,
    )


def slots_per_instance(config: ModelConfig) -> int:
    """How many slots each instance has (as the Rust batcher counts them)."""
    batching = config.sequence_batching
    if batching.HasField("oldest") and batching.oldest.max_candidate_sequences > 0:
        return batching.oldest.max_candidate_sequences
    return max(config.max_batch_size, 1)


# -- control inputs ----------------------------------------------------------------------


_FLAG_KINDS = {
    Control.CONTROL_SEQUENCE_START: "start",
    Control.CONTROL_SEQUENCE_END: "end",
    Control.CONTROL_SEQUENCE_READY: "ready",
}

CoreControls = tuple[
    list[tuple[str, str, str, bytes, bytes]],
    tuple[str, str] | None,
    bool,
    list[tuple[str, str, str, list[int], bytes]],
]


def core_controls(config: ModelConfig, model_dir: Path | None) -> CoreControls:
    """``config``'s control inputs and implicit states, as the core's lane writes them and
    :class:`Controls` and :class:`SlotStates` build them for the other schedulers: each flag
    control's name, kind (``"start"``, ``"end"``, ``"ready"``), datatype and false and true
    values as bytes; the CORRID control's name and datatype; whether the model batches; and
    each state's input and output names, datatype and initial value (shape and bytes as they
    travel). (The configuration's checks, in ``config/sequence.py``, leave only these kinds
    and datatypes.)"""
    states = [
        (
            spec.input_name,
            spec.output_name,
            spec.datatype,
            list(spec.initial.shape),
            bytes(rawtensor.to_raw(spec.datatype, spec.initial)),
        )
        for spec in state_specs(config, model_dir)
    ]
    return (*control_parts(config), states)


def control_parts(
    config: ModelConfig,
) -> tuple[list[tuple[str, str, str, bytes, bytes]], tuple[str, str] | None, bool]:
    """The control inputs of :func:`core_controls`."""
    flags: list[tuple[str, str, str, bytes, bytes]] = []
    corrid: tuple[str, str] | None = None
    for control_input in config.sequence_batching.control_input:
        for control in control_input.control:
            if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                corrid = (control_input.name, WIRE_DATATYPES[control.data_type])
                continue
            for values, datatype in (
                (control.int32_false_true, "INT32"),
                (control.fp32_false_true, "FP32"),
                (control.bool_false_true, "BOOL"),
            ):
                if len(values) == 2:
                    off, on = (
                        np.array(value, dtype=NUMPY_DTYPES[datatype]).tobytes() for value in values
                    )
                    flags.append((control_input.name, _FLAG_KINDS[control.kind], datatype, off, on))
                    break
    return flags, corrid, config.max_batch_size > 0


@dataclass(frozen=True, slots=True)
class _Flag:
    """A START, END or READY control: its tensor for false and for true (shared, read-only)."""

    name: str
    kind: str
    datatype: str
    false: np.ndarray
    true: np.ndarray


@dataclass(frozen=True, slots=True)
class _CorrId:
    name: str
    datatype: str
    dtype: np.dtype[Any]


class Controls:
    """Builds the control inputs of the requests handed to the model."""

    def __init__(self, config: ModelConfig) -> None:
        flags, corrid, batched = control_parts(config)
        self._shape: tuple[int, ...] = (1, 1) if batched else (1,)
        self._flags = [
            _Flag(name, kind, datatype, self._constant(off, datatype), self._constant(on, datatype))
            for name, kind, datatype, off, on in flags
        ]
        self._corrid: _CorrId | None = None
        if corrid is not None:
            name, datatype = corrid
            self._corrid = _CorrId(name, datatype, NUMPY_DTYPES[datatype])

    def _constant(self, value: bytes, datatype: str) -> np.ndarray:
        # (Read-only: a view of bytes.)
        return np.frombuffer(value, dtype=NUMPY_DTYPES[datatype]).reshape(self._shape)

    def __bool__(self) -> bool:
        return bool(self._flags) or self._corrid is not None

    def __len__(self) -> int:
        """How many control inputs each request gets."""
        return len(self._flags) + (self._corrid is not None)

    def tensors(self, start: bool, end: bool, ready: bool, corrid: int | str) -> list[InputTensor]:
        shape = self._shape
        tensors = []
        for flag in self._flags:
            on = ready and (
                flag.kind == "ready"
                or (flag.kind == "start" and start)
                or (flag.kind == "end" and end)
            )
            data = flag.true if on else flag.false
            tensors.append(InputTensor(flag.name, flag.datatype, shape, data))
        if self._corrid is not None:
            tensors.append(self._corrid_tensor(self._corrid, corrid))
        return tensors

    def _corrid_tensor(self, control: _CorrId, corrid: int | str) -> InputTensor:
        if control.datatype == "BYTES":
            value: Any = corrid.encode() if isinstance(corrid, str) else str(corrid).encode()
            data = np.full(self._shape, value, dtype=object)
        else:
            if isinstance(corrid, str):
                # Triton writes a string ID into a numeric CORRID as raw bytes; its number,
                # when it is one, is what a model can use.
                corrid = int(corrid) if corrid.isdigit() else 0
            # Triton copies the low-order bytes of the uint64 ID into narrower types.
            width = control.dtype.itemsize * 8
            value = corrid & ((1 << width) - 1)
            data = np.array(value, dtype=np.uint64).astype(control.dtype).reshape(self._shape)
        return InputTensor(control.name, control.datatype, self._shape, data)


# -- implicit state ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StateSpec:
    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray  # the state a sequence starts with (batch dimension included)


def state_specs(config: ModelConfig, model_dir: Path | None) -> list[_StateSpec]:
    specs = []
    batch: tuple[int, ...] = (1,) if config.max_batch_size > 0 else ()
    for state in config.sequence_batching.state:
        datatype = WIRE_DATATYPES[state.data_type]
        dtype = NUMPY_DTYPES[datatype]
        dims = tuple(1 if dim == -1 else int(dim) for dim in state.dims)
        initial: np.ndarray
        if state.initial_state:
            first = state.initial_state[0]
            dims = tuple(int(dim) for dim in first.dims)
            if first.WhichOneof("state_data") == "data_file" and model_dir is not None:
                raw = initial_state_path(model_dir, first.data_file).read_bytes()
                count = int(np.prod(dims)) if dims else 1
                if dtype.hasobject:
                    initial = np.array([raw] * count, dtype=object).reshape(dims)
                else:
                    initial = np.frombuffer(raw, dtype=dtype, count=count).reshape(dims)
            else:
                initial = _zeros(dims, dtype)
        else:
            # Triton leaves a state without initial_state uninitialised; zeros are one
            # such value, and a reproducible one.
            initial = _zeros(dims, dtype)
        initial = np.ascontiguousarray(initial).reshape(batch + dims)
        initial.flags.writeable = False
        specs.append(_StateSpec(state.input_name, state.output_name, datatype, initial))
    return specs


def _zeros(dims: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    if dtype.hasobject:
        return np.full(dims, b"", dtype=object)
    return np.zeros(dims, dtype=dtype)


class SlotStates:
    """The implicit states of one instance's slots."""

    def __init__(self, specs: list[_StateSpec], slots: int) -> None:
        self._specs = specs
        self._by_output = {spec.output_name: spec for spec in specs}
        self._held: list[dict[str, np.ndarray] | None] = [None] * slots

    def __bool__(self) -> bool:
        return bool(self._specs)

    def __len__(self) -> int:
        """How many state inputs (and outputs) each request gets."""
        return len(self._specs)

    def tensors(self, slot: int, start: bool, ready: bool) -> list[InputTensor]:
        """The state inputs of a request of ``slot`` (a fresh initial state for null ones)."""
        held = self._held[slot] if ready and not start else None
        if ready and held is None:
            # The model may update the state in place (use_same_buffer_for_input_output):
            # each sequence gets its own writable copy.
            held = {spec.input_name: spec.initial.copy() for spec in self._specs}
            self._held[slot] = held
        tensors = []
        for spec in self._specs:
            data = held[spec.input_name] if held is not None else spec.initial.copy()
            tensors.append(InputTensor(spec.input_name, spec.datatype, data.shape, data))
        return tensors

    def output_names(self) -> Iterable[str]:
        return self._by_output.keys()

    def keep(self, slot: int, response: InferResponse, end: bool) -> None:
        """Keep the next states ``response`` carries (taking them out of it); forget the
        slot's state when its sequence ended."""
        held = self._held[slot]
        kept = []
        for tensor in response.outputs:
            spec = self._by_output.get(tensor.name)
            if spec is None:
                kept.append(tensor)
            elif held is not None:
                held[spec.input_name] = tensor.data
        if len(kept) != len(response.outputs):
            response.outputs = kept
        if end:
            self._held[slot] = None


# -- requests handed to the model ---------------------------------------------------------


class Iterations(Protocol):
    """Where an iterative sequence's requests go after they ran (the scheduler)."""

    def reschedule(self, request: InferRequest) -> None: ...
    def end(self, request: InferRequest) -> None: ...


class SequenceInstance(ModelInstance):
    """A backend instance behind the sequence batcher: adds each request's control and state
    inputs before it runs, and keeps the states its responses carry."""

    def __init__(
        self,
        inner: ModelInstance,
        controls: Controls,
        states: SlotStates,
        loop: asyncio.AbstractEventLoop,
        decoupled: bool,
        iterations: Iterations | None = None,
    ) -> None:
        self._inner = inner
        self._controls = controls
        self._states = states
        self._loop = loop
        self._decoupled = decoupled
        self._iterations = iterations  # an iterative sequence model's

    @property
    def runs_elsewhere(self) -> bool:  # type: ignore[override]
        return self._inner.runs_elsewhere

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        self._prepare(requests)
        results = self._inner.execute(requests, clock)
        if results is not None:
            self._keep_states(requests, results)
        if self._iterations is not None:
            return self._iterate(self._iterations, requests, results)
        return results

    def execute_later(
        self,
        requests: list[InferRequest],
        clock: PhaseClock,
        finish: Callable[[Sequence[Result] | None], None],
        release: Callable[[], None],
    ) -> None:
        self._prepare(requests)

        def finished(results: Sequence[Result] | None) -> None:
            if results is not None:
                self._keep_states(requests, results)
            if self._iterations is not None:
                results = self._iterate(self._iterations, requests, results)
            finish(results)

        self._inner.execute_later(requests, clock, finished, release)

    def _prepare(self, requests: list[InferRequest]) -> None:
        """Add each request's control and state inputs (and ask for its state outputs)."""
        controls, states = self._controls, self._states
        for request in requests:
            slot, ready = request.slot
            params = protocol_parameters(request.parameters)
            start = ready and bool(params.get("sequence_start"))
            end = ready and bool(params.get("sequence_end"))
            if controls:
                corrid = correlation_id(params) if ready else 0
                request.inputs.extend(controls.tensors(start, end, ready, corrid))
            if states:
                request.inputs.extend(states.tensors(slot, start, ready))
                if request.outputs is not None:
                    request.outputs.extend(RequestedOutput(name) for name in states.output_names())
            if not ready and self._decoupled:
                # Whatever the model sends for a null request goes nowhere.
                discard = ResponseStream(self._loop)
                discard.cancelled = True
                request.sender = ResponseSender(discard, "", decoupled=True)

    def _iterate(
        self,
        iterations: Iterations,
        requests: list[InferRequest],
        results: Sequence[Result] | None,
    ) -> list[Result] | None:
        """An iterative sequence model's requests after their execution: those the model
        rescheduled go back into the batcher (no response yet: their result is None), the
        others end their sequences."""
        out = None if results is None else list(results)
        added = len(self._controls) + len(self._states)
        for index, request in enumerate(requests):
            if not request.slot[1]:  # a null request
                continue
            if request.release_flags & RELEASE_RESCHEDULE:
                request.release_flags = 0
                if added:  # its control and state inputs are added afresh next time
                    del request.inputs[-added:]
                if self._states and request.outputs is not None:
                    del request.outputs[-len(self._states) :]
                if out is not None:
                    out[index] = None  # type: ignore[call-overload]
                iterations.reschedule(request)
            else:
                iterations.end(request)
        return out

    def _keep_states(self, requests: list[InferRequest], results: Sequence[Result]) -> None:
        states = self._states
        if not states:
            return
        for request, result in zip(requests, results, strict=False):
            slot, ready = request.slot
            if ready and isinstance(result, InferResponse):
                states.keep(
                    slot, result, bool(protocol_parameters(request.parameters).get("sequence_end"))
                )

    def unloading(self) -> None:
        self._inner.unloading()

    def stop_by(self, deadline: float) -> None:
        self._inner.stop_by(deadline)

    def finalize(self) -> None:
        self._inner.finalize()


def null_request(like: InferRequest, slot: int) -> InferRequest:
    """A request for ``slot`` with nothing to do (READY false): ``like``'s inputs as zeros."""
    inputs = [
        InputTensor(t.name, t.datatype, t.shape, _zeros(t.shape, NUMPY_DTYPES[t.datatype]))
        for t in like.inputs
    ]
    return InferRequest(like.model_name, like.model_version, inputs=inputs, slot=(slot, False))


class SlotSource:
    """One instance's view of the sequence batcher, in the shape of a request queue: its
    batches come with null entries filled in and every request's slot set."""

    def __init__(self, batcher: SequenceBatcher, index: int) -> None:
        self._batcher = batcher
        self._index = index

    def pop(self, timeout_us: int) -> Batch | None:
        batch = self._batcher.pop(self._index, timeout_us)
        if batch is None or not batch.items:
            return batch
        items = batch.items
        slots = batch.slots
        assert slots is not None
        template: InferRequest | None = None
        for position, item in enumerate(items):
            if item is not None:
                request = item[0]
                request.slot = (slots[position], True)
                if template is None:
                    template = request
        assert template is not None  # a batch holds at least one request
        for position, item in enumerate(items):
            if item is None:
                items[position] = (null_request(template, slots[position]), None)
        return batch

    # The rest of a queue's face, for the scheduler (shared by every instance's source).
    def cancel(self, ticket: Any) -> bool:
        return self._batcher.cancel(ticket)

    def statistics(self) -> dict[str, Any]:
        return self._batcher.statistics()

    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        return self._batcher.latency_summaries(quantiles)

    def close(self) -> None:
        self._batcher.close()

    def abandon(self) -> list[Any]:
        return self._batcher.abandon()

    @property
    def closed(self) -> bool:
        return self._batcher.closed


class LoopDriver:
    """Takes a sequence model's batches from the event loop, with no instance threads: for
    instances in worker processes whose batches are formed at once (no queue delay). The loop
    asks the batcher for a free instance's next batch whenever work may have come: after a
    push, when one of its batches ends, and every :data:`TICK_S` (idle sequences released,
    backlog sequences moved into freed slots), and starts it in the worker
    (:meth:`InstanceLoop.run_later`). Each request is spared the hops to an instance thread
    and back."""

    TICK_S = 0.05

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sources: list[SlotSource],
        instances: list[InstanceLoop],
        settle: Settle,
        reject: Callable[[Batch], None],
    ) -> None:
        self._loop = loop
        self._sources = sources
        self._instances = instances
        self._settle = settle
        self._reject = reject
        self._busy = [False] * len(sources)
        self._done = [False] * len(sources)  # closed, and nothing left for it
        self._all_done = threading.Event()
        loop.call_soon_threadsafe(self._tick)

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def poke(self) -> None:
        """Work may have come (from any thread)."""
        if self._on_loop():
            self._take()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone
                self._loop.call_soon_threadsafe(self._take)

    def finish(self, timeout: float) -> None:
        """Once the batcher is closed: wait (off the loop) until every instance has run what
        was left for it."""
        if self._on_loop() or not self._loop.is_running():
            self._take()  # nothing else takes batches meanwhile; waiting here cannot help
            if self._on_loop() or self._loop.is_closed():
                return
        else:
            try:
                self._loop.call_soon_threadsafe(self._take)
            except RuntimeError:  # the loop closed: nothing more can run
                return
        self._all_done.wait(timeout)

    def _take(self) -> None:
        for index, source in enumerate(self._sources):
            try:
                self._take_for(index, source)
            except Exception:  # a bug here must not stop the other instances or the tick
                log.exception("instance %s: taking its next batch failed", index)

    def _take_for(self, index: int, source: SlotSource) -> None:
        while not (self._busy[index] or self._done[index]):
            batch = source.pop(0)
            if batch is None:
                self._done[index] = True
                if all(self._done):
                    self._all_done.set()
            elif batch.items:
                self._busy[index] = True
                self._instances[index].run_later(
                    batch, self._settle, functools.partial(self._released, index)
                )
            elif batch.rejected:  # requests of cancelled or expired sequences
                self._reject(batch)
            else:
                break

    def _released(self, index: int) -> None:
        # Not taken in this call: a batch that fails as it starts releases at once, and a
        # run of those must not nest.
        self._busy[index] = False
        self._loop.call_soon(self._take)

    def _tick(self) -> None:
        try:
            self._take()
        finally:
            if not self._all_done.is_set():
                self._loop.call_later(self.TICK_S, self._tick)
