"""Time the interpreter spends in garbage collection, so that a collection which happens to
run during a model's batch is not charged to the model.

The loop-execution rule (:mod:`runtime.looprun`) sends a model back to its threads when one of
its batches holds the event loop too long. A generation-1 collection takes 1-2 ms in a loaded
server and a full one tens of ms; whichever batch is running pays for it, however fast the
model. Subtracting the collector's time keeps that rule about the model.
"""

from __future__ import annotations

import gc
from time import perf_counter_ns
from typing import Any

_started = 0
_total_ns = 0


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    global _started, _total_ns
    if phase == "start":
        _started = perf_counter_ns()
    elif _started:
        _total_ns += perf_counter_ns() - _started
        _started = 0


def total_ns() -> int:
    """Nanoseconds spent collecting since :func:`start_counting` (0 before)."""
    return _total_ns


def start_counting() -> None:
    """Count from now on (idempotent)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)
