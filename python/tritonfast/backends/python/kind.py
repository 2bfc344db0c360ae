"""The ``python`` backend's hooks: import ``model.py`` per version, let the model complete its
configuration, and start each instance in a worker process (the default) or in-process (the
model's ``TRITONFAST_INSTANCE_MODE`` parameter, or ``--backend-config=python,instance-mode=``
for every model that names none; see :mod:`.process`). Versions whose workers the core can
drive take the core's request path (:mod:`tritonfast.runtime.lane`) unless
``--backend-config=python,core-path=off``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, InstancePlacement, ModelInstance
from tritonfast.backends.python import loader, workerbls
from tritonfast.backends.python.instance import PythonInstance
from tritonfast.backends.python.process import (
    DEFAULT_MODE,
    MODE_SETTING,
    MODES,
    ProcessInstance,
    instance_mode,
)
from tritonfast.backends.python.workerprocess import auto_complete_in_worker
from tritonfast.errors import InternalError, InvalidArgumentError
from tritonfast.runtime.handle import Handle
from tritonfast.runtime.lane import core_path_on, lane_eligible, lane_scheduler
from tritonfast.runtime.scheduler import Scheduler


class PythonBackend(Backend):
    name = "python"
    default_model_filename = loader.DEFAULT_MODEL_FILE

    def __init__(self, model_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        super().__init__(model_dir, settings)
        self._classes: dict[int, type] = {}  # each version's TritonPythonModel, imported once
        self._default_mode = self.settings.get(MODE_SETTING, DEFAULT_MODE)

    def model_class(self, config: model_config_pb2.ModelConfig, version: int) -> type:
        model_class = self._classes.get(version)
        if model_class is None:
            model_class = loader.load_model_class(self.model_file(config, version), config.name)
            self._classes[version] = model_class
        return model_class

    def auto_complete(self, config: model_config_pb2.ModelConfig, version: int) -> None:
        if self.mode(config) == "process":  # the model's code never runs in the server
            auto_complete_in_worker(self.model_file(config, version), config)
            return
        loader.auto_complete(self.model_class(config, version), config)

    def mode(self, config: model_config_pb2.ModelConfig) -> str:
        """The model's instance mode: its own parameter, else the server's default."""
        return instance_mode(config, self._default_mode)

    def validate(self, config: model_config_pb2.ModelConfig) -> None:
        if self._default_mode not in MODES:
            raise InvalidArgumentError(
                f"--backend-config=python,{MODE_SETTING} must be one of {', '.join(MODES)},"
                f" not '{self._default_mode}'"
            )
        self.mode(config)  # raises for an unknown mode
        core_path_on(self.name, self.settings)

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
        if core_path_on(self.name, self.settings) and lane_eligible(config, instances):
            scheduler = lane_scheduler(
                name,
                config,
                instances,
                loop,
                server,
                version,
                options,
                _trace_token,
                self.model_dir,
            )
            if scheduler is None:
                raise InternalError(f"model '{config.name}' needs the server it runs in")
            return scheduler
        return super().create_scheduler(
            name, config, instances, loop, server, version=version, **options
        )

    def runs_on_event_loop(self, config: model_config_pb2.ModelConfig) -> bool:
        # Process instances: the loop passes batches to their workers (none runs on it),
        # decoupled ones included; in-process decoupled models wait on their streams.
        mode = self.mode(config)
        return mode == "process" or (
            mode == "auto" and not config.model_transaction_policy.decoupled
        )

    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        where: dict[str, Any] = {
            "instance_name": placement.name,
            "repository_path": self.model_dir,
            "version": placement.version,
        }
        if self.mode(config) == "process":
            return ProcessInstance(self.model_file(config, placement.version), config, **where)
        model_class = self.model_class(config, placement.version)
        model_file = self.model_file(config, placement.version)
        return PythonInstance(
            model_class, config, device_id=placement.device_id, model_file=model_file, **where
        )


def _trace_token(trace: Any) -> int:
    """The token a worker's request carries for ``trace`` (see workerbls.trace_token)."""
    token = workerbls.trace_token(trace)
    return 0 if token is None else token.value
