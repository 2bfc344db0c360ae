"""How a bound callable describes its model: its tensors (:class:`Tensor`) and configuration
(:class:`ModelConfig`, :class:`DynamicBatcher`, :class:`QueuePolicy`), with PyTriton's names,
fields and defaults, and the Triton model configuration they become."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from tritonfast._proto import model_config_pb2 as mc
from tritonfast.data.datatypes import CONFIG_DATATYPES
from tritonfast.errors import InvalidArgumentError


class TimeoutAction(enum.Enum):
    REJECT = "REJECT"
    DELAY = "DELAY"


class DeviceKind(enum.Enum):
    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


@dataclasses.dataclass
class QueuePolicy:
    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclasses.dataclass
class DynamicBatcher:
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list[int] | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None


@dataclasses.dataclass
class ModelConfig:
    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A model input or output. ``shape`` leaves out the batch dimension of a batching model;
    -1 marks a dimension of any size. ``dtype`` is a numpy type; ``bytes``, ``np.bytes_`` and
    ``object`` mean BYTES tensors."""

    shape: tuple[int, ...]
    dtype: Any
    name: str | None = None
    optional: bool = False


def datatype_of(dtype: Any) -> int:
    """The config datatype of a numpy type (BYTES for bytes, np.bytes_, str and object)."""
    if dtype in (bytes, np.bytes_, object, np.object_, str, np.str_):
        return mc.TYPE_STRING
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(f"unsupported tensor dtype {dtype!r}") from None
    if resolved.kind in "SUO":
        return mc.TYPE_STRING
    wire = {"float16": "FP16", "float32": "FP32", "float64": "FP64"}.get(
        resolved.name, resolved.name.upper()
    )
    if wire not in CONFIG_DATATYPES:
        raise InvalidArgumentError(f"unsupported tensor dtype {dtype!r}")
    return CONFIG_DATATYPES[wire]


def _queue_policy(policy: QueuePolicy, target: Any) -> None:
    target.timeout_action = mc.ModelQueuePolicy.TimeoutAction.Value(policy.timeout_action.value)
    target.default_timeout_microseconds = policy.default_timeout_microseconds
    target.allow_timeout_override = policy.allow_timeout_override
    target.max_queue_size = policy.max_queue_size


def _tensors(listed: Sequence[Tensor], target: Any, kind: str, model: str) -> None:
    for index, tensor in enumerate(listed):
        if not tensor.name:
            raise InvalidArgumentError(f"model '{model}': {kind} {index} has no name")
        entry = target.add()
        entry.name = tensor.name
        entry.data_type = datatype_of(tensor.dtype)
        entry.dims.extend(int(d) for d in tensor.shape)
        if tensor.optional:
            if kind == "output":
                raise InvalidArgumentError(f"model '{model}': output '{tensor.name}' is optional")
            entry.optional = True


def model_config(
    name: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
    instances: int,
    backend: str,
) -> mc.ModelConfig:
    """The Triton model configuration of a bound callable."""
    result = mc.ModelConfig(name=name, backend=backend)
    if config.batching:
        result.max_batch_size = config.max_batch_size
        batcher = config.batcher
        if batcher is not None:
            batching = result.dynamic_batching
            batching.max_queue_delay_microseconds = batcher.max_queue_delay_microseconds
            batching.preferred_batch_size.extend(batcher.preferred_batch_size or [])
            batching.preserve_ordering = batcher.preserve_ordering
            batching.priority_levels = batcher.priority_levels
            batching.default_priority_level = batcher.default_priority_level
            if batcher.default_queue_policy is not None:
                _queue_policy(batcher.default_queue_policy, batching.default_queue_policy)
            for level, policy in (batcher.priority_queue_policy or {}).items():
                _queue_policy(policy, batching.priority_queue_policy[level])
    _tensors(inputs, result.input, "input", name)
    _tensors(outputs, result.output, "output", name)
    group = result.instance_group.add()
    group.count = instances
    group.kind = mc.ModelInstanceGroup.KIND_CPU
    if config.decoupled:
        result.model_transaction_policy.decoupled = True
    if config.response_cache:
        result.response_cache.enable = True
    return result
