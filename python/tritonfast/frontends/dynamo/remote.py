"""The models of a ``--dynamo-route`` server: each holds no instance that runs, and its
scheduler (:class:`ForwardingScheduler`) sends every request, as it comes and unbatched, to
a worker of the Dynamo deployment that serves the model, and gives back what the worker
answers (a decoupled model's responses as they come). The route's data plane has checked
the request against the model's configuration before (Triton's datatype, shape and name
checks) and reads and writes the client's shared memory around it; the workers batch.

A route serves every kind of model its workers announce, so :func:`install` registers the
forwarding backend under every backend and platform name (a route process serves no model
of its own); the model's configuration stays the worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Coroutine
from time import perf_counter_ns
from typing import Any, ClassVar, Protocol

from tritonfast._proto import model_config_pb2
from tritonfast.backends import registry
from tritonfast.backends.base import Backend, InstancePlacement
from tritonfast.data.types import InferRequest, InferResponse, PhaseTimes
from tritonfast.errors import InternalError, TritonError, UnavailableError
from tritonfast.frontends.dynamo.messages import forwarded_message, response_of
from tritonfast.runtime.modelinstance import ModelInstance, PhaseClock
from tritonfast.runtime.requestcounts import RequestCounts
from tritonfast.runtime.responses import ResponseStream, Result, settle, task_stream
from tritonfast.runtime.scheduler import Scheduler

# How many more workers a request that never reached one is offered to.
RETRIES = 3


# Dynamo's words for a request that no worker's model got: the worker it was picked for left
# discovery (or died) before the request went out or before the response stream was set up,
# or, while workers come and go, the client had none to offer for a moment.
NO_WORKERS = "No workers available for endpoint"
NEVER_RAN = (
    "Worker disconnected before response stream was established",
    "Worker disconnected before request stream was established",
    "Worker removed before request could be sent",
    NO_WORKERS,
)
# A pause before offering such a request again, times the attempt.
RETRY_PAUSE_S = 0.05
# How long a request waits for its model's client to know a worker (none known: a model just
# loaded, or workers coming and going).
WORKERS_WAIT_S = 5.0


async def _workers_known(client: Any) -> None:
    """Until ``client`` knows a worker of its endpoint, or :data:`WORKERS_WAIT_S` passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.wait_for_instances(), WORKERS_WAIT_S)


def _never_ran(error: Exception) -> bool:
    """Whether Dynamo failed the request before any worker's model got it."""
    text = str(error)
    return any(words in text for words in NEVER_RAN)


class Workers(Protocol):
    """Where a route's requests go: the Dynamo client of a model's endpoint."""

    async def client_for(self, model: str) -> Any: ...


