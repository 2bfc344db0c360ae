"""A loaded, servable model version: its config, validator, scheduler and metadata."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from tritonfast._proto import model_config_pb2
from tritonfast.data.types import InferRequest, InferResponse, RequestedOutput
from tritonfast.errors import UnavailableError
from tritonfast.runtime.cache import ResponseCache
from tritonfast.runtime.classification import classify
from tritonfast.runtime.histogram import Histogram
from tritonfast.runtime.instance import running_instance
from tritonfast.runtime.lane import CoreLane
from tritonfast.runtime.responses import ResponseStream
from tritonfast.runtime.scheduler import Scheduler
from tritonfast.runtime.validate import RequestValidator


class ModelVersion:
    def __init__(
        self,
        config: model_config_pb2.ModelConfig,
        version: int,
        scheduler: Scheduler,
        served_versions: list[int],
        model_dir: Path | None = None,
        cache: ResponseCache | None = None,
        *,
        takes_device_memory: bool = False,
    ) -> None:
        self.config = config
        # Whether inputs and outputs in CUDA shared memory reach the backend as device memory
        # (memory.sharedmemory.resolve_inputs); not with the response cache, whose keys are
        # digests of host bytes.
        self.takes_device_memory = takes_device_memory and cache is None
        # The response cache, when the server has one and the model asks for it.
        self._cache = cache
        self._cache_hits = [0, 0]  # (count, ns): answered from the cache, and the lookups' time
        self._cache_misses = [0, 0]  # (count, ns): the lookups' and insertions' time
        self._model_dir = model_dir
        self._labels: dict[str, list[str] | None] = {}
        self.name = config.name
        self.version = version
        self._version_text = str(version)
        self._scheduler = scheduler
        self._validator = RequestValidator(config)
        self._metadata = _metadata(config, self._validator, served_versions)
        # Whether a request may yield any number of responses (then only streams reach them).
        self.decoupled = config.model_transaction_policy.decoupled

    def classify(self, response: InferResponse, outputs: list[RequestedOutput]) -> None:
        """Apply the classification extension to ``response`` (see runtime.classification)."""
        classify(response, outputs, self._output_labels, self.config.max_batch_size > 0)

    def _output_labels(self, name: str) -> list[str] | None:
        """The labels of output ``name`` from its ``label_filename`` (read once)."""
        if name not in self._labels:
            labels = None
            for output in self.config.output:
                if output.name == name and output.label_filename and self._model_dir:
                    path = self._model_dir / output.label_filename
                    labels = path.read_text().splitlines() if path.is_file() else None
            self._labels[name] = labels
        return self._labels[name]

    def metadata(self) -> dict[str, Any]:
        return self._metadata

    async def infer(self, request: InferRequest) -> InferResponse:
        """Check, queue and answer a single-response request (not for decoupled models);
        from the response cache when it holds the answer."""
        batch_size = self._validator.check(request)
        if running_instance() is not None:  # a model's call (or an ensemble step of one)
            self._refuse_if_stuck()
        request.model_version = self._version_text
        cache = self._cache
        if cache is None:
            return await self._scheduler.infer(request, batch_size)
        started = perf_counter_ns()
        key = cache.key(self.name, self._version_text, request)
        cached = cache.get(key, request)
        looked_up = perf_counter_ns()
        if cached is not None:
            self._cache_hits[0] += 1
            self._cache_hits[1] += looked_up - started
            return cached
        response = await self._scheduler.infer(request, batch_size)
        inserting = perf_counter_ns()
        cache.put(key, response)
        self._cache_misses[0] += 1
        self._cache_misses[1] += looked_up - started + perf_counter_ns() - inserting
        return response

    @property
    def caches_responses(self) -> bool:
        return self._cache is not None

    @property
    def http_lane(self) -> CoreLane | None:
        """The core's lane when HTTP requests may go to it whole (see runtime.lane): not for
        a version answered from the response cache, which Python keeps."""
        if self._cache is not None:
            return None
        return self._scheduler.core_lane()

    def check(self, request: InferRequest) -> None:
        """Raise the error a call from a model (BLS) would get before running: a validation
        error, or UNAVAILABLE when every instance is itself waiting on such a call (the
        request could never run: a model calling itself, or a cycle of calls, directly or
        through an ensemble's steps). Calls from models are checked so wherever they enter
        (:meth:`infer`, :meth:`open_stream`, :meth:`submit`); the calling instance counts as
        waiting from before its call is checked, so of two calls that would close a cycle,
        the second is refused."""
        self._validator.check(request)
        self._refuse_if_stuck()

    def _refuse_if_stuck(self) -> None:
        if self._scheduler.waiting_on_server():
            raise UnavailableError(
                f"model '{self.name}' cannot take this call: every instance of it is waiting on a"
                " call to the server (a model calling itself, or a cycle of calls), so it would"
                " wait forever"
            )

    def submit(self, request: InferRequest, sink: Future[Any]) -> bool:
        """Check and queue a single-response request from any thread, its response to be set
        on ``sink``; False when the scheduler cannot take it that way."""
        if self._cache is not None:
            return False  # answered by infer(), through the cache
        batch_size = self._validator.check(request)
        self._refuse_if_stuck()
        request.model_version = self._version_text
        return self._scheduler.submit(request, batch_size, sink)

    def open_stream(self, request: InferRequest) -> ResponseStream:
        """Check and queue ``request``; its responses arrive on the returned stream."""
        batch_size = self._validator.check(request)
        if running_instance() is not None:  # a model's call (or an ensemble step of one)
            self._refuse_if_stuck()
        request.model_version = self._version_text
        return self._scheduler.open_stream(request, batch_size)

    def counters(self) -> dict[str, Any]:
        """The core's counters for this version (the statistics layout plus
        ``failure_reasons``; see :class:`~tritonfast.runtime.scheduler.Scheduler`), with the
        response cache's hits and misses (a hit counts as a successful request, as in
        Triton)."""
        counters = self._scheduler.statistics()
        if self._cache is not None:
            stats = counters["inference_stats"]
            hits, misses = self._cache_hits, self._cache_misses
            stats["cache_hit"] = {"count": hits[0], "ns": hits[1]}
            stats["cache_miss"] = {"count": misses[0], "ns": misses[1]}
            success = stats["success"]
            stats["success"] = {"count": success["count"] + hits[0], "ns": success["ns"] + hits[1]}
        return counters

    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None:
        return self._scheduler.latency_summaries(quantiles)

    def first_response_histogram(self) -> Histogram | None:
        """Time to first response (ms) of a decoupled version, when histograms are on."""
        return self._scheduler.first_response_histogram()

    def pending(self) -> int:
        """Requests queued and not yet taken by an instance."""
        return self._scheduler.pending()

    def statistics(self) -> dict[str, Any]:
        """One ``model_stats`` entry of Triton's statistics extension for this version."""
        counters = self.counters()
        return {
            "name": self.name,
            "version": self._version_text,
            "last_inference": counters["last_inference"],
            "inference_count": counters["inference_count"],
            "execution_count": counters["execution_count"],
            "inference_stats": counters["inference_stats"],
            "response_stats": {},
            "batch_stats": counters["batch_stats"],
            "memory_usage": [],
        }

    def stop(self, timeout: float) -> None:
        self._scheduler.stop(timeout)


def _metadata(
    config: model_config_pb2.ModelConfig, validator: RequestValidator, versions: list[int]
) -> dict[str, Any]:
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "datatype": s.datatype, "shape": batch + list(s.dims)}
            for s in specs.values()
        ]

    return {
        "name": config.name,
        "versions": [str(v) for v in sorted(versions)],
        "platform": config.platform or config.backend,
        "inputs": tensors(validator.inputs),
        "outputs": tensors(validator.outputs),
    }
