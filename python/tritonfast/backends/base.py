"""What every backend implements: one object per model instance."""

from __future__ import annotations

import abc
from time import perf_counter_ns

from tritonfast.errors import TritonError
from tritonfast.runtime.types import InferRequest, InferResponse

# One result per request, in request order: a response, or the error for that request.
Result = InferResponse | TritonError


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


class Backend(abc.ABC):
    """A model instance. ``execute`` runs on the instance's own thread, or, for a backend that
    allows it and whose executions are short, on the event loop (see runtime.looprun); one
    batch at a time either way."""

    # Whether execute() may run on the event loop's thread: it holds the GIL throughout (no
    # waiting on other threads or processes) and needs no thread of its own.
    may_run_on_event_loop = False

    @abc.abstractmethod
    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        """Run one batch of requests; return exactly one result per request. Call
        ``clock.inputs_ready()`` and ``clock.infer_done()`` where those phases end."""

    def finalize(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release the instance's resources (called once, after its last execute)."""
