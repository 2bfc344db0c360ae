"""The Prometheus endpoint on the metrics port (``GET /metrics``), with Triton's metrics.

Nothing is counted per request in Python: at scrape time :class:`InferenceMetrics` reads each
served model version's counters from the Rust core, :class:`CpuMetrics` reads ``/proc``,
:class:`PinnedMemoryMetrics` reports the (absent) pinned pool, and :class:`ModelMetrics`
exports the families models made with ``pb_utils.MetricFamily``. They are prometheus-client
collectors on one registry.

The text is written as Triton writes it: counters keep their names (prometheus-client's own
writer would rename them ``*_total``), integral values print without a fraction, and metrics
with the same name appear once per label set. Names, help texts and labels are Triton's::

    # HELP nv_inference_count Number of inferences performed (does not include cached requests)
    # TYPE nv_inference_count counter
    nv_inference_count{model="add_sub",version="1"} 3
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tritonfast.custommetrics import HISTOGRAM, ServerCustomMetrics, merge
from tritonfast.errors import InvalidArgumentError
from tritonfast.runtime.histogram import FIRST_RESPONSE_FAMILY

if TYPE_CHECKING:
    from tritonfast.repository.manager import ModelRepository

CONTENT_TYPE = "text/plain; charset=utf-8"

# (name, help, where the value is in a version's statistics); Triton's names and texts.
_REQUEST_COUNTERS = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        ("inference_stats", "success", "count"),
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        ("inference_count",),
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        ("execution_count",),
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        ("inference_stats", "success", "ns"),
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        ("inference_stats", "queue", "ns"),
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        ("inference_stats", "compute_input", "ns"),
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        ("inference_stats", "compute_infer", "ns"),
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached"
        " requests)",
        ("inference_stats", "compute_output", "ns"),
    ),
)
# The response cache's per-model counters (for models that use it): (name, help, statistics
# entry, field).
_CACHE_COUNTERS = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "cache_hit", "count"),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "cache_miss", "count"),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        "cache_hit",
        "ns",
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert+lookup) duration per model, in microseconds",
        "cache_miss",
        "ns",
    ),
)
FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")
# Triton's default summary quantiles (the error terms after ':' are accepted and ignored).
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
# Latency summaries: (name, help, key in the core's summaries); Triton's names and texts.
_SUMMARIES = (
    (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds (includes cached requests)",
        "request",
    ),
    (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    (
        "nv_inference_compute_input_summary_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_summary_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_summary_us",
        "Cumulative inference compute output duration in microseconds (does not include cached"
        " requests)",
        "compute_output",
    ),
)


@dataclass(frozen=True)
class MetricsConfig:
    """``--metrics-config`` settings."""

    summary_latencies: bool = False
    summary_quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    # Time-to-first-response histograms of decoupled models.
    histogram_latencies: bool = False


def parse_metrics_config(values: list[str]) -> MetricsConfig:
    config = MetricsConfig()
    for value in values:
        key, separator, text = value.partition("=")
        if not separator:
            raise InvalidArgumentError(f"--metrics-config expects key=value, got '{value}'")
        if key == "summary_latencies":
            config = replace(config, summary_latencies=_true(text))
        elif key == "summary_quantiles":
            try:
                quantiles = tuple(float(item.split(":")[0]) for item in text.split(",") if item)
            except ValueError:
                raise InvalidArgumentError(f"bad summary_quantiles '{text}'") from None
            if not quantiles or not all(0 <= q <= 1 for q in quantiles):
                raise InvalidArgumentError(f"bad summary_quantiles '{text}'")
            config = replace(config, summary_quantiles=quantiles)
        elif key == "histogram_latencies":
            config = replace(config, histogram_latencies=_true(text))
        elif key == "counter_latencies":
            pass  # counters are always on
        else:
            raise InvalidArgumentError(f"unknown --metrics-config setting '{key}'")
    return config


def _true(text: str) -> bool:
    return text.lower() in ("true", "1", "yes", "on")


def _lookup(counters: dict[str, Any], path: tuple[str, ...]) -> int:
    value: Any = counters
    for key in path:
        value = value[key]
    # Durations are kept in nanoseconds; Triton exports whole microseconds.
    return int(value) // 1000 if path[-1] == "ns" else int(value)


class InferenceMetrics(Collector):
    """``nv_inference_*`` for every served model version, read from the core's counters."""

    def __init__(self, repository: ModelRepository, config: MetricsConfig | None = None) -> None:
        self._repository = repository
        self._config = config or MetricsConfig()

    def collect(self) -> Iterator[Metric]:
        yield from self._counters()
        if self._config.histogram_latencies:
            yield self._first_response_histograms()
        if self._config.summary_latencies:
            yield from self._summaries()

    def _first_response_histograms(self) -> Metric:
        name = FIRST_RESPONSE_FAMILY
        metric = Metric(
            name, "Duration from request to first response in milliseconds", "histogram"
        )
        for version in self._repository.serving():
            histogram = version.first_response_histogram()
            if histogram is None:
                continue
            labels = {"model": version.name, "version": str(version.version)}
            for bound, count in histogram.cumulative():
                metric.add_sample(name + "_bucket", {**labels, "le": _number(bound)}, count)
            metric.add_sample(name + "_count", labels, histogram.count)
            metric.add_sample(name + "_sum", labels, histogram.sum)
        return metric

    def _summaries(self) -> Iterator[Metric]:
        quantiles = list(self._config.summary_quantiles)
        versions = [
            ({"model": v.name, "version": str(v.version)}, v.latency_summaries(quantiles))
            for v in self._repository.serving()
        ]
        for name, documentation, key in _SUMMARIES:
            metric = Metric(name, documentation, "summary")
            for labels, summaries in versions:
                if summaries is None:
                    continue
                count, total, values = summaries[key]
                metric.add_sample(name + "_count", labels, count)
                metric.add_sample(name + "_sum", labels, total)
                for quantile, value in values:
                    metric.add_sample(name, {**labels, "quantile": _number(quantile)}, value)
            yield metric

    def _counters(self) -> Iterator[Metric]:
        versions = [
            ({"model": v.name, "version": str(v.version)}, v.counters(), v.pending())
            for v in self._repository.serving()
        ]
        success_name, success_help, success_path = _REQUEST_COUNTERS[0]
        yield _family(
            success_name,
            success_help,
            "counter",
            ((labels, _lookup(counters, success_path)) for labels, counters, _ in versions),
        )
        yield _family(
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
            "counter",
            (
                ({**labels, "reason": reason}, counters["failure_reasons"].get(reason, 0))
                for labels, counters, _ in versions
                for reason in FAILURE_REASONS
            ),
        )
        for name, documentation, path in _REQUEST_COUNTERS[1:]:
            yield _family(
                name,
                documentation,
                "counter",
                ((labels, _lookup(counters, path)) for labels, counters, _ in versions),
            )
        cached = [
            ({"model": v.name, "version": str(v.version)}, v.counters()["inference_stats"])
            for v in self._repository.serving()
            if v.caches_responses
        ]
        if cached:
            for name, documentation, kind, field in _CACHE_COUNTERS:
                yield _family(
                    name,
                    documentation,
                    "counter",
                    (
                        (labels, stats[kind][field] // (1000 if field == "ns" else 1))
                        for labels, stats in cached
                    ),
                )
        yield _family(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            "gauge",
            ((labels, pending) for labels, _, pending in versions),
        )


class PinnedMemoryMetrics(Collector):
    """Triton's pinned memory pool gauges, always 0: tritonfast keeps no pool of page-locked
    host memory (tensors stay in ordinary memory and shared-memory segments, and CUDA copies
    go through the client's own buffers), so the pool is as empty as a Triton's without CUDA,
    which exports the same two zeros. Exported so that dashboards and alerts built on the
    names find them."""

    def collect(self) -> Iterator[Metric]:
        yield _family(
            "nv_pinned_memory_pool_total_bytes",
            "Pinned memory pool total memory size, in bytes",
            "gauge",
            [({}, 0)],
        )
        yield _family(
            "nv_pinned_memory_pool_used_bytes",
            "Pinned memory pool used memory size, in bytes",
            "gauge",
            [({}, 0)],
        )


class CpuMetrics(Collector):
    """Triton's CPU metrics from ``/proc``: utilization since the previous scrape, memory."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._last = self._cpu_times()

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies of all CPUs."""
        try:
            fields = (self._proc / "stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return None
        values = [int(v) for v in fields]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        total = sum(values[:8])  # guest time is already counted in user
        return total - idle, total

    def _memory(self) -> tuple[int, int] | None:
        """(total, used) bytes; used is what is not available to new programs."""
        try:
            lines = (self._proc / "meminfo").read_text().splitlines()
        except OSError:
            return None
        kib = {line.split(":")[0]: int(line.split()[1]) for line in lines if ":" in line}
        total = kib.get("MemTotal", 0) * 1024
        available = kib.get("MemAvailable", kib.get("MemFree", 0)) * 1024
        return total, total - available

    def collect(self) -> Iterator[Metric]:
        now = self._cpu_times()
        if now is not None:
            utilization = 0.0
            if self._last is not None and now[1] > self._last[1]:
                utilization = (now[0] - self._last[0]) / (now[1] - self._last[1])
            self._last = now
            yield _family(
                "nv_cpu_utilization",
                "CPU utilization rate [0.0 - 1.0]",
                "gauge",
                [({}, min(max(utilization, 0.0), 1.0))],
            )
        memory = self._memory()
        if memory is not None:
            yield _family(
                "nv_cpu_memory_total_bytes",
                "CPU total memory (RAM), in bytes",
                "gauge",
                [({}, memory[0])],
            )
            yield _family(
                "nv_cpu_memory_used_bytes",
                "CPU used memory (RAM), in bytes",
                "gauge",
                [({}, memory[1])],
            )


class GpuMetrics(Collector):
    """Triton's GPU gauges per device (label ``gpu_uuid``), read through NVML (the
    ``nvidia-ml-py`` package). Without NVML or a GPU it exports nothing."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._energy_start: dict[str, float] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # no package, no driver or no device: no GPU metrics
            return

    def _readings(self, uuid: str, handle: Any) -> Iterator[tuple[str, float]]:
        """Each reading the GPU supports (one it does not is left out, not an error)."""
        for name, _, _, read in _GPU_FAMILIES:
            try:
                yield name, float(read(self, uuid, handle))
            except Exception:  # an NVML error for this reading
                continue

    def _energy_since_start(self, uuid: str, handle: Any) -> float:
        energy = self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000  # mJ -> J
        return float(energy - self._energy_start.setdefault(uuid, energy))

    def _devices(self) -> Iterator[tuple[str, Any]]:
        nvml = self._nvml
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            yield (uuid.decode() if isinstance(uuid, bytes) else uuid), handle

    def collect(self) -> Iterator[Metric]:
        if self._nvml is None:
            return
        rows: dict[str, list[tuple[dict[str, str], float]]] = {}
        try:
            devices = list(self._devices())
        except Exception:  # NVML failing must not fail the scrape
            devices = []
        for uuid, handle in devices:
            for name, value in self._readings(uuid, handle):
                rows.setdefault(name, []).append(({"gpu_uuid": uuid}, value))
        for name, documentation, kind, _ in _GPU_FAMILIES:
            if name in rows:
                yield _family(name, documentation, kind, rows[name])


# Triton's GPU metric families: name, help, type, and how one device's value is read.
_GpuRead = Callable[[GpuMetrics, str, Any], float]
_GPU_FAMILIES: tuple[tuple[str, str, str, _GpuRead], ...] = (
    (
        "nv_gpu_utilization",
        "GPU utilization rate [0.0 - 1.0)",
        "gauge",
        lambda gpus, _, handle: gpus._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100,
    ),
    (
        "nv_gpu_memory_total_bytes",
        "GPU total memory, in bytes",
        "gauge",
        lambda gpus, _, handle: gpus._nvml.nvmlDeviceGetMemoryInfo(handle).total,
    ),
    (
        "nv_gpu_memory_used_bytes",
        "GPU used memory, in bytes",
        "gauge",
        lambda gpus, _, handle: gpus._nvml.nvmlDeviceGetMemoryInfo(handle).used,
    ),
    (
        "nv_gpu_power_usage",
        "GPU power usage in watts",
        "gauge",
        lambda gpus, _, handle: gpus._nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
    ),
    (
        "nv_gpu_power_limit",
        "GPU power management limit in watts",
        "gauge",
        lambda gpus, _, handle: gpus._nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
    ),
    (
        "nv_energy_consumption",
        "GPU energy consumption in joules since the Triton Server started",
        "counter",
        lambda gpus, uuid, handle: gpus._energy_since_start(uuid, handle),
    ),
)


class ModelMetrics(Collector):
    """The families models registered with ``pb_utils.MetricFamily``."""

    def __init__(self, metrics: ServerCustomMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        for name, description, kind, series in merge(self._metrics.states()):
            metric = Metric(name, description, kind)
            for one in series:
                labels = dict(one.labels)
                if kind != HISTOGRAM:
                    metric.add_sample(name, labels, one.value)
                    continue
                cumulative = 0
                for bound, count in zip(one.buckets, one.bucket_counts, strict=True):
                    cumulative += count
                    le = {**labels, "le": _number(bound)}
                    metric.add_sample(name + "_bucket", le, cumulative)
                metric.add_sample(name + "_bucket", {**labels, "le": "+Inf"}, one.count)
                metric.add_sample(name + "_sum", labels, one.value)
                metric.add_sample(name + "_count", labels, one.count)
            yield metric


def _family(
    name: str, documentation: str, kind: str, samples: Iterable[tuple[dict[str, str], float]]
) -> Metric:
    metric = Metric(name, documentation, kind)
    for labels, value in samples:
        metric.add_sample(name, labels, value)
    return metric


def _number(value: float) -> str:
    """A sample value as Triton prints it: integral values without a fraction."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 2**63:
        return str(int(value))
    return repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text format, with metric names exactly as collected."""
    lines: list[str] = []
    for metric in registry.collect():
        documentation = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        kind = "untyped" if metric.type == "unknown" else metric.type
        lines.append(f"# HELP {metric.name} {documentation}")
        lines.append(f"# TYPE {metric.name} {kind}")
        for sample in metric.samples:
            # Labels sorted by name, `le` and `quantile` last (as Triton prints them).
            ordered = sorted(
                sample.labels.items(), key=lambda item: (item[0] in ("le", "quantile"), item[0])
            )
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in ordered)
            series = f"{sample.name}{{{labels}}}" if labels else sample.name
            lines.append(f"{series} {_number(sample.value)}")
    return ("\n".join(lines) + "\n").encode() if lines else b""


def metrics_registry(
    repository: ModelRepository,
    custom: ServerCustomMetrics,
    *,
    cpu: bool = True,
    gpu: bool = True,
    config: MetricsConfig | None = None,
) -> CollectorRegistry:
    """A registry with Triton's metrics for ``repository`` and the models' own (``custom``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InferenceMetrics(repository, config))
    registry.register(PinnedMemoryMetrics())
    if gpu:
        registry.register(GpuMetrics())
    if cpu:
        registry.register(CpuMetrics())
    registry.register(ModelMetrics(custom))
    return registry


async def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> web.AppRunner:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=exposition(registry), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
