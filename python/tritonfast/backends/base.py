"""What a backend implements: a kind of model (:class:`Backend`) and its instances
(:class:`ModelInstance`).

A backend registers under the ``backend`` and ``platform`` names a ``config.pbtxt`` uses
(:mod:`tritonfast.backends.registry`). The repository manager creates one :class:`Backend`
object per model load and calls its hooks in this order: :meth:`Backend.auto_complete` (unless
``--strict-model-config``), :meth:`Backend.validate` (after the server's own checks), then
:meth:`Backend.create_instance` for every instance of every served version. Each instance
runs one batch at a time: :meth:`ModelInstance.execute` on the instance's own thread, or on the
event loop for short batches of models that allow it (:mod:`tritonfast.runtime.looprun`); an
instance that :attr:`~ModelInstance.runs_elsewhere` (a worker process) has its batches started
on the event loop with :meth:`ModelInstance.execute_later` instead.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns
from typing import ClassVar

from tritonfast._proto import model_config_pb2
from tritonfast.runtime.responses import Result
from tritonfast.runtime.types import InferRequest

__all__ = ["Backend", "InstancePlacement", "ModelInstance", "PhaseClock", "Result"]


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
    :attr:`~tritonfast.runtime.types.InferRequest.sender` (decoupled models, which may also
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


@dataclass(frozen=True)
class InstancePlacement:
    """Which instance :meth:`Backend.create_instance` is asked for."""

    name: str  # "<group name>_<index>", as Triton names instances
    version: int
    kind: str = "CPU"  # the instance group's kind without the KIND_ prefix
    device_id: int = 0
    profiles: tuple[str, ...] = ()  # the instance group's optimization profiles (TensorRT)


class Backend(abc.ABC):
    """A kind of model. One object per model load, holding what its hooks share (a loaded
    module, a parsed model file)."""

    # The ``backend`` name config.pbtxt uses, and any ``platform`` names that mean this backend.
    name: ClassVar[str]
    platforms: ClassVar[tuple[str, ...]] = ()
    # The model file a version directory holds when the config names none; its presence
    # also tells which backend a config without ``backend`` or ``platform`` means.
    default_model_filename: ClassVar[str] = ""
    # Instances of a CPU instance group that gives no count (Triton's default per backend).
    default_cpu_instance_count: ClassVar[int] = 1
    # Whether the instances take inputs in CUDA shared memory as device memory (a
    # runtime.cudamemory.CudaWindow as an input's data) and write outputs into the request's
    # ``device_outputs`` themselves; other backends get host arrays.
    takes_device_memory: ClassVar[bool] = False

    def __init__(self, model_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        self.model_dir = model_dir
        # This backend's --backend-config settings (key -> value), global ones included.
        self.settings: Mapping[str, str] = settings or {}

    def model_file(self, config: model_config_pb2.ModelConfig, version: int) -> Path:
        """Where ``version``'s model file is."""
        filename = config.default_model_filename or self.default_model_filename
        return self.model_dir / str(version) / filename

    def auto_complete(  # noqa: B027 - optional hook
        self, config: model_config_pb2.ModelConfig, version: int
    ) -> None:
        """Fill in what the model itself can tell about its configuration (in place), from
        the newest served ``version``. Skipped with ``--strict-model-config``."""

    def validate(self, config: model_config_pb2.ModelConfig) -> None:  # noqa: B027
        """Refuse a configuration this backend cannot serve (raise a TritonError)."""

    def runs_on_event_loop(self, config: model_config_pb2.ModelConfig) -> bool:
        """Whether short executions of this model may move to the event loop (see
        runtime.looprun); each instance must also allow it."""
        return False

    @abc.abstractmethod
    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        """A new, initialized instance (raise a TritonError if it cannot start)."""
