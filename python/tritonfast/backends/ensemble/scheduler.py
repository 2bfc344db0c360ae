"""The ensemble scheduler: a request to an ensemble runs its steps, each through its model's
own scheduler, in-process.

A request starts with the ensemble's inputs as the available tensors. Every step that the
requested outputs depend on is sent as soon as its inputs all exist
(:meth:`~tritonfast.api.serverhandle.ServerHandle.infer_async`: the step model's validation,
scheduler, batching and statistics, the tensors passed as the arrays they are), so
independent steps run concurrently; each step's outputs become available under
their ensemble names as it answers. When every step has answered, the ensemble's outputs (the
requested ones) are its response. A step that fails fails the request with the step's error
code and message, prefixed ``in ensemble '<name>', `` as in Triton; the steps still running
are cancelled. The ensemble's own statistics count its requests (with
their whole durations); each step counts in its own model's statistics.

An ensemble that is not decoupled is also handed to the core (:meth:`EnsembleScheduler.
core_lane`, ``rust/src/lane/ensemble.rs``): a request that reaches it whole from a frontend
runs there, by the same rules, when every step it needs runs on a lane of the core
(``runtime/lane.py``, found in the server's lane registry as the request starts). The
requests that come through Python, and those the core leaves to the reference path, run
here. Both count in the same statistics.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from time import perf_counter_ns
from typing import Any, TypeVar

from tritonfast._core import EnsembleLane
from tritonfast._proto import model_config_pb2
from tritonfast.backends.ensemble.plan import EnsemblePlan, Step, plan_of
from tritonfast.data.types import (
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    PhaseTimes,
    RequestedOutput,
)
from tritonfast.errors import InternalError, TritonError, error_for
from tritonfast.runtime import handle
from tritonfast.runtime.lane import signature_of
from tritonfast.runtime.requestcounts import RequestCounts
from tritonfast.runtime.responses import ResponseStream, settle, task_stream
from tritonfast.runtime.scheduler import Scheduler

# A tensor as it flows between steps: (datatype, shape, data).
Tensor = tuple[str, tuple[int, ...], Any]
# What a decoupled step running in an ensemble's branch says, with its position among the
# decoupled steps the branch runs: one response's outputs, None once it has answered, or its
# error.
_StepAnswer = tuple[int, dict[str, Tensor] | TritonError | None]
_T = TypeVar("_T")


class EnsembleScheduler(Scheduler):
    def __init__(
        self,
        config: model_config_pb2.ModelConfig,
        loop: asyncio.AbstractEventLoop,
        server: handle.Handle,
        version: str = "",
    ) -> None:
        # The server whose models run the steps.
        self._server = server
        self._plan: EnsemblePlan = plan_of(config)
        self._version = version
        # With a decoupled step (the repository marks the ensemble decoupled then), requests
        # are streamed: see _stream.
        self._decoupled = config.model_transaction_policy.decoupled
        self._batches = config.max_batch_size > 0
        self._loop = loop
        # The core's run of the ensemble (see core_lane); none in a server without lanes.
        self._core: EnsembleLane | None = None
        registry = server.lane_registry
        if registry is not None and not self._decoupled:
            self._core = EnsembleLane(
                signature_of(config),
                version,
                list(self._plan.outputs),
                [
                    (step.model_name, step.model_version, list(step.inputs), list(step.outputs))
                    for step in self._plan.steps
                ],
                registry,
            )
        self._stats = RequestCounts(self._core)
        self._running: set[asyncio.Task[Any]] = set()
        self._stopping = False

    async def infer(self, request: InferRequest, batch_size: int) -> InferResponse:
        started = perf_counter_ns()
        spent = PhaseTimes()
        try:
            response = await self._run(request, spent)
        except TritonError:
            self._stats.failed(perf_counter_ns() - started)
            raise
        self._succeeded(request, perf_counter_ns() - started, batch_size, spent)
        return response

    def _succeeded(
        self, request: InferRequest, ns: int, batch_size: int, spent: PhaseTimes
    ) -> None:
        """Count a request that succeeded, with the time its steps spent queued and computing
        (and, for an ensemble that is itself a step, for its caller's sums too)."""
        self._stats.succeeded(ns, max(batch_size, 1), spent)
        if request.phases is not None:
            request.phases.add(spent)

    def open_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        def answer(stream: ResponseStream) -> Coroutine[Any, Any, None]:
            return self._answer(request, batch_size, stream)

        return task_stream(self._loop, request, answer, self._running)

    async def _answer(self, request: InferRequest, batch_size: int, stream: ResponseStream) -> None:
        if self._decoupled:
            await self._stream(request, batch_size, stream)
            return
        try:
            settle(stream, await self.infer(request, batch_size), True)
        except TritonError as error:
            settle(stream, error, True)

    async def _stream(self, request: InferRequest, batch_size: int, stream: ResponseStream) -> None:
        """A decoupled ensemble's request, as Triton runs one: each response of a decoupled
        step carries the graph on with its outputs (the steps after it run once per
        response), and each complete set of the ensemble's outputs is a response, sent as it
        completes; then the final flag. Every branch runs at once (see :meth:`_branch`)."""
        wanted, started, tensors = _begin(self._plan, request)
        begun = perf_counter_ns()
        spent = PhaseTimes()

        def complete(tensors: dict[str, Tensor]) -> None:
            outputs = [OutputTensor(name, *tensors[name]) for name in wanted if name in tensors]
            response = InferResponse(request.model_name, request.model_version, request.id, outputs)
            settle(stream, response, False)

        branches = _Branches()
        branches.start(self._branch(request, tensors, started, {}, spent, branches, complete))
        try:
            await branches.finished()
        except TritonError as error:
            self._stats.failed(perf_counter_ns() - begun)
            settle(stream, error, True)
            return
        self._succeeded(request, perf_counter_ns() - begun, batch_size, spent)
        settle(stream, None, True)

    async def _branch(
        self,
        request: InferRequest,
        tensors: dict[str, Tensor],
        started: set[int],
        pending: dict[int, asyncio.Task[dict[str, Tensor]]],
        spent: PhaseTimes,
        branches: _Branches,
        complete: Callable[[dict[str, Tensor]], None],
    ) -> None:
        """One branch of a decoupled ensemble's request, with ``tensors``: every step not yet
        ``started`` whose inputs exist starts at once. A step with one response (``pending``,
        shared with the branches this one starts) adds its outputs here when a step needs
        them, or when nothing else is left to run. A decoupled step's responses each start a
        branch of their own with its outputs (with several decoupled steps, each combination of
        one response of each); this branch ends when their streams do. A branch with nothing
        left to run or wait for is a complete set. ``spent`` adds up the steps' queue and
        compute times."""
        tensors, pending = dict(tensors), dict(pending)
        server = self._server
        while True:
            ready = self._plan.ready(set(tensors), started)
            if not ready and not pending:
                complete(tensors)
                return
            if not ready:  # what runs next needs the outputs of a step under way
                await asyncio.wait(pending.values(), return_when=asyncio.FIRST_COMPLETED)
                for index, task in list(pending.items()):
                    if task.done():
                        tensors.update(task.result())
                        del pending[index]
                continue
            started = started | {step.index for step in ready}
            streamed = [s for s in ready if server.is_decoupled(s.model_name, s.model_version)]
            for step in ready:
                if step not in streamed:
                    pending[step.index] = branches.start(
                        self._step_answer(step, request, tensors, spent)
                    )
            if streamed:
                break
        answers: asyncio.Queue[_StepAnswer] = asyncio.Queue()
        runs = [
            asyncio.ensure_future(self._step_stream(at, step, request, tensors, spent, answers))
            for at, step in enumerate(streamed)
        ]
        received: list[list[dict[str, Tensor]]] = [[] for _ in streamed]
        running = len(runs)
        try:
            while running:
                position, outputs = await answers.get()
                if isinstance(outputs, TritonError):
                    raise outputs
                if outputs is None:  # that step has answered for good
                    running -= 1
                    continue
                others = [received[i] for i in range(len(streamed)) if i != position]
                received[position].append(outputs)
                for combination in itertools.product(*others):
                    following = dict(tensors)
                    following.update(outputs)
                    for more in combination:
                        following.update(more)
                    branches.start(
                        self._branch(
                            request, following, started, pending, spent, branches, complete
                        )
                    )
        finally:
            for run in runs:
                run.cancel()

    async def _step_answer(
        self, step: Step, request: InferRequest, tensors: dict[str, Tensor], spent: PhaseTimes
    ) -> dict[str, Tensor]:
        """The outputs, under their ensemble names, of ``step`` (not decoupled) run with
        ``tensors``."""
        server = self._server
        change = self._batch_change(server, step)
        step_request = _step_request(step, request, tensors, change)
        try:
            response = await server.infer_async(step_request)
        except TritonError as error:
            raise _step_failed(self._plan.name, error) from None
        _add_phases(spent, step_request)
        outputs: dict[str, Tensor] = {}
        _take_outputs(step, response, outputs, change)
        return outputs

    async def _step_stream(
        self,
        position: int,
        step: Step,
        request: InferRequest,
        tensors: dict[str, Tensor],
        spent: PhaseTimes,
        answers: asyncio.Queue[_StepAnswer],
    ) -> None:
        """Run decoupled ``step`` with ``tensors``: each response's outputs, under their
        ensemble names, into ``answers`` as ``(position, outputs)``, then ``(position,
        None)``; or its error as ``(position, error)``."""
        server = self._server
        change = self._batch_change(server, step)
        step_request = _step_request(step, request, tensors, change)
        try:
            async for item in server.stream_async(step_request):
                if isinstance(item.result, TritonError):
                    raise item.result
                if item.result is not None:
                    outputs: dict[str, Tensor] = {}
                    _take_outputs(step, item.result, outputs, change)
                    answers.put_nowait((position, outputs))
        except TritonError as error:
            answers.put_nowait((position, _step_failed(self._plan.name, error)))
            return
        _add_phases(spent, step_request)
        answers.put_nowait((position, None))

    async def _run(self, request: InferRequest, spent: PhaseTimes) -> InferResponse:
        """Run the request's steps, each once its inputs exist (``spent`` adds up their
        queue and compute times)."""
        plan = self._plan
        wanted, started, tensors = _begin(plan, request)
        running: dict[asyncio.Future[InferResponse], tuple[Step, InferRequest]] = {}
        server = self._server
        try:
            while True:
                ready = plan.ready(set(tensors), started)
                if len(ready) == 1 and not running:
                    # One step at a time (a chain): awaited directly, without a task.
                    step = ready[0]
                    started.add(step.index)
                    change = self._batch_change(server, step)
                    step_request = _step_request(step, request, tensors, change)
                    try:
                        response = await server.infer_async(step_request)
                    except TritonError as error:
                        raise _step_failed(plan.name, error) from None
                    _add_phases(spent, step_request)
                    _take_outputs(step, response, tensors, change)
                    continue
                for step in ready:
                    started.add(step.index)
                    step_request = _step_request(
                        step, request, tensors, self._batch_change(server, step)
                    )
                    running[asyncio.ensure_future(server.infer_async(step_request))] = (
                        step,
                        step_request,
                    )
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step, step_request = running.pop(task)
                    try:
                        response = task.result()
                    except TritonError as error:
                        raise _step_failed(plan.name, error) from None
                    _add_phases(spent, step_request)
                    _take_outputs(step, response, tensors, self._batch_change(server, step))
        finally:
            for task in running:
                task.cancel()
        missing = [name for name in wanted if name not in tensors]
        if missing:
            raise InternalError(
                f"in ensemble '{plan.name}', unexpected deadlock, at least one output is not set"
                " while no more ensemble steps can be made"
            )
        outputs = [OutputTensor(name, *tensors[name]) for name in wanted]
        return InferResponse(request.model_name, request.model_version, request.id, outputs)

    def _batch_change(self, server: handle.Handle, step: Step) -> int:
        """How a step's tensors differ from the ensemble's, as Triton bridges them: +1 when
        the step batches and the ensemble does not (a batch dimension of 1 is added to the
        step's inputs and taken off its outputs), -1 the other way round, 0 when alike."""
        step_batches = server.max_batch_size(step.model_name, step.model_version) > 0
        if step_batches == self._batches:
            return 0
        return 1 if step_batches else -1

    def core_lane(self) -> EnsembleLane | None:
        """The core's run of this ensemble (None for a decoupled one): it takes a request
        whole when every step it needs runs on a lane, and leaves the others to this
        scheduler."""
        return self._core

    # -- state ---------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        return self._stats.snapshot()

    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        return None

    def pending(self) -> int:
        return 0

    def stop(self, timeout: float) -> None:
        """Requests in flight finish through their steps' schedulers (which stop on their
        own); nothing of the ensemble's own needs stopping."""


def _begin(
    plan: EnsemblePlan, request: InferRequest
) -> tuple[list[str], set[int], dict[str, Tensor]]:
    """A request's start: the outputs it wants, the steps that count as started already (no
    wanted output depends on them: they never run), and the tensors available (its inputs)."""
    wanted = (
        [output.name for output in request.outputs]
        if request.outputs is not None
        else list(plan.outputs)
    )
    needed = plan.needed_for(wanted)
    started = {step.index for step in plan.steps if step.index not in needed}
    tensors: dict[str, Tensor] = {t.name: (t.datatype, t.shape, t.data) for t in request.inputs}
    return wanted, started, tensors


def _step_failed(ensemble: str, error: TritonError) -> TritonError:
    """A step's error as the ensemble's, worded as Triton words it."""
    return error_for(error.code, f"in ensemble '{ensemble}', {error.message}")


def _take_outputs(
    step: Step, response: InferResponse, tensors: dict[str, Tensor], change: int
) -> None:
    """A step's outputs, available from now on under their ensemble names."""
    produced = {t.name: t for t in response.outputs}
    for model_output, tensor in step.outputs:
        out = produced[model_output]
        tensors[tensor] = _rebatched(out.datatype, tuple(out.shape), out.data, -change)


def _step_request(
    step: Step, request: InferRequest, tensors: dict[str, Tensor], change: int
) -> InferRequest:
    inputs = [
        InputTensor(model_input, *_rebatched(*tensors[tensor], change))
        for model_input, tensor in step.inputs
    ]
    return InferRequest(
        step.model_name,
        step.model_version,
        id=request.id,
        inputs=inputs,
        outputs=[RequestedOutput(model_output) for model_output, _ in step.outputs],
        parameters=request.parameters,
        parent_trace=request.trace,
        phases=PhaseTimes(),
    )


def _add_phases(spent: PhaseTimes, step_request: InferRequest) -> None:
    if step_request.phases is not None:
        spent.add(step_request.phases)


def _rebatched(datatype: str, shape: tuple[int, ...], data: Any, change: int) -> Tensor:
    """A tensor with a batch dimension of 1 added (+1) or taken off (-1, when it has one)."""
    if change > 0:
        shape = (1, *shape)
        return datatype, shape, data.reshape(shape)
    if change < 0 and shape[:1] == (1,):
        shape = shape[1:]
        return datatype, shape, data.reshape(shape)
    return datatype, shape, data


# The counts of a scheduler the core runs no request of.
class _Branches:
    """The tasks of one decoupled ensemble request (its branches, and the steps with one
    response they share): :meth:`finished` returns once all have ended, or raises the first
    error (the others are cancelled then)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._over = asyncio.Event()
        self._error: BaseException | None = None

    def start(self, work: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        """Run ``work`` (a branch, or a step whose outputs branches wait for) as one of
        the request's tasks."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
            self._cancel()
        if not self._tasks:
            self._over.set()

    def _cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def finished(self) -> None:
        try:
            await self._over.wait()
        except asyncio.CancelledError:  # the request was cancelled: so are its branches
            self._cancel()
            raise
        if self._error is not None:
            raise self._error
