"""Short executions of in-process models run on the event loop instead of instance threads.

An instance thread needs the GIL to run a Python model, and the event loop needs it to answer
requests; under load they hand it to each other for every batch, which costs more than a short
model's whole execution (two context switches and a contended lock each way). So once a
model's batches have shown themselves short, its instance threads keep forming batches in the
Rust core exactly as before (same waits, same batching rules, one batch per instance at a
time) but hand each batch to the loop through a :class:`~tritonfast._core.Handoff`, and the loop
runs it and answers its requests directly.

When: after :data:`WARM_BATCHES` batches, once the shortest of the last :data:`WINDOW` batch
run times is under :data:`FAST_NS`; back to the threads when the shortest of the last
:data:`WINDOW` on the loop is over :data:`SLOW_NS`, or at once when one batch holds the loop
longer than :data:`BLOCK_LIMIT_NS` by its model's doing (see there). The shortest rather than
the average, because waiting for the GIL or for a core only ever adds to a run time: under
load, with the frontends' threads wanting the GIL too, even a fast model's average says
little, while a model that is really slow (or sleeps, or waits on I/O) is slow every time.
Each move back doubles the batches the model must run on its threads before it may return, so
a model that only now and then holds the loop does so rarely. A batch that fails on the loop
sends the model back for good (a model that needs a thread of its own, e.g. one calling
``asyncio.run``, fails quickly there).
Instances that run elsewhere (worker processes, ``ModelInstance.runs_elsewhere``) use the same
handoff with no rule at all: it is always on, and the loop only starts each batch in the worker
and settles it when the worker answers (:meth:`InstanceLoop.run_later`), so no batch of theirs
ever holds the loop.
For in-process models, chosen by the model's ``TRITONFAST_INSTANCE_MODE``: ``"auto"`` (the
default is ``"process"``, a worker; ``"thread"`` keeps every batch on the instance threads).

The rule for which models may run on the loop: never one that can wait, on the server (a BLS
call through :mod:`tritonfast.runtime.handle`) or on a stream, because a wait on the loop's
own thread could never end. So a model's batches never move to the loop when its backend says
so (:meth:`~tritonfast.backends.base.Backend.runs_on_event_loop`: e.g. decoupled Python
models) or when any instance does (``may_run_on_event_loop``: e.g. ``async def execute``, or
model code that names the server's calls), and a model that calls the server from one of its
batches on its own thread stays on its threads for good (:meth:`LoopExecution.calls_server`).
A call that still reaches the server from the loop's thread is refused with an error, never
left to hang (see :mod:`tritonfast.runtime.handle`), and the model goes back to its threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tritonfast._core import Handoff, RequestQueue
from tritonfast.errors import InternalError
from tritonfast.runtime import gcpause
from tritonfast.runtime.responses import Result, Sink

if TYPE_CHECKING:
    from tritonfast.runtime.instance import InstanceLoop

log = logging.getLogger(__name__)

# Batches a model runs on its threads before its run times count.
WARM_BATCHES = 64
# The run times looked at: the last WINDOW batches'.
WINDOW = 16
# Shortest recent run time under which batches move to the loop, and over which they move back
# (nanoseconds).
FAST_NS = 150_000
SLOW_NS = 400_000
# A batch that holds the loop this long sends the model back to its threads at once, when the
# model computed for at least half of it, or when it held the loop past STALL_LIMIT_NS in any
# case (a model that sleeps or waits on I/O). Between the two, a batch that took long while its
# model hardly ran was waiting for a core or for the GIL: not the model's doing, and no reason
# to move it (a model slow every time is caught by SLOW_NS).
BLOCK_LIMIT_NS = 2_000_000
STALL_LIMIT_NS = 20_000_000
# Retreats after which the wait before the next try stops doubling.
_MAX_BACKOFF = 12

# Settles one batch on the loop: (batch seq, sinks, results; see InstanceLoop.run).
Settle = Callable[[int, list[Sink], Sequence[Result | None] | None], None]


class LoopExecution:
    """The handoff of one model version and the rule that switches it on and off."""

    def __init__(self, name: str, queue: RequestQueue, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.handoff = Handoff(queue)
        self._loop = loop
        self._instances: list[InstanceLoop] = []
        self._settle: Settle | None = None
        self._batches = 0
        self._recent: deque[int] = deque(maxlen=WINDOW)
        self._retreats = 0
        self._next_try = WARM_BATCHES
        self._banned = False
        self._watching = False
        gcpause.start_counting()  # batch times reach `observe` without collection pauses

    def start(self, instances: list[InstanceLoop], settle: Settle) -> None:
        """Watch the handoff from the loop (callable from any thread)."""
        self._instances = instances
        self._settle = settle
        if instances and all(instance.runs_elsewhere for instance in instances):
            # The loop only passes batches to the workers and takes their answers: always on.
            self._banned = True  # never switched by run times
            self.handoff.enabled = True
        self._watching = True
        self._loop.call_soon_threadsafe(self._loop.add_reader, self.handoff, self._run_offered)

    def stop(self) -> None:
        """No more offers, for good; batches already offered still run on the loop."""
        self._banned = True
        self.handoff.close()

    def unwatch(self) -> None:
        """Stop watching the handoff (after :meth:`stop`), running what is still offered."""
        if self._watching and not self._loop.is_closed():
            self._watching = False
            self._loop.call_soon_threadsafe(self._last_run)

    def _last_run(self) -> None:
        self._loop.remove_reader(self.handoff)
        self._run_offered()

    def _ban(self, why: str) -> None:
        self._banned = True
        self.handoff.close()
        log.info(
            "model %s: %s; its batches run on its instance threads from now on", self.name, why
        )

    def calls_server(self) -> None:
        """The model waited on the server (runtime.handle) in a batch on its own thread: it
        must never run on the loop, where that wait could not end."""
        if not self._banned:
            self._ban("it calls the server")

    @property
    def on_loop(self) -> bool:
        return self.handoff.enabled

    def observe(self, run_ns: int, cpu_ns: int, on_loop: bool, failed: bool) -> None:
        """Told after every batch, wherever it ran (always with the GIL held): its wall-clock
        and thread CPU times; ``failed``: some request of it got an error."""
        self._batches += 1
        if self._banned:
            return
        if on_loop and failed:
            self._ban("a batch failed on the event loop")
            return
        recent = self._recent
        recent.append(run_ns)
        if not self.handoff.enabled:
            if self._batches >= self._next_try and min(recent) < FAST_NS:
                recent.clear()
                self.handoff.enabled = True
        elif on_loop:
            if run_ns > BLOCK_LIMIT_NS and (
                cpu_ns > BLOCK_LIMIT_NS // 2 or run_ns > STALL_LIMIT_NS
            ):
                self._retreat(f"a batch held the event loop for {run_ns / 1e6:.1f} ms")
            elif len(recent) == WINDOW and min(recent) > SLOW_NS:
                self._retreat(f"its last {WINDOW} batches took over {SLOW_NS / 1e3:.0f} µs each")

    def _retreat(self, why: str) -> None:
        """Back to the instance threads, for twice as many batches as last time."""
        self.handoff.enabled = False
        self._recent.clear()
        self._retreats += 1
        wait = WARM_BATCHES << min(self._retreats, _MAX_BACKOFF)
        self._next_try = self._batches + wait
        log.info(
            "model %s: %s; its batches run on its instance threads for the next %d",
            self.name,
            why,
            wait,
        )

    def _run_offered(self) -> None:
        """On the loop: run every offered batch, let its instance go on, answer its requests."""
        settle = self._settle
        assert settle is not None
        for index, batch, done in self.handoff.take():
            instance = self._instances[index]
            if instance.runs_elsewhere:
                instance.run_later(batch, settle, done.complete)
                continue
            try:
                outcome = instance.run(batch, on_loop=True)
            except BaseException as exc:  # even SystemExit from a model must not stop the loop
                log.exception("model %s: a batch failed on the event loop", self.name)
                self._ban("a batch raised on the event loop")
                items = batch.items
                error = InternalError(f"model {self.name}: {exc!r}")
                outcome = (batch.seq, [item[1] for item in items], [error] * len(items))
            finally:
                done.complete()
            settle(*outcome)
