"""Ensembles (``platform: "ensemble"``): models made of other models' steps.

An ensemble has no model file and no instances of its own: its requests are run by its own
scheduler (:mod:`.scheduler`), which sends each step to its model. This backend checks the
graph at load (:mod:`.plan`).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, InstancePlacement, ModelInstance
from tritonfast.backends.ensemble.plan import plan_of
from tritonfast.backends.ensemble.scheduler import EnsembleScheduler
from tritonfast.config.load import PollError
from tritonfast.errors import InternalError, TritonError
from tritonfast.runtime.handle import Handle
from tritonfast.runtime.scheduler import Scheduler


class EnsembleBackend(Backend):
    name: ClassVar[str] = "ensemble"
    platforms: ClassVar[tuple[str, ...]] = ("ensemble",)

    def validate(self, config: model_config_pb2.ModelConfig) -> None:
        # The ensemble's own structure: Triton refuses it while polling the repository.
        try:
            plan_of(config)
        except TritonError as exc:
            raise PollError(exc.message) from exc

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
        if server is None:
            raise InternalError(f"ensemble '{config.name}' needs the server it runs in")
        return EnsembleScheduler(config, loop, server, str(version) if version else "")

    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        raise InternalError(f"ensemble '{config.name}' has no instances of its own")