class ForwardingScheduler(Scheduler):
    """A route's scheduler for one model (see the module docstring)."""

    def __init__(
        self,
        config: model_config_pb2.ModelConfig,
        loop: asyncio.AbstractEventLoop,
        workers: Workers,
    ) -> None:
        self._name = config.name
        self._decoupled = config.model_transaction_policy.decoupled
        self._loop = loop
        self._workers = workers
        self._stats = RequestCounts()
        self._running: set[asyncio.Task[Any]] = set()

    async def _responses(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """What the worker answers ``request``, one response at a time. A request that never
        reached a worker's model (the worker left discovery, or could not be reached, before
        its response stream was set up: Dynamo's "migratable" failures) goes to another
        worker, up to :data:`RETRIES` times; a sequence's request is not moved."""
        message = forwarded_message(request)
        sequence = request.parameters.get("sequence_id")
        for attempt in range(RETRIES + 1):
            answered = False
            client = None
            try:
                client = await self._workers.client_for(self._name)
                async for item in await self._send(client, message, sequence):
                    answered = True
                    yield response_of(item, request)
                return
            except TritonError:
                raise
            except Exception as error:  # the worker's or the transport's words
                if not answered and not sequence and attempt < RETRIES and _never_ran(error):
                    if client is not None and NO_WORKERS in str(error):
                        await _workers_known(client)
                    await asyncio.sleep(RETRY_PAUSE_S * attempt)
                    continue
                text = str(error) or type(error).__name__
                raise InternalError(f"model '{self._name}' on its Dynamo worker: {text}") from None

    async def _send(self, client: Any, message: dict[str, Any], sequence: Any) -> Any:
        if not sequence:
            return await client.round_robin(message, annotated=False)
        # A sequence's requests all go to one worker, which holds its state.
        workers = sorted(client.instance_ids())
        if not workers:
            # A model the route has just loaded: its client may not know the workers yet.
            await _workers_known(client)
            workers = sorted(client.instance_ids())
        if not workers:
            raise UnavailableError(f"model '{self._name}': no Dynamo worker serves it")
        chosen = workers[zlib.crc32(str(sequence).encode()) % len(workers)]
        return await client.direct(message, chosen, annotated=False)

    async def infer(self, request: InferRequest, batch_size: int) -> InferResponse:
        started = perf_counter_ns()
        try:
            answer = None
            async for response in self._responses(request):
                answer = response
            if answer is None:
                raise InternalError(f"model '{self._name}': its Dynamo worker sent no response")
        except TritonError:
            self._stats.failed(perf_counter_ns() - started)
            raise
        self._stats.succeeded(perf_counter_ns() - started, max(batch_size, 1), PhaseTimes())
        return answer

    def open_stream(self, request: InferRequest, batch_size: int) -> ResponseStream:
        def answer(stream: ResponseStream) -> Coroutine[Any, Any, None]:
            return self._answer(request, batch_size, stream)

        return task_stream(self._loop, request, answer, self._running)

    async def _answer(self, request: InferRequest, batch_size: int, stream: ResponseStream) -> None:
        if not self._decoupled:
            result: Result
            try:
                result = await self.infer(request, batch_size)
            except TritonError as error:
                result = error
            settle(stream, result, True)
            return
        started = perf_counter_ns()
        try:
            async for response in self._responses(request):
                settle(stream, response, False)
        except TritonError as error:
            self._stats.failed(perf_counter_ns() - started)
            settle(stream, error, True)
            return
        self._stats.succeeded(perf_counter_ns() - started, max(batch_size, 1), PhaseTimes())
        settle(stream, None, True)

    def statistics(self) -> dict[str, Any]:
        return self._stats.snapshot()

    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        return None

    def pending(self) -> int:
        return 0

    def stop(self, timeout: float) -> None:
        """Requests in flight are the workers' to finish (or fail, if the route goes)."""
        for task in list(self._running):
            self._loop.call_soon_threadsafe(task.cancel)


class _IdleInstance(ModelInstance):
    """The instances a route's configuration names: placeholders that never run (the
    forwarding scheduler takes every request to a worker)."""

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        error = UnavailableError("a Dynamo route runs no model itself")
        return [error] * len(requests)


class ForwardingBackend(Backend):
    """Serves a model announced by Dynamo workers (see the module docstring)."""

    name: ClassVar[str] = "tritonfast_dynamo_route"
    workers: ClassVar[Workers | None] = None

    def create_scheduler(  # type: ignore[override]
        self,
        name: str,
        config: model_config_pb2.ModelConfig,
        instances: list[ModelInstance],
        loop: asyncio.AbstractEventLoop,
        server: Any = None,
        **options: Any,
    ) -> Scheduler:
        assert self.workers is not None, "install() sets the route's workers"
        return ForwardingScheduler(config, loop, self.workers)

    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        return _IdleInstance()


def install(workers: Workers) -> None:
    """Serve every backend and platform name Triton knows with the forwarding backend, its
    requests going to ``workers`` (another backend name: :func:`register_name`)."""
    ForwardingBackend.workers = workers
    backend_names = set(registry.BUILTIN) | set(registry.TRITON_PLATFORMS.values())
    platforms: dict[str, list[str]] = {}
    for platform, backend in registry.TRITON_PLATFORMS.items():
        platforms.setdefault(backend, []).append(platform)
    for name in sorted(backend_names):
        register_name(name, tuple(platforms.get(name, ())))


def register_name(name: str, platforms: tuple[str, ...] = ()) -> None:
    """The forwarding backend under backend name ``name`` (and ``platforms``)."""
    forwarding = type(
        f"Forwarding_{name}", (ForwardingBackend,), {"name": name, "platforms": platforms}
    )
    registry.register(forwarding)
