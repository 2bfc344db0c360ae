"""Metrics that models define themselves (``pb_utils.MetricFamily``), kept for ``/metrics``.

Semantics follow Triton's Python backend:

- A family is registered by name; asking again for the same name and kind shares the first
  registration (its description stays), a different kind is an error.
- ``family.Metric(labels)`` with the same labels is the same metric (one value).
- Counters only go up (``increment`` with a non-negative value); gauges ``increment`` (either
  way) and ``set``; histograms take ``observe`` only, and need strictly increasing ``buckets``.
- When the last ``MetricFamily`` object of a name is gone, the family leaves ``/metrics`` and
  its metrics refuse every operation.

Everything here is thread-safe: model instances run on their own threads. Each server has its
own (:class:`ServerCustomMetrics`, reached through its handle: ``runtime.handle.current()``):
the registry its in-process models register in, and the latest state each of its models'
worker processes sent (:meth:`CustomMetrics.state`, with the worker's replies). ``/metrics``
shows them merged: series with the same family and labels add up (gauges: the newest value
wins). A worker's registry asks the server for that merged value (its ``ask_server``).
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"
KINDS = (COUNTER, GAUGE, HISTOGRAM)

DELETED_FAMILY = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# The server's own families (metrics.py): a model may not take these names.
RESERVED_NAMES = frozenset(
    f"nv_{name}"
    for name in (
        "inference_request_success",
        "inference_request_failure",
        "inference_count",
        "inference_exec_count",
        "inference_request_duration_us",
        "inference_queue_duration_us",
        "inference_compute_input_duration_us",
        "inference_compute_infer_duration_us",
        "inference_compute_output_duration_us",
        "inference_pending_request_count",
        "inference_request_summary_us",
        "inference_queue_summary_us",
        "inference_compute_input_summary_us",
        "inference_compute_infer_summary_us",
        "inference_compute_output_summary_us",
        "cpu_utilization",
        "cpu_memory_total_bytes",
        "cpu_memory_used_bytes",
        "gpu_utilization",
        "gpu_memory_total_bytes",
        "gpu_memory_used_bytes",
        "gpu_power_usage",
        "gpu_power_limit",
        "energy_consumption",
    )
)

Labels = tuple[tuple[str, str], ...]


class MetricError(Exception):
    """A misuse of the custom-metrics API (pb_utils turns it into TritonModelException)."""


@dataclass
class Series:
    """One labelled metric: a value, or a histogram's bucket counts, sum and count."""

    labels: Labels
    value: float = 0.0
    buckets: tuple[float, ...] = ()
    bucket_counts: list[int] = field(default_factory=list)
    count: int = 0
    # When a gauge last changed (ns since the epoch): of several workers' values of one
    # gauge, the newest is the gauge's.
    changed_ns: int = 0


@dataclass
class Family:
    name: str
    description: str
    kind: str
    series: dict[Labels, Series] = field(default_factory=dict)
    holders: int = 0  # live MetricFamily objects
    alive: bool = True


