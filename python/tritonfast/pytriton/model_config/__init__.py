"""PyTriton's model description (``pytriton.model_config``)."""

from tritonfast.callables.spec import (
    DeviceKind,
    DynamicBatcher,
    ModelConfig,
    QueuePolicy,
    Tensor,
    TimeoutAction,
)

__all__ = ["DeviceKind", "DynamicBatcher", "ModelConfig", "QueuePolicy", "Tensor", "TimeoutAction"]
