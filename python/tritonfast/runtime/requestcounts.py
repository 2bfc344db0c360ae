"""Counting whole requests for a scheduler that runs no batches of its own: an ensemble's
(its steps' schedulers count their batches) and a Dynamo route's (the workers count theirs)."""

from __future__ import annotations

import time
from typing import Any

from tritonfast._core import EnsembleLane
from tritonfast.data.types import PhaseTimes

_NO_CORE_COUNTS: dict[str, Any] = {
    "success": (0, 0),
    "fail": (0, 0),
    "inferences": 0,
    "last_ms": 0,
    "queue_ns": 0,
    "compute_input_ns": 0,
    "compute_infer_ns": 0,
    "compute_output_ns": 0,
}


class RequestCounts:
    """The statistics of a scheduler that counts whole requests rather than batches (an
    ensemble's, a forwarding route's), in the layout of a scheduler's (see runtime.scheduler),
    with those of the requests the core ran (``core``: an ensemble's lane)."""

    def __init__(self, core: EnsembleLane | None = None) -> None:
        self._core = core
        self._success = [0, 0]
        self._fail = [0, 0]
        self._inferences = 0
        self._last_ms = 0
        # The successful requests' steps' times, summed (counted once per request).
        self._spent = PhaseTimes()

    def succeeded(self, ns: int, batch_size: int, spent: PhaseTimes) -> None:
        self._success[0] += 1
        self._success[1] += ns
        self._inferences += batch_size
        self._last_ms = int(time.time() * 1000)
        self._spent.add(spent)

    def failed(self, ns: int) -> None:
        self._fail[0] += 1
        self._fail[1] += ns

    def snapshot(self) -> dict[str, Any]:
        core = self._core.counts() if self._core is not None else _NO_CORE_COUNTS
        spent = self._spent
        success = [self._success[0] + core["success"][0], self._success[1] + core["success"][1]]
        fail = [self._fail[0] + core["fail"][0], self._fail[1] + core["fail"][1]]
        count = success[0]

        def tally(pair: list[int] | None = None) -> dict[str, int]:
            count, ns = pair if pair is not None else (0, 0)
            return {"count": count, "ns": ns}

        return {
            "last_inference": max(self._last_ms, core["last_ms"]),
            "inference_count": self._inferences + core["inferences"],
            "execution_count": count,
            "inference_stats": {
                "success": tally(success),
                "fail": tally(fail),
                # As Triton reports an ensemble's: the sums of its steps' times.
                "queue": tally([count, spent.queue + core["queue_ns"]]),
                "compute_input": tally([count, spent.compute_input + core["compute_input_ns"]]),
                "compute_infer": tally([count, spent.compute_infer + core["compute_infer_ns"]]),
                "compute_output": tally([count, spent.compute_output + core["compute_output_ns"]]),
                "cache_hit": tally(),
                "cache_miss": tally(),
            },
            "batch_stats": [],
            "failure_reasons": {"REJECTED": 0, "CANCELED": 0, "BACKEND": fail[0], "OTHER": 0},
        }
