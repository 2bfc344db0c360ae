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
import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tritonfast._proto import model_config_pb2
from tritonfast.runtime.handle import Handle
from tritonfast.runtime.modelinstance import ModelInstance, PhaseClock
from tritonfast.runtime.responses import Result
from tritonfast.runtime.scheduler import Scheduler, create_scheduler

__all__ = ["Backend", "InstancePlacement", "ModelInstance", "PhaseClock", "Result"]


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
    # memory.cudamemory.CudaWindow as an input's data) and write outputs into the request's
    # ``device_outputs`` themselves; other backends get host arrays.
    takes_device_memory: ClassVar[bool] = False

    def __init__(self, model_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        self.model_dir = model_dir
        # This backend's --backend-config settings (key -> value), global ones included.
        self.settings: Mapping[str, str] = settings or {}
        # Objects the program that runs the server bound for its models, by a key their
        # configs name (an in-process Server's callables): set by the repository, per server.
        self.bound: Mapping[str, object] = {}

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

    def create_scheduler(
        self,
        name: str,
        config: model_config_pb2.ModelConfig,
        instances: list[ModelInstance],
        loop: asyncio.AbstractEventLoop,
        server: Handle | None = None,
        *,
        version: int = 0,
        **options: bool,
    ) -> Scheduler:
        """The scheduler that takes a version's requests to its ``instances``: the one the
        config asks for (``runtime.scheduler.create_scheduler``) unless the backend runs its
        requests its own way (ensembles). ``server``: the server the model belongs to;
        ``version``: the version served; ``options``: the scheduler's keyword arguments."""
        return create_scheduler(
            name, config, instances, loop, model_dir=self.model_dir, server=server, **options
        )

    @abc.abstractmethod
    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        """A new, initialized instance (raise a TritonError if it cannot start)."""
