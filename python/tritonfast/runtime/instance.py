"""One :class:`InstanceLoop` per model instance: take a batch from its source, run it, hand
back results. Each has a thread of its own for that, started unless the event loop takes the
instance's batches itself: sequence models in worker processes whose batches are formed at
once are driven from the loop by :class:`~tritonfast.runtime.sequence.LoopDriver`, with no
instance thread.

Each instance takes work from its own source, a Rust :class:`~tritonfast._core.RequestQueue`
that its scheduler chose for it (all instances of a model may share one). The wait for a batch
happens inside the Rust core with the GIL released. Each batch's execution is reported to the
core's statistics with one call, and its results are handed to the scheduler's ``deliver``
(which moves them to the event loop in one ``call_soon_threadsafe``), not one call per request;
a batch whose responses go through the requests' senders delivers none.

With a :class:`~tritonfast._core.Handoff` (see :mod:`.looprun`) the thread still forms its
batches in the core, but while the handoff is on it offers each one to the event loop, which
runs it with :meth:`InstanceLoop.run`, and waits (GIL released) until the loop is done.
An instance that runs elsewhere (a worker process) gets every batch the thread takes itself
(from a source no handoff serves, such as the sequence batcher, or once the handoff closed
for shutdown) through the loop all the same: the thread passes it to the loop, which starts it
in the worker and settles it when the worker answers (:meth:`InstanceLoop.run_later`), and
waits until then. So the worker's answer wakes the loop alone, and only the loop ever talks
to the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any, Protocol

from tritonfast._core import Batch, Handoff, RequestQueue
from tritonfast.data.types import RELEASE_RESCHEDULE, InferRequest, PhaseTimes
from tritonfast.errors import InternalError, TritonError
from tritonfast.runtime import gcpause
from tritonfast.runtime.modelinstance import ModelInstance, PhaseClock
from tritonfast.runtime.responses import Result, Sink

if TYPE_CHECKING:  # (the handle finds the running instance: a name for annotations)
    from tritonfast.runtime.handle import Handle

log = logging.getLogger(__name__)

# How long one wait for work may block before the loop re-checks for shutdown.
_POLL_US = 500_000

# A queued item: the request and where its responses go.
QueueItem = tuple[InferRequest, Sink]
# Called with (batch seq, sinks, results): one result per sink (None for a request answered
# through its sender), or None when every request of the batch is.
Deliver = Callable[[int, list[Sink], Sequence[Result | None] | None], None]
# Called on the instance thread with the sinks of requests rejected by a queue timeout.
# Answers a batch's rejected requests (a batch with no items).
Reject = Callable[[Batch], None]
# Told how long each batch took to run (wall clock and this thread's CPU time, nanoseconds),
# whether it ran on the event loop, and whether some request of it failed.
Observe = Callable[[int, int, bool, bool], None]
# Settles one batch on the event loop: (batch seq, sinks, results), as Deliver.
Settle = Deliver


# The instance whose batch the current code runs for. A context variable rather than a
# thread's, so that it follows the batch's work where it goes: into an ``async def execute``
# on its model's own loop, into the server-loop task of a call the batch makes (and an
# ensemble's steps in turn), and onto the threads that serve a worker's calls
# (:func:`calls_made_by`).
_running: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "running_instance", default=None
)


class Caller(Protocol):
    """An instance as a call its model makes to the server sees it: an :class:`InstanceLoop`,
    or an instance the core drives (``runtime.lane.LaneCaller``)."""

    name: str
    server: Handle | None

    def calls_server(self) -> None: ...
    def calling_server(self) -> contextlib.AbstractContextManager[None]: ...


def running_instance() -> Caller | None:
    """The instance whose batch the current code runs for, if any."""
    return _running.get()


@contextlib.contextmanager
def calls_made_by(instance: Caller | None) -> Iterator[None]:
    """Code in this block runs for ``instance``'s batch (see :func:`running_instance`): how
    the threads serving a worker process's calls to the server say whose calls they are."""
    token = _running.set(instance)
    try:
        yield
    finally:
        _running.reset(token)


