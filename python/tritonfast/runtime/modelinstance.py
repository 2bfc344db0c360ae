"""What the request path runs a batch on: a model instance (:class:`ModelInstance`, which a
backend implements) and the clock of one execution's phases (:class:`PhaseClock`).

Each instance runs one batch at a time: :meth:`ModelInstance.execute` on the instance's own
thread, or on the event loop for short batches of models that allow it
(:mod:`tritonfast.runtime.looprun`); an instance that :attr:`~ModelInstance.runs_elsewhere`
(a worker process) has its batches started on the event loop with
:meth:`ModelInstance.execute_later` instead. Backends create instances
(:mod:`tritonfast.backends.base`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from time import perf_counter_ns

from tritonfast.data.types import InferRequest
from tritonfast.runtime.responses import Result


class PhaseClock:
    """Where one execution's phases end, as Triton splits compute time: *input* (getting the
    batch's tensors to the model), *infer* (the model itself) and *output* (getting results
    back). A backend marks the first two; what it does not mark counts as infer."""

    __slots__ = ("infer_end", "input_end", "start")

    def __init__(self) -> None:
        self.start = perf_counter_ns()
        self.input_end = 0
        self.infer_end = 0

    def inputs_ready(self) -> None:
        self.input_end = perf_counter_ns()

    def infer_done(self) -> None:
        self.infer_end = perf_counter_ns()

    def marks(self, end: int) -> tuple[int, int, int, int]:
        """(start, input end, infer end, end) for an execution that ended at ``end``."""
        input_end = self.input_end or self.start
        return self.start, input_end, max(self.infer_end or end, input_end), end

    def split(self, end: int) -> tuple[int, int, int]:
        """(input, infer, output) nanoseconds for an execution that ended at ``end``."""
        start, input_end, infer_end, _ = self.marks(end)
        return input_end - start, infer_end - input_end, end - infer_end


class ModelInstance(abc.ABC):
    """One instance of a loaded model version.

    The response contract: a request yields zero or more responses and then a final flag.
    ``execute`` returns either one :data:`Result` per request, in request order (each is
    that request's only response, sent with the final flag: the single-response case, settled
    for the whole batch at once), or ``None``, when the responses go through each request's
    :attr:`~tritonfast.data.types.InferRequest.sender` (decoupled models, which may also
    send after ``execute`` returns, from any thread).
    """

    # Whether execute() may run on the event loop's thread (see runtime.looprun): it holds the
    # GIL throughout, never waits on the server, a stream or another thread, and needs no
    # thread of its own.
    may_run_on_event_loop = False

    # Whether the instance runs its batches outside the server process (a worker process):
    # then the event loop may start a batch with :meth:`execute_later` and finish it when the
    # worker answers, with no instance thread in between (see runtime.looprun).
    runs_elsewhere = False

    @abc.abstractmethod
    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        """Run one batch of requests (see the class docstring for what to return). Call
        ``clock.inputs_ready()`` and ``clock.infer_done()`` where those phases end."""

    def execute_later(
        self,
        requests: list[InferRequest],
        clock: PhaseClock,
        finish: Callable[[Sequence[Result] | None], None],
        release: Callable[[], None],
    ) -> None:
        """For instances that :attr:`runs_elsewhere`, called on the event loop: start one
        batch and return at once. Later, on the loop, call ``finish`` with one result per
        request (None: every response went through the requests' senders), then ``release``
        once the instance can take its next batch."""
        raise NotImplementedError

    def unloading(self) -> None:  # noqa: B027 - optional hook, empty by default
        """The model is being unloaded (called off the loop, before its running batches are
        waited for): responses held back for slow clients must stop holding up its requests."""

    def stop_by(self, deadline: float) -> None:  # noqa: B027 - optional hook, empty by default
        """The model stops (server exit or unload), and :meth:`finalize` comes next: what it
        waits for should be over by ``deadline`` (``time.monotonic()``), past which work still
        running may be abandoned."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release the instance's resources (called once, after its last execute)."""
