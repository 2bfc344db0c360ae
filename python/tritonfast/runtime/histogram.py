"""Triton's time-to-first-response histogram (``nv_inference_first_response_histogram_ms``),
kept per decoupled model version when ``--metrics-config histogram_latencies=true``.

Observed on the event loop only (when a request's first response reaches its stream), so it
needs no lock; the metrics endpoint reads it on the same loop.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from tritonfast._proto import model_config_pb2

FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"
# Triton's default buckets for it (milliseconds).
DEFAULT_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)


class Histogram:
    """Counts per bucket (each observation in the first bucket whose bound it does not
    exceed, or past the last), with their count and sum."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at or below it)``, ending with ``(inf, count)``."""
        running = 0
        rows = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            rows.append((bound, running))
        return rows


def first_response_buckets(config: model_config_pb2.ModelConfig) -> tuple[float, ...]:
    """The model's buckets for the first-response histogram: ``model_metrics`` may override
    Triton's defaults."""
    for control in config.model_metrics.metric_control:
        if control.metric_identifier.family == FIRST_RESPONSE_FAMILY:
            return tuple(control.histogram_options.buckets)
    return DEFAULT_BUCKETS