class InstanceLoop:
    def __init__(
        self,
        name: str,
        source: RequestQueue,
        instance: ModelInstance,
        deliver: Deliver,
        reject: Reject,
        *,
        handoff: tuple[Handoff, int] | None = None,
        observe: Observe | None = None,
        on_server_call: Callable[[], None] | None = None,
        through_loop: tuple[asyncio.AbstractEventLoop, Settle] | None = None,
        server: Handle | None = None,
    ) -> None:
        self.name = name
        # The server whose models its model's code reaches (runtime.handle.current).
        self.server = server
        self._queue = source
        self._instance = instance
        self._deliver = deliver
        self._reject = reject
        # (the model's handoff, this instance's index in it)
        self._handoff = handoff
        self._observe = observe
        self._on_server_call = on_server_call
        # (the event loop, how it settles a batch): while the instance runs elsewhere, each
        # batch is started and settled on the loop (see the module docstring).
        self._through_loop = through_loop
        # The calls to the server (BLS) its model has in flight, one token each.
        self._server_calls: set[object] = set()
        # The batch it runs now: (seq, sinks); and, once its model's time to stop is over,
        # the error every request it still has is answered with (see abandon).
        self._current: tuple[int, list[Sink]] | None = None
        self._abandoned: TritonError | None = None
        self._thread = threading.Thread(target=self._run, name=f"instance:{name}", daemon=True)

    @property
    def runs_elsewhere(self) -> bool:
        """Whether its instance runs batches outside this process (see :meth:`run_later`)."""
        return self._instance.runs_elsewhere

    def calls_server(self) -> None:
        """Told when the model, in one of its batches, waits on the server (see runtime.handle):
        its batches must never run on the event loop."""
        if self._on_server_call is not None:
            self._on_server_call()

    @contextlib.contextmanager
    def calling_server(self) -> Iterator[None]:
        """Around a call the model makes to the server, from the moment it is made (before it
        is checked and queued) until its last response is taken: see
        :attr:`waiting_on_server`."""
        token = object()
        self._server_calls.add(token)
        try:
            yield
        finally:
            self._server_calls.discard(token)

    @property
    def waiting_on_server(self) -> bool:
        """Whether a batch of this instance runs and its model has a call to the server in
        flight: the instance may be blocked on that call, and take nothing else until it ends.
        (A call from a model's own thread after its batch ended, as decoupled models make, holds
        no instance.)"""
        return self._current is not None and bool(self._server_calls)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to finish its last batch; True if it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def unloading(self) -> None:
        self._instance.unloading()

    def abandon(self, error: TritonError) -> None:
        """The model's time to stop is over (see ``Scheduler.stop``): the requests of the batch
        it runs now are answered with ``error`` at once (what the model answers them later is
        dropped), and so is every batch it gets from now on, without running it."""
        self._abandoned = error
        running = self._current
        if running is not None:
            seq, sinks = running
            self._deliver(seq, sinks, [error] * len(sinks))

    def _refuse(self, batch: Batch, error: TritonError) -> tuple[int, list[Sink], list[Result]]:
        """A batch that comes once the instance was abandoned: failed, not run."""
        results: list[Result] = [error] * len(batch.items)
        batch.report(results, 0, 0, 0)
        return batch.seq, [item[1] for item in batch.items], results

    def finalize(self, deadline: float) -> None:
        """Finalize the instance, whose running work should be over by ``deadline``
        (``time.monotonic()``)."""
        try:
            self._instance.stop_by(deadline)
            self._instance.finalize()
        except TritonError as exc:  # the model's own error: one line, as Triton logs it
            log.error("finalize failed for instance %s: %s", self.name, exc.message)
        except Exception:  # a model's finalize must not stop the others' shutdown
            log.exception("finalize failed for instance %s", self.name)

    def _run(self) -> None:
        if self._handoff is None:
            pop = self._queue.pop
        else:
            handoff, index = self._handoff
            queue = self._queue

            def pop(timeout_us: int) -> Batch | None:
                return queue.pop_or_hand_off(timeout_us, handoff, index)

        through_loop = self._through_loop
        while True:
            batch = pop(_POLL_US)
            if batch is None:  # closed and drained
                return
            if batch.items and through_loop is not None and self._instance.runs_elsewhere:
                loop, settle = through_loop
                released = threading.Event()
                try:
                    loop.call_soon_threadsafe(self.run_later, batch, settle, released.set)
                except RuntimeError:  # the loop is closed: the server is going away
                    return
                while not released.wait(_POLL_US / 1e6):
                    if loop.is_closed():  # it can no longer run the batch
                        return
            elif batch.items:
                self._deliver(*self.run(batch, on_loop=False))
            else:  # a batch never comes with rejections; both are empty on a timeout
                if batch.rejected:
                    self._reject(batch)

    def run(
        self, batch: Batch, *, on_loop: bool
    ) -> tuple[int, list[Sink], Sequence[Result | None] | None]:
        """Run one batch and record it: (batch seq, sinks, one result per sink or None)."""
        if self._abandoned is not None:
            return self._refuse(batch, self._abandoned)
        items: list[QueueItem] = batch.items
        sinks = [item[1] for item in items]
        observe = self._observe
        cpu_start = gc_start = 0
        if observe is not None:
            cpu_start, gc_start = thread_time_ns(), gcpause.total_ns()
        clock = PhaseClock()
        requests = [item[0] for item in items]
        self._current = (batch.seq, sinks)
        token = _running.set(self)  # (not calls_made_by: this is every batch's path)
        try:
            results = self._run_backend(requests, clock)
        finally:
            _running.reset(token)
            self._current = None
        end = self._record(batch, requests, clock, results)
        if observe is not None:
            failed = results is not None and any(isinstance(r, TritonError) for r in results)
            collecting = gcpause.total_ns() - gc_start  # not the model's doing
            run_ns = end - clock.start - collecting
            cpu_ns = max(0, thread_time_ns() - cpu_start - collecting)
            observe(run_ns, cpu_ns, on_loop, failed)
        return batch.seq, sinks, results

    def run_later(
        self,
        batch: Batch,
        settle: Callable[[int, list[Sink], Sequence[Result | None] | None], None],
        release: Callable[[], None],
    ) -> None:
        """On the event loop, for an instance that runs elsewhere: start one batch; when its
        results come, record and ``settle`` them, and ``release`` the instance for its next."""
        if self._abandoned is not None:
            settle(*self._refuse(batch, self._abandoned))
            release()
            return
        items: list[QueueItem] = batch.items
        requests = [item[0] for item in items]
        sinks = [item[1] for item in items]
        clock = PhaseClock()
        self._current = (batch.seq, sinks)

        def finish(results: Sequence[Result] | None) -> None:
            self._current = None
            settled = _refuse_reschedules(self.name, requests, results)
            self._record(batch, requests, clock, settled)
            settle(batch.seq, sinks, settled)

        token = _running.set(self)  # what the worker asks of the server is asked for it
        try:
            self._instance.execute_later(requests, clock, finish, release)
        except Exception as exc:  # a backend bug fails this batch, not the server
            log.exception("instance %s failed to start a batch", self.name)
            finish([InternalError(f"instance {self.name}: {exc}")] * len(requests))
            release()
        finally:
            _running.reset(token)

    def _record(
        self,
        batch: Batch,
        requests: list[InferRequest],
        clock: PhaseClock,
        results: Sequence[Result | None] | None,
    ) -> int:
        """Report a finished batch to the statistics and its traces; returns its end time."""
        end = perf_counter_ns()
        for request in requests:
            if request.trace is not None:
                _stamp_compute(request.trace, clock, end)
            if request.phases is not None:
                _count_phases(request.phases, clock, end)
        try:
            # Responses sent through senders are the model's affair: the execution succeeded.
            batch.report([None] * len(requests) if results is None else results, *clock.split(end))
        except Exception:  # statistics must never cost a response
            log.exception("instance %s could not record a batch's statistics", self.name)
        return end

    def _run_backend(
        self, requests: list[InferRequest], clock: PhaseClock
    ) -> Sequence[Result | None] | None:
        """The backend's results for one batch (None: they go through the requests' senders),
        or the error for every request."""
        try:
            results = self._instance.execute(requests, clock)
        except TritonError as exc:
            return [exc] * len(requests)
        except Exception as exc:  # a backend bug fails this batch, not the server
            log.exception("instance %s failed to execute a batch", self.name)
            return [backend_failed(self.name, exc)] * len(requests)
        if results is None:
            _refuse_reschedules(self.name, requests, None)
            if all(request.sender is not None for request in requests):
                return None
            # A request that got no sender can get no response but this error.
            return [
                None
                if request.sender is not None
                else InternalError(
                    f"model instance '{self.name}' returned no response for request"
                    f" '{request.id}' and did not use its response sender"
                )
                for request in requests
            ]
        if len(results) != len(requests):
            return [miscounted(self.name, len(results), len(requests))] * len(requests)
        return _refuse_reschedules(self.name, requests, results)


