"""The ``onnxruntime`` backend's hooks: complete the configuration from the model, check it
against the model, and give each instance a session of its own. A version's requests take
the core's path (:mod:`tritonfast.backends.inprocesslane`: decoded and batched in the core,
each batch handed to a session by a call) when the scheduler its config asks for allows,
unless ``--backend-config=onnxruntime,core-path=off``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, InstancePlacement, ModelInstance
from tritonfast.backends.inprocesslane import driven
from tritonfast.backends.onnxruntime import modelio
from tritonfast.backends.onnxruntime.instance import OnnxInstance
from tritonfast.backends.onnxruntime.session import import_onnxruntime, open_session
from tritonfast.errors import InvalidArgumentError
from tritonfast.runtime.handle import Handle
from tritonfast.runtime.lane import core_path_on, lane_eligible, lane_scheduler
from tritonfast.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    platforms = ("onnxruntime_onnx",)
    default_model_filename = "model.onnx"
    # Triton starts two instances of a CPU instance group with no count for this backend.
    default_cpu_instance_count = 2

    def __init__(self, model_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        super().__init__(model_dir, settings)
        self._ort = import_onnxruntime()

    def _default_max_batch_size(self) -> int:
        text = self.settings.get("default-max-batch-size")
        if text is None:
            return modelio.DEFAULT_MAX_BATCH_SIZE
        try:
            return int(text)
        except ValueError:
            raise InvalidArgumentError(f"failed to convert '{text}' to integral number") from None

    def auto_complete(self, config: model_config_pb2.ModelConfig, version: int) -> None:
        if not modelio.wants_completion(config):
            return
        kind = "GPU" if _wants_gpu(config) else "CPU"
        session = open_session(
            self._ort, self.model_file(config, version), config, kind, verbose=_verbose()
        )
        modelio.auto_complete(config, modelio.model_io(session), self._default_max_batch_size())

    def validate(self, config: model_config_pb2.ModelConfig) -> None:
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
        # The core takes the version's requests and hands each batch to a session by a
        # call (backends/inprocesslane.py), unless core-path=off or the config needs more.
        if core_path_on(self.name, self.settings):
            lane_instances = driven(instances, config.name, name)
            if lane_eligible(config, lane_instances):
                scheduler = lane_scheduler(
                    name,
                    config,
                    lane_instances,
                    loop,
                    server,
                    version,
                    options,
                    model_dir=self.model_dir,
                )
                if scheduler is not None:
                    return scheduler
        return super().create_scheduler(
            name, config, instances, loop, server, version=version, **options
        )

    def runs_on_event_loop(self, config: model_config_pb2.ModelConfig) -> bool:
        # session.run releases the GIL: on an instance thread it overlaps with the event
        # loop's own work, where on the loop it would stop it (measured: bench/README.md).
        return False

    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        session = open_session(
            self._ort,
            self.model_file(config, placement.version),
            config,
            placement.kind,
            placement.device_id,
            verbose=_verbose(),
        )
        modelio.check(config, modelio.model_io(session))
        return OnnxInstance(session, config, placement.name)


def _wants_gpu(config: model_config_pb2.ModelConfig) -> bool:
    return any(
        group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        for group in config.instance_group
    )


def _verbose() -> bool:
    return logging.getLogger("tritonfast").isEnabledFor(logging.DEBUG)
