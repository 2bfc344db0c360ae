"""The ``tensorrt`` backend's hooks: engines deserialized with the ``tensorrt`` Python API on
each instance's GPU, the configuration completed and checked against the engine, an execution
context and a CUDA stream per instance (docs/tensorrt.md)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, InstancePlacement, ModelInstance
from tritonfast.backends.tensorrt import modelconfig
from tritonfast.backends.tensorrt.device import Stream, runtime_or_unavailable
from tritonfast.backends.tensorrt.engineio import EngineIO, describe
from tritonfast.backends.tensorrt.instance import TensorRTInstance
from tritonfast.errors import InternalError, InvalidArgumentError, UnavailableError
from tritonfast.memory.cudamemory import cuda_check

log = logging.getLogger(__name__)

INSTALL_HINT = "install it with: pip install 'tensorrt>=10,<11' 'cuda-python>=12,<13'"
_KIND = model_config_pb2.ModelInstanceGroup


def import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError as exc:
        raise UnavailableError(
            f"the tensorrt backend needs the 'tensorrt' package ({exc}); {INSTALL_HINT}"
        ) from None
    return tensorrt


class TensorRTBackend(Backend):
    name = "tensorrt"
    platforms = ("tensorrt_plan",)
    default_model_filename = "model.plan"
    takes_device_memory = True

    def __init__(self, model_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        super().__init__(model_dir, settings)
        self._lock = threading.Lock()  # TensorRT's runtime: one deserialization at a time
        self._runtimes: dict[int, Any] = {}

    def validate(self, config: model_config_pb2.ModelConfig) -> None:
        """GPU instances only, as in Triton (KIND_AUTO means GPU here)."""
        for group in config.instance_group:
            if group.kind == _KIND.KIND_AUTO:
                group.kind = _KIND.KIND_GPU
            if group.kind != _KIND.KIND_GPU:
                raise InvalidArgumentError(
                    f"unable to load model '{config.name}', TensorRT backend supports only GPU"
                    " device"
                )
        if not config.instance_group:
            config.instance_group.add().kind = _KIND.KIND_GPU

    def auto_complete(self, config: model_config_pb2.ModelConfig, version: int) -> None:
        if not config.instance_group:
            config.instance_group.add().kind = _KIND.KIND_GPU
        for group in config.instance_group:
            if group.kind == _KIND.KIND_AUTO:
                group.kind = _KIND.KIND_GPU
        if config.instance_group[0].kind != _KIND.KIND_GPU:
            return
        device = config.instance_group[0].gpus[0] if config.instance_group[0].gpus else 0
        path = self.model_file(config, version)
        try:
            engine = self._deserialize(config, path, device)
        except UnavailableError:
            raise
        except InternalError:
            raise InternalError(
                f"unable to load plan file to auto complete config: {path}"
            ) from None
        modelconfig.auto_complete(config, describe(engine))

    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        path = self.model_file(config, placement.version)
        if not path.is_file():
            raise UnavailableError(f"unable to find '{path}' for model instance '{placement.name}'")
        engine = self._deserialize(config, path, placement.device_id)
        io: EngineIO = describe(engine)
        modelconfig.check(config, io, placement.name)
        runtime = runtime_or_unavailable(config.name)
        stream = Stream(runtime, placement.device_id)
        profiles = [int(p) for p in placement.profiles]
        return TensorRTInstance(engine, io, config, placement.name, stream, profiles)

    def _deserialize(self, config: model_config_pb2.ModelConfig, path: Path, device: int) -> Any:
        """The engine in ``path`` on GPU ``device``; each instance deserializes its own
        (Triton shares one between the instances of a device when no dimension is dynamic)."""
        trt = import_tensorrt()
        cuda = runtime_or_unavailable(config.name)
        with self._lock:
            try:
                cuda_check(cuda, cuda.cudaSetDevice(device), "cudaSetDevice")
            except InternalError as error:
                raise InvalidArgumentError(
                    f"model '{config.name}': GPU {device} cannot be used: {error.message}"
                ) from None
            runtime = self._runtimes.get(device)
            if runtime is None:
                runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
                self._runtimes[device] = runtime
            engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise InternalError(
                f"unable to create TensorRT engine: '{path}' is not a plan this TensorRT can load"
            )
        return engine