def backend_failed(instance_name: str, exc: Exception) -> InternalError:
    """What every request of a batch gets when the backend's ``execute`` raised something
    other than a TritonError (a bug of its own)."""
    return InternalError(f"instance {instance_name}: {exc}")


def miscounted(instance_name: str, got: int, wanted: int) -> InternalError:
    """What every request of a batch gets when ``execute`` returned the wrong number of
    results."""
    return InternalError(f"instance {instance_name} returned {got} responses for {wanted} requests")


_COMPUTE_STAMPS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _stamp_compute(trace: Any, clock: PhaseClock, end: int) -> None:
    """A traced request's compute timestamps: its batch's phase boundaries."""
    for name, ns in zip(_COMPUTE_STAMPS, clock.marks(end), strict=True):
        trace.stamp(name, ns)


def _count_phases(phases: PhaseTimes, clock: PhaseClock, end: int) -> None:
    """A request's queue time (until its batch started) and its batch's compute phases."""
    if phases.enqueued:
        phases.queue += max(0, clock.start - phases.enqueued)
    compute_input, compute_infer, compute_output = clock.split(end)
    phases.compute_input += compute_input
    phases.compute_infer += compute_infer
    phases.compute_output += compute_output


def _refuse_reschedules(
    instance: str, requests: list[InferRequest], results: Sequence[Result | None] | None
) -> Sequence[Result | None] | None:
    """Requests the model rescheduled though its model is no iterative sequence model (whose
    scheduler takes them back before this): each ends with an error, as in Triton."""
    if not any(request.release_flags & RELEASE_RESCHEDULE for request in requests):
        return results
    out = None if results is None else list(results)
    for index, request in enumerate(requests):
        if not request.release_flags & RELEASE_RESCHEDULE:
            continue
        error = InternalError(
            f"Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model"
            f" instance '{instance}' does not support rescheduling: it takes"
            " sequence_batching { iterative_sequence: true }"
        )
        if out is not None:
            out[index] = error
        elif request.sender is not None:
            request.sender.abandon(error)
    return out
