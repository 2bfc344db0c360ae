"""An ``onnxruntime.InferenceSession`` made from a model configuration, with the settings
Triton's ONNX Runtime backend takes from it: thread counts and execution mode (``parameters``),
the graph optimization level (``optimization { graph { level } }``) and the execution providers
(the instance group's kind and ``optimization { execution_accelerators }``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tritonfast._proto import model_config_pb2
from tritonfast.errors import InvalidArgumentError, UnavailableError

log = logging.getLogger(__name__)

INSTALL_HINT = "install it with: pip install onnxruntime"


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module; UNAVAILABLE with how to install it when it is missing."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise UnavailableError(
            f"the onnxruntime backend needs the 'onnxruntime' package ({exc}); {INSTALL_HINT}"
        ) from None
    return onnxruntime


def _parameter(config: model_config_pb2.ModelConfig, key: str) -> str | None:
    if key in config.parameters:
        return config.parameters[key].string_value
    return None


def _int_parameter(config: model_config_pb2.ModelConfig, key: str) -> int | None:
    text = _parameter(config, key)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(
            f"model '{config.name}': parameter '{key}' must be an integer, not '{text}'"
        ) from None


def _bool_parameter(config: model_config_pb2.ModelConfig, key: str) -> bool | None:
    text = _parameter(config, key)
    if text is None:
        return None
    if text.lower() in ("true", "1"):
        return True
    if text.lower() in ("false", "0"):
        return False
    raise InvalidArgumentError(
        f"model '{config.name}': parameter '{key}' must be true or false, not '{text}'"
    )


def graph_optimization_level(ort: Any, config: model_config_pb2.ModelConfig) -> Any:
    """``optimization { graph { level } }`` as Triton's backend reads it: -1 basic, 1
    extended, 2 none, anything else (0, or no setting) all optimizations."""
    levels = ort.GraphOptimizationLevel
    level = config.optimization.graph.level if config.optimization.HasField("graph") else 0
    if level == -1:
        return levels.ORT_ENABLE_BASIC
    if level == 1:
        return levels.ORT_ENABLE_EXTENDED
    if level == 2:
        return levels.ORT_DISABLE_ALL
    return levels.ORT_ENABLE_ALL


def session_options(ort: Any, config: model_config_pb2.ModelConfig, verbose: bool = False) -> Any:
    options = ort.SessionOptions()
    # ORT's own warnings (e.g. an initializer listed as a graph input) only with verbose logs.
    options.log_severity_level = 1 if verbose else 3
    options.graph_optimization_level = graph_optimization_level(ort, config)
    intra = _int_parameter(config, "intra_op_thread_count")
    if intra is not None and intra > 0:
        options.intra_op_num_threads = intra
    inter = _int_parameter(config, "inter_op_thread_count")
    if inter is not None and inter > 0:
        options.inter_op_num_threads = inter
    mode = _int_parameter(config, "execution_mode")
    if mode is not None:
        if mode not in (0, 1):
            raise InvalidArgumentError(
                f"model '{config.name}': parameter 'execution_mode' must be 0 (sequential) or"
                f" 1 (parallel), not {mode}"
            )
        options.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
        )
    arena = _bool_parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    pattern = _bool_parameter(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = pattern
    return options


def providers(
    ort: Any, config: model_config_pb2.ModelConfig, kind: str, device_id: int
) -> list[Any]:
    """The execution providers for an instance of ``kind`` ("CPU" or "GPU"): the CPU one
    alone for CPU instances; for GPU instances the accelerators the config names (TensorRT),
    then CUDA, then CPU, each only if this onnxruntime build has it. UNAVAILABLE when a GPU
    instance is asked for and the build has no CUDA provider."""
    available = set(ort.get_available_providers())
    accelerators = config.optimization.execution_accelerators
    for accelerator in accelerators.cpu_execution_accelerator:
        log.warning(
            "model '%s': CPU execution accelerator '%s' is not supported by tritonfast;"
            " running on the default CPU provider",
            config.name,
            accelerator.name,
        )
    if kind != "GPU":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise UnavailableError(
            f"model '{config.name}': instance group kind KIND_GPU needs onnxruntime with the"
            f" CUDA execution provider (this onnxruntime has {sorted(available)}); install"
            " onnxruntime-gpu, or use KIND_CPU"
        )
    chosen: list[Any] = []
    for accelerator in accelerators.gpu_execution_accelerator:
        if accelerator.name == "tensorrt":
            if "TensorrtExecutionProvider" not in available:
                raise UnavailableError(
                    f"model '{config.name}': the 'tensorrt' execution accelerator needs"
                    " onnxruntime-gpu with the TensorRT execution provider"
                )
            options = {"device_id": device_id, **dict(accelerator.parameters)}
            chosen.append(("TensorrtExecutionProvider", options))
        elif accelerator.name != "cuda":
            raise InvalidArgumentError(
                f"model '{config.name}': unknown GPU execution accelerator '{accelerator.name}'"
            )
    chosen.append(("CUDAExecutionProvider", {"device_id": device_id}))
    chosen.append("CPUExecutionProvider")
    return chosen


def open_session(
    ort: Any,
    model_file: Path,
    config: model_config_pb2.ModelConfig,
    kind: str = "CPU",
    device_id: int = 0,
    verbose: bool = False,
) -> Any:
    """A session over ``model_file`` (by path, so that external-data files next to it load);
    UNAVAILABLE with ORT's reason when the file is missing or not a model ORT can run."""
    if not model_file.exists():
        raise UnavailableError(f"unable to find '{model_file}' for model '{config.name}'")
    path = model_file / "model.onnx" if model_file.is_dir() else model_file
    options = session_options(ort, config, verbose)
    try:
        return ort.InferenceSession(
            str(path), sess_options=options, providers=providers(ort, config, kind, device_id)
        )
    except (InvalidArgumentError, UnavailableError):
        raise
    except Exception as exc:  # ORT's load failures: a bad file, unsupported ops, ...
        raise UnavailableError(
            f"model '{config.name}': onnxruntime cannot load '{path}': {exc}"
        ) from None
