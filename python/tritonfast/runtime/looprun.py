"""Short executions of in-process models run on the event loop instead of instance threads.

An instance thread needs the GIL to run a Python model, and the event loop needs it to answer
requests; under load they hand it to each other for every batch, which costs more than a short
model's whole execution (two context switches and a contended lock each way). So once a
model's batches have shown themselves short, its instance threads keep forming batches in the
Rust core exactly as before (same waits, same batching rules, one batch per instance at a
time) but hand each batch to the loop through a :class:`~tritonfast._core.Handoff`, and the loop
runs it and answers its requests directly.

When: after :data:`WARM_BATCHES` batches, while the moving average of batch run times stays
under :data:`FAST_NS`; back to the threads when it rises above :data:`SLOW_NS`. A batch that
holds the loop longer than :data:`BLOCK_LIMIT_NS` sends the model version back to its threads
for good: the loop must never be held up twice by the same model. Chosen by the model's
``TRITONFAST_INSTANCE_MODE`` (``"auto"``, the default; ``"thread"`` keeps every batch on the
instance threads).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tritonfast._core import Handoff, RequestQueue
from tritonfast.backends.base import Result

if TYPE_CHECKING:
    from tritonfast.runtime.instance import InstanceLoop

log = logging.getLogger(__name__)

# Batches a model runs on its threads before its run times count.
WARM_BATCHES = 64
# Moving average of batch run times under which batches move to the loop, and over which they
# move back (nanoseconds).
FAST_NS = 150_000
SLOW_NS = 400_000
# A batch that holds the loop this long keeps the model on its threads from then on.
BLOCK_LIMIT_NS = 2_000_000
# Weight of the newest run time in the moving average.
_ALPHA = 1 / 16

# Settles one batch's futures on the loop: (batch seq, futures, results).
Settle = Callable[[int, list["asyncio.Future[Any]"], Sequence[Result]], None]


class LoopExecution:
    """The handoff of one model version and the rule that switches it on and off."""

    def __init__(self, name: str, queue: RequestQueue, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.handoff = Handoff(queue)
        self._loop = loop
        self._instances: list[InstanceLoop] = []
        self._settle: Settle | None = None
        self._batches = 0
        self._average_ns = float(SLOW_NS)
        self._banned = False
        self._watching = False

    def start(self, instances: list[InstanceLoop], settle: Settle) -> None:
        """Watch the handoff from the loop (callable from any thread)."""
        self._instances = instances
        self._settle = settle
        self._watching = True
        self._loop.call_soon_threadsafe(self._loop.add_reader, self.handoff, self._run_offered)

    def stop(self) -> None:
        """No more offers; batches already offered still run on the loop."""
        self._banned = True
        self.handoff.enabled = False

    def unwatch(self) -> None:
        """Stop watching the handoff (after the instance threads have finished)."""
        if self._watching and not self._loop.is_closed():
            self._watching = False
            self._loop.call_soon_threadsafe(self._loop.remove_reader, self.handoff)

    @property
    def on_loop(self) -> bool:
        return self.handoff.enabled

    def observe(self, run_ns: int, on_loop: bool) -> None:
        """Told after every batch, wherever it ran (always with the GIL held)."""
        self._batches += 1
        self._average_ns += (run_ns - self._average_ns) * _ALPHA
        if self._banned:
            return
        if on_loop and run_ns > BLOCK_LIMIT_NS:
            self._banned = True
            self.handoff.enabled = False
            log.info(
                "model %s: a batch held the event loop for %.1f ms; its batches run on its"
                " instance threads from now on",
                self.name,
                run_ns / 1e6,
            )
            return
        if self._batches < WARM_BATCHES:
            return
        enabled = self.handoff.enabled
        if not enabled and self._average_ns < FAST_NS:
            self.handoff.enabled = True
        elif enabled and self._average_ns > SLOW_NS:
            self.handoff.enabled = False

    def _run_offered(self) -> None:
        """On the loop: run every offered batch, let its instance go on, answer its requests."""
        settle = self._settle
        assert settle is not None
        for index, batch, done in self.handoff.take():
            try:
                outcome = self._instances[index].run(batch, on_loop=True)
            finally:
                done.complete()
            settle(*outcome)