class CustomMetrics:
    """Custom metric families: a server's in-process models', or one worker process's."""

    def __init__(
        self, ask_server: Callable[[str, Labels, State], float | None] | None = None
    ) -> None:
        self._families: dict[str, Family] = {}
        self._lock = threading.Lock()
        self._changes = 0  # bumped by every change, so a worker sends its state only then
        # In a worker process: asks the server for a metric's value over all its processes
        # (family name, labels, this registry's state); None (or its answer None: it cannot
        # ask now) means this registry's own value.
        self._ask_server = ask_server
        self._sent = -1

    def state_if_changed(self) -> State | None:
        """:meth:`state`, or None when nothing changed since the last call returned one."""
        with self._lock:
            if self._changes == self._sent:
                return None
            self._sent = self._changes
        return self.state()

    def state(self) -> State:
        """Every live family, in registration order, with copies of its series (picklable)."""
        with self._lock:
            return [
                (
                    family.name,
                    family.description,
                    family.kind,
                    [_copy(s) for s in family.series.values()],
                )
                for family in self._families.values()
            ]

    # -- families ------------------------------------------------------------------------------
    def acquire_family(self, name: str, description: str, kind: str) -> Family:
        if kind not in KINDS:
            raise MetricError(f"unknown metric kind '{kind}'")
        if not _NAME.fullmatch(name or ""):
            raise MetricError(
                f"invalid metric family name '{name}': it must match [a-zA-Z_:][a-zA-Z0-9_:]*"
            )
        if name in RESERVED_NAMES:
            raise MetricError(f"metric family name '{name}' is one of the server's own metrics")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = Family(name, description, kind)
            elif family.kind != kind:
                raise MetricError(
                    f"metric family '{name}' already exists as a {family.kind}, not a {kind}"
                )
            family.holders += 1
            self._changes += 1
            return family

    def release_family(self, family: Family) -> None:
        with self._lock:
            family.holders -= 1
            if family.holders <= 0 and self._families.get(family.name) is family:
                family.alive = False
                del self._families[family.name]
                self._changes += 1

    def series(
        self, family: Family, labels: dict[str, str], buckets: Sequence[float] | None
    ) -> Series:
        """The metric of ``family`` with ``labels`` (made on first use)."""
        key = tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))
        if family.kind == HISTOGRAM:
            if buckets is None:
                raise MetricError("a histogram metric needs 'buckets'")
            bounds = tuple(float(b) for b in buckets)
            if any(a >= b for a, b in itertools.pairwise(bounds)):
                raise MetricError("histogram buckets must be strictly increasing")
        else:
            bounds = ()
        with self._lock:
            self._check(family)
            found = family.series.get(key)
            if found is None:
                found = family.series[key] = Series(key, 0.0, bounds, [0] * len(bounds))
                self._changes += 1
            return found

    # -- operations (Metric methods) -------------------------------------------------------------
    def value(self, family: Family, series: Series) -> float:
        """The metric's value; in a worker, its value over the server and every worker (as
        ``/metrics`` shows it), since a model's instances may run in several processes."""
        with self._lock:
            self._check(family)
            if family.kind == HISTOGRAM:
                raise MetricError("value() is not available for a histogram metric")
            ask = self._ask_server
            own = series.value
        if ask is None:
            return own
        merged = ask(family.name, series.labels, self.state())
        return own if merged is None else merged

    def increment(self, family: Family, series: Series, amount: float) -> None:
        with self._lock:
            self._check(family)
            if family.kind == HISTOGRAM:
                raise MetricError("increment() is not available for a histogram metric")
            if family.kind == COUNTER and amount < 0:
                raise MetricError("a counter can only be incremented by a non-negative value")
            series.value += amount
            series.changed_ns = time.time_ns()
            self._changes += 1

    def set(self, family: Family, series: Series, value: float) -> None:
        with self._lock:
            self._check(family)
            if family.kind != GAUGE:
                raise MetricError(f"set() is not available for a {family.kind} metric")
            series.value = value
            series.changed_ns = time.time_ns()
            self._changes += 1

    def observe(self, family: Family, series: Series, value: float) -> None:
        with self._lock:
            self._check(family)
            if family.kind != HISTOGRAM:
                raise MetricError(f"observe() is not available for a {family.kind} metric")
            index = bisect.bisect_left(series.buckets, value)
            if index < len(series.buckets):
                series.bucket_counts[index] += 1
            series.count += 1
            series.value += value
            self._changes += 1

    @staticmethod
    def _check(family: Family) -> None:
        if not family.alive:
            raise MetricError(DELETED_FAMILY)


def _copy(series: Series) -> Series:
    return Series(
        series.labels,
        series.value,
        series.buckets,
        list(series.bucket_counts),
        series.count,
        series.changed_ns,
    )


# A registry's exported state: (name, description, kind, series) per family.
State = list[tuple[str, str, str, list[Series]]]


class RemoteMetrics:
    """The latest state each worker process sent, by worker."""

    def __init__(self) -> None:
        self._states: dict[str, State] = {}
        self._lock = threading.Lock()

    def update(self, source: str, state: State) -> None:
        with self._lock:
            self._states[source] = state

    def remove(self, source: str) -> None:
        with self._lock:
            self._states.pop(source, None)

    def states(self, but: str | None = None) -> list[State]:
        """The states of every worker (``but`` one)."""
        with self._lock:
            return [state for source, state in self._states.items() if source != but]


def merge(states: list[State]) -> list[tuple[str, str, str, list[Series]]]:
    """Families of several registries as one: the first description and kind of a name win;
    series with the same labels add up (a gauge takes the later state's value)."""
    merged: dict[str, tuple[str, str, str, dict[Labels, Series]]] = {}
    for state in states:
        for name, description, kind, series in state:
            known = merged.setdefault(name, (name, description, kind, {}))
            if known[2] != kind:
                continue
            for one in series:
                total = known[3].get(one.labels)
                if total is None:
                    known[3][one.labels] = _copy(one)
                elif kind == GAUGE:
                    if one.changed_ns >= total.changed_ns:  # the newest value
                        total.value, total.changed_ns = one.value, one.changed_ns
                elif total.buckets == one.buckets:
                    total.value += one.value
                    total.count += one.count
                    total.bucket_counts = [
                        a + b for a, b in zip(total.bucket_counts, one.bucket_counts, strict=True)
                    ]
    return [(name, doc, kind, list(series.values())) for name, doc, kind, series in merged.values()]


class ServerCustomMetrics:
    """One server's custom metrics: the families of its in-process models (``registry``) and
    the states its models' worker processes last sent (``workers``)."""

    def __init__(self, registry: CustomMetrics | None = None) -> None:
        self.registry = registry or CustomMetrics()
        self.workers = RemoteMetrics()

    def states(self) -> list[State]:
        return [self.registry.state(), *self.workers.states()]

    def merged_value(self, name: str, labels: Labels, source: str, state: State) -> float:
        """A metric's value over the server's registry and its workers', worker ``source``'s
        as it is now (``state``; 0 when no process has the metric yet)."""
        states = [self.registry.state(), *self.workers.states(but=source), state]
        for family, _, _, series in merge(states):
            if family == name:
                return next((one.value for one in series if one.labels == labels), 0.0)
        return 0.0
