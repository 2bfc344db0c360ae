"""The one protocol-neutral server API that both network frontends call.

A frontend decodes its wire format into plain Python values and
:class:`~tritonfast.data.types.InferRequest` objects, calls one method here, and encodes
the result (or the :class:`~tritonfast.errors.TritonError` raised) back onto the wire. No
HTTP or gRPC type crosses this boundary, and nothing here imports a frontend.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable, Iterable
from concurrent.futures import Future
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from tritonfast import __version__
from tritonfast._core import LaneCompletions
from tritonfast.api.bulkwork import BulkWork
from tritonfast.config.jsonform import config_to_json
from tritonfast.custommetrics import ServerCustomMetrics
from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import (
    DECOUPLED_REFUSAL,
    InvalidArgumentError,
    TritonError,
    UnsupportedError,
)
from tritonfast.logsettings import ServerLog
from tritonfast.memory.bodybudget import BodyBudget
from tritonfast.memory.sharedmemory import SharedMemory
from tritonfast.runtime.classification import wants_classification
from tritonfast.runtime.responses import Streamed
from tritonfast.tracing import RequestTrace, Tracer

if TYPE_CHECKING:
    from tritonfast._proto import model_config_pb2
    from tritonfast.repository.control import ModelControl
    from tritonfast.repository.manager import ModelRepository
    from tritonfast.repository.model import ModelVersion
    from tritonfast.runtime.lane import CoreLane

# Protocol extensions this server implements (reported in server metadata).
EXTENSIONS: tuple[str, ...] = (
    "classification",
    "sequence",
    "schedule_policy",
    "binary_tensor_data",
    "parameters",
    "model_configuration",
    "model_repository",
    "model_repository(unload_dependents)",
    "system_shared_memory",
    "cuda_shared_memory",
    "statistics",
    "logging",
    "trace",
)


class DataPlane:
    def __init__(
        self,
        control: ModelControl,
        *,
        server_id: str = "triton",
        strict_readiness: bool = True,
        shared_memory: SharedMemory | None = None,
        server_log: ServerLog | None = None,
        tracer: Tracer | None = None,
        http_header_forward_pattern: str = "",
        grpc_header_forward_pattern: str = "",
        body_budget: BodyBudget | None = None,
    ) -> None:
        self._control = control
        # What both frontends count large request bodies against, and the threads they
        # decode and inflate the heaviest ones on: this server's own.
        self.body_budget = body_budget or BodyBudget()
        self.bulk_work = BulkWork()
        # The metrics its models define (pb_utils.MetricFamily), for /metrics.
        self.custom_metrics = ServerCustomMetrics()
        # Which HTTP requests the core answered by itself (runtime.lane), for the frontend.
        self.lane_completions = LaneCompletions()
        # Triton's --http/grpc-header-forward-pattern: matching headers (gRPC metadata)
        # become request parameters.
        self._forwarded_headers = {
            protocol: re.compile(pattern)
            for protocol, pattern in (
                ("HTTP", http_header_forward_pattern),
                ("GRPC", grpc_header_forward_pattern),
            )
            if pattern
        }
        self._repository = control.repository
        # The lanes of its models, for the calls models make that the core takes (BLS).
        self.lane_registry = control.repository.lane_registry
        self._server_id = server_id
        self._strict_readiness = strict_readiness
        self._log = server_log or ServerLog.current()
        self.tracer = tracer or Tracer()
        self._live = True
        self._shared_memory = shared_memory or SharedMemory()
        # Its system shared-memory regions, for the lanes to find requests' regions in.
        self.shared_memory_regions = self._shared_memory.system_regions

    @property
    def repository(self) -> ModelRepository:
        return self._repository

    # -- health ---------------------------------------------------------------------------
    def live(self) -> bool:
        return self._live

    def ready(self) -> bool:
        if not self._strict_readiness:
            return self._live
        return self._live and self._repository.all_ready()

    def shutting_down(self) -> None:
        """Called when the server begins to stop: readiness goes false at once."""
        self._live = False

    # -- metadata ---------------------------------------------------------------------------
    def server_metadata(self) -> dict[str, Any]:
        return {"name": self._server_id, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_ready(self, name: str, version: str = "") -> bool:
        return self._repository.is_ready(name, version)

    def require_model(self, name: str, version: str = "", endpoint: str | None = None) -> None:
        """Raise Triton's unknown-model error unless ``name`` (``version``) serves, and, for a
        single-response ``endpoint``, its refusal of a decoupled model. Frontends call it when
        a request is also malformed: Triton names those before what is wrong with the body."""
        self._model_for(name, version, endpoint)

    def _model_for(self, name: str, version: str, endpoint: str | None) -> ModelVersion:
        model = self._repository.get(name, version)
        if endpoint is not None and model.decoupled:
            raise UnsupportedError(f"{endpoint} {DECOUPLED_REFUSAL}")
        return model

    def lane_for(self, name: str, version: str = "") -> CoreLane | None:
        """The core's lane of the version serving ``name`` (``version``), when HTTP requests
        to it may be handed to the core whole: None for an unknown model, one answered from
        the response cache, and any the core does not drive."""
        try:
            model = self._repository.get(name, version)
        except TritonError:
            return None
        return model.http_lane

    def events_lane_for(self, name: str, version: str = "") -> CoreLane | None:
        """:meth:`lane_for`, for ``generate_stream`` requests the core answers whole: None
        also for a model that keeps a first-response histogram (which the server's Python
        observes)."""
        try:
            model = self._repository.get(name, version)
        except TritonError:
            return None
        if model.first_response_histogram() is not None:
            return None
        return model.http_lane

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model may send any number of responses per request."""
        return self._repository.get(name, version).decoupled

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """KServe v2 model metadata: name, versions, platform, inputs and outputs."""
        model = self._repository.get(name, version)
        return model.metadata()

    def model_config(self, name: str, version: str = "") -> model_config_pb2.ModelConfig:
        return self._repository.get(name, version).config

    def model_config_json(self, name: str, version: str = "") -> dict[str, Any]:
        """The model configuration in the JSON form Triton's HTTP endpoint returns."""
        return config_to_json(self.model_config(name, version))

    # -- statistics -------------------------------------------------------------------------
    def model_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension: ``{"model_stats": [...]}`` for one model or all."""
        versions = self._repository.serving(name, version)
        return {"model_stats": [v.statistics() for v in versions]}

    # -- inference --------------------------------------------------------------------------
    async def infer(
        self,
        request: InferRequest,
        received: tuple[str, int, int] | None = None,
        *,
        endpoint: str = "in-process inference",
    ) -> InferResponse:
        """Validate ``request`` against its model, queue it, and await its one response.

        ``received`` is ``(protocol, start_ns, end_ns)`` of reading the request, for tracing;
        a traced request keeps its trace in ``request.trace`` for the frontend to finish with
        :meth:`trace_sent`. Raises :class:`~tritonfast.errors.TritonError` with Triton's code
        and message for every failure (unknown model, bad input, model error); a decoupled
        model is refused with Triton's words for the ``endpoint`` (e.g. "ModelInfer RPC").
        """
        model = self._model_for(request.model_name, request.model_version, endpoint)
        trace = None
        if self.tracer.enabled:
            trace = self._start_trace(model.name, model.version, request, received)
        try:
            windows = None
            if request.uses_shared_memory:
                windows = self._shared_memory.resolve_inputs(
                    request,
                    on_device=model.takes_device_memory,
                    place_outputs=not model.caches_responses,
                )
            response = await model.infer(request)
            if request.outputs is not None and wants_classification(request.outputs):
                model.classify(response, request.outputs)
            if trace is not None:
                trace.record_tensors("TENSOR_BACKEND_OUTPUT", response.outputs)
            if windows is not None:
                self._shared_memory.write_outputs(response, windows)
        except BaseException:
            self._end_failed_trace(request, trace)
            raise
        if trace is not None:
            trace.stamp("REQUEST_END", perf_counter_ns())
            self._finish_child(request, trace)
        return response

    def _finish_child(self, request: InferRequest, trace: RequestTrace) -> None:
        """A request made for another (an ensemble's step, a BLS call) has no frontend to
        finish its trace once its response is sent: it ends with its last response."""
        if request.parent_trace is not None:
            request.trace = None
            self.tracer.finish(trace)

    def forwards_headers(self, protocol: str) -> bool:
        """Whether ``protocol`` ("HTTP" or "GRPC") has a header forward pattern."""
        return protocol in self._forwarded_headers

    def forward_headers(
        self, protocol: str, request: InferRequest, headers: Iterable[tuple[str, Any]]
    ) -> None:
        """Add the headers whose names match ``protocol``'s forward pattern to the request's
        parameters (the pattern found anywhere in the name, an unanchored search)."""
        pattern = self._forwarded_headers.get(protocol)
        if pattern is None:
            return
        for name, value in headers:
            if isinstance(value, str) and pattern.search(name):
                request.parameters[name] = value

    def check(self, request: InferRequest) -> None:
        """Raise the error ``request`` would be refused with before running (an unknown or
        decoupled model, invalid inputs), without queueing it."""
        model = self._repository.get(request.model_name, request.model_version)
        if model.decoupled:
            raise UnsupportedError(f"in-process inference {DECOUPLED_REFUSAL}")
        model.check(request)

    def submit(self, request: InferRequest, sink: Future[Any]) -> bool:
        """From a thread other than the loop's: validate and queue ``request`` for a
        single-response model, its response to be set on ``sink``. False when it must go
        through :meth:`infer` instead (tracing on, a scheduler without a queue); raises
        Triton's error for a request that cannot be queued."""
        if (
            self.tracer.enabled
            or request.uses_shared_memory
            or wants_classification(request.outputs)
        ):
            return False
        model = self._repository.get(request.model_name, request.model_version)
        if model.decoupled:
            raise UnsupportedError(f"in-process inference {DECOUPLED_REFUSAL}")
        return model.submit(request, sink)

    async def stream(
        self, request: InferRequest, received: tuple[str, int, int] | None = None
    ) -> AsyncGenerator[Streamed, None]:
        """Validate and queue ``request`` for any model, then yield its responses as they come.

        A request that cannot start (unknown model, bad input, a full queue) raises its
        :class:`~tritonfast.errors.TritonError` from the first iteration; after that every
        response, error responses included, is a :class:`Streamed` item, the last one with
        ``final`` set. Closing the iterator early (the client went away) cancels the request.
        A traced request's trace ends with the final item; the frontend finishes it with
        :meth:`trace_sent` once that is written.
        """
        model = self._repository.get(request.model_name, request.model_version)
        trace = self._start_trace(model.name, model.version, request, received)
        try:
            windows = None
            if request.uses_shared_memory:
                windows = self._shared_memory.resolve_inputs(
                    request,
                    on_device=model.takes_device_memory,
                    place_outputs=not model.caches_responses,
                )
            responses = model.open_stream(request)
        except BaseException:
            self._end_failed_trace(request, trace)
            raise
        classified = request.outputs is not None and wants_classification(request.outputs)
        try:
            async for item in responses:
                result = item.result
                if isinstance(result, InferResponse):
                    if classified:
                        assert request.outputs is not None
                        model.classify(result, request.outputs)
                    if trace is not None:
                        trace.record_tensors("TENSOR_BACKEND_OUTPUT", result.outputs)
                    if windows is not None:
                        self._shared_memory.write_outputs(result, windows)
                if item.final and trace is not None:
                    trace.stamp("REQUEST_END", perf_counter_ns())
                    self._finish_child(request, trace)
                yield item
        finally:
            responses.cancel()  # nothing once the final item has passed

    def _start_trace(
        self,
        model_name: str,
        version: int,
        request: InferRequest,
        received: tuple[str, int, int] | None,
    ) -> RequestTrace | None:
        if not self.tracer.enabled:
            return None
        parent = request.parent_trace
        parent_id = parent.id if parent is not None else 0
        trace = self.tracer.start(model_name, version, request.id, parent_id)
        if trace is not None:
            self._begin_trace(request, trace, received)
        return trace

    def _end_failed_trace(self, request: InferRequest, trace: RequestTrace | None) -> None:
        """A request that failed before its response: its trace ends here."""
        if trace is not None:
            trace.stamp("REQUEST_END", perf_counter_ns())
            request.trace = None
            self.tracer.finish(trace)

    @staticmethod
    def _begin_trace(
        request: InferRequest, trace: RequestTrace, received: tuple[str, int, int] | None
    ) -> None:
        if received is not None:
            protocol, start, end = received
            first, last = ("HTTP_RECV_START", "HTTP_RECV_END")
            if protocol == "GRPC":
                first, last = ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")
            trace.stamp(first, start)
            trace.stamp(last, end)
        trace.stamp("REQUEST_START", perf_counter_ns())
        request.trace = trace

    def trace_sent(self, request: InferRequest, protocol: str, start: int, end: int) -> None:
        """Finish a traced request once its response went out."""
        trace = request.trace
        if trace is None:
            return
        trace.stamp(f"{protocol}_SEND_START", start)
        trace.stamp(f"{protocol}_SEND_END", end)
        self.tracer.finish(trace)

    # -- trace settings ---------------------------------------------------------------------
    def trace_settings(self, model: str = "") -> dict[str, Any]:
        self._check_traced_model(model)
        return self.tracer.settings(model).as_dict()

    def update_trace_settings(self, changes: dict[str, Any], model: str = "") -> dict[str, Any]:
        self._check_traced_model(model)
        return self.tracer.update(changes, model).as_dict()

    def _check_traced_model(self, model: str) -> None:
        """Per-model trace settings need a servable model (Triton's words, INVALID_ARG)."""
        if model and not self._repository.is_ready(model):
            raise InvalidArgumentError(f"Request for unknown model : {model}")

    # -- logging ------------------------------------------------------------------------------
    def log_settings(self) -> dict[str, Any]:
        """``log_file, log_info, log_warning, log_error, log_verbose_level, log_format``."""
        return self._log.settings.as_dict()

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change the given settings (``None``: unchanged); returns them all."""
        return self._log.update(changes)

    # -- model repository -------------------------------------------------------------------
    def watch_models(self, changed: Callable[[], None]) -> None:
        """Have ``changed()`` called on the event loop whenever a model becomes READY or begins
        to unload."""
        self._repository.watchers.append(changed)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """``[{"name", "version", "state", "reason"}]`` for every model in the repository."""
        return self._control.index(ready_only)

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Load (or reload) ``name``; ``parameters`` may hold ``config`` and ``file:*``."""
        await self._control.load(name, parameters)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._control.unload(name, unload_dependents)

    # -- shared memory ----------------------------------------------------------------------
    def system_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        """``[{"name", "key", "offset", "byte_size"}]``: every region, or ``name`` only."""
        return self._shared_memory.system_status(name)

    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int
    ) -> None:
        self._shared_memory.register_system(name, key, offset, byte_size)

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """Unregister ``name``, or every system region when it is empty."""
        self._shared_memory.unregister_system(name)

    def cuda_shared_memory_status(self, name: str = "") -> list[dict[str, Any]]:
        """``[{"name", "device_id", "byte_size"}]``: every region, or ``name`` only."""
        return self._shared_memory.cuda_status(name)

    def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        self._shared_memory.register_cuda(name, raw_handle, device_id, byte_size)

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        self._shared_memory.unregister_cuda(name)
