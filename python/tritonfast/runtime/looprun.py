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
Chosen by the model's ``TRITONFAST_INSTANCE_MODE`` (``"auto"``, the default; ``"thread"``
keeps every batch on the instance threads).

**The only request in flight.** When a request is submitted while no other is in flight in the
whole server, the loop would go to sleep in ``epoll`` until the instance offers the request's
batch, and the instance thread would sleep until the batch deadline; each wake-up costs tens
of microseconds on the VMs we measure on (a lone request's queue-to-compute time with a 100 µs
``max_queue_delay``: 175 µs with both sleeps, 118 µs without; ``bench/README.md``). So the
loop waits for that batch instead, polling without the GIL
(:meth:`~tritonfast._core.Handoff.wait`), and runs it as soon as it is offered; the instance
polls for the batch deadline too instead of sleeping through it. The wait looks first whether
anything else became ready (it runs as a loop callback after whatever the loop already had to
do), and ends as soon as the loop's own ``epoll`` descriptor becomes readable (a new request,
another thread's callback), so it never keeps the loop from work: a request that arrives
meanwhile is still queued in time to join the batch. Only for models whose
``max_queue_delay`` is at most ``POLLED_DEADLINE_LIMIT_US`` (500 µs), on a machine that
lets the server use at least two cores, and only on loops whose ``epoll`` descriptor we can
watch (uvloop and asyncio's selector loop). A wait that times out (the instance did not get a
core in time) makes the next lone requests skip theirs, more after each timeout (up to 1024).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tritonfast._core import POLLED_DEADLINE_LIMIT_US, Handoff, RequestQueue
from tritonfast.backends.base import Result
from tritonfast.errors import InternalError
from tritonfast.runtime import gcpause

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

# How much longer than the model's queue delay the loop waits for a lone request's batch: time
# for the instance thread to wake up and form it.
ALONE_MARGIN_US = 100
# Most lone requests let pass without a wait after a wait that timed out.
ALONE_MAX_BACKOFF = 1024

# Settles one batch's futures on the loop: (batch seq, futures, results).
Settle = Callable[[int, list["asyncio.Future[Any]"], Sequence[Result]], None]


class InFlight:
    """Requests submitted to the models of one server and not yet answered."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class LoopExecution:
    """The handoff of one model version and the rule that switches it on and off."""

    def __init__(
        self,
        name: str,
        queue: RequestQueue,
        loop: asyncio.AbstractEventLoop,
        *,
        in_flight: InFlight,
        queue_delay_us: int,
    ) -> None:
        self.name = name
        self.handoff = Handoff(queue)
        self._loop = loop
        self._in_flight = in_flight
        self._watch_fd = _readiness_fd(loop)
        self._alone_wait_us = 0  # 0: never wait for a lone request's batch
        # (Polling needs a core for the loop and one for the instance that forms the batch.)
        if (
            self._watch_fd >= 0
            and queue_delay_us <= POLLED_DEADLINE_LIMIT_US
            and len(os.sched_getaffinity(0)) >= 2
        ):
            self._alone_wait_us = queue_delay_us + ALONE_MARGIN_US
        # Lone requests to let pass without waiting, after waits that timed out (see
        # _wait_alone), and how many the next timeout makes pass.
        self._alone_skips = 0
        self._alone_backoff = 0
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

    def expect_alone(self, future: asyncio.Future[Any]) -> None:
        """Called before queueing a request submitted while no other was in flight (its
        batch runs on the loop): after what the loop already has to do, wait for the batch of
        ``future``'s request and run it, if it is still the only request in flight."""
        if not self._alone_wait_us:
            return
        if self._alone_skips:
            self._alone_skips -= 1
            return
        self.handoff.expect_batch(True)  # before the push: the instance reads it then
        self._loop.call_soon(self._wait_alone, future)

    def _wait_alone(self, future: asyncio.Future[Any]) -> None:
        handoff = self.handoff
        try:
            if self._in_flight.count != 1 or future.done() or not handoff.enabled:
                return
            ended = handoff.wait(self._alone_wait_us, self._watch_fd)
            if ended == "offered":
                self._alone_backoff = 0
                self._run_offered()
            elif ended == "timed out":
                # The instance did not get to form the batch in time: the machine's cores are
                # busy (another process, the frontends' threads), and polling here takes one
                # of them. Let the next lone requests pass, more after every timeout.
                self._alone_backoff = min(max(1, 2 * self._alone_backoff), ALONE_MAX_BACKOFF)
                self._alone_skips = self._alone_backoff
        finally:
            handoff.expect_batch(False)

    def _run_offered(self) -> None:
        """On the loop: run every offered batch, let its instance go on, answer its requests."""
        settle = self._settle
        assert settle is not None
        for index, batch, done in self.handoff.take():
            try:
                outcome = self._instances[index].run(batch, on_loop=True)
            except BaseException as exc:  # even SystemExit from a model must not stop the loop
                log.exception("model %s: a batch failed on the event loop", self.name)
                self._ban("a batch raised on the event loop")
                items = batch.items
                error = InternalError(f"model {self.name}: {exc!r}")
                outcome = (batch.seq, [item[1] for item in items], [error] * len(items))
            finally:
                done.complete()
            settle(*outcome)


def _readiness_fd(loop: asyncio.AbstractEventLoop) -> int:
    """The ``epoll`` descriptor ``loop`` sleeps in (readable when it has work), or -1."""
    backend_id = getattr(loop, "_get_backend_id", None)  # uvloop
    if backend_id is not None:
        return int(backend_id())
    selector = getattr(loop, "_selector", None)  # asyncio's selector loops
    if selector is not None and hasattr(selector, "fileno"):
        return int(selector.fileno())
    return -1
