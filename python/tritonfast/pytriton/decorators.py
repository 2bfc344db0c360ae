"""PyTriton's decorators (``pytriton.decorators``)."""

from tritonfast.callables.decorators import (
    ConstantPadder,
    TritonContext,
    batch,
    fill_optionals,
    first_value,
    get_inference_request_batch_size,
    get_model_config,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)

__all__ = [
    "ConstantPadder",
    "TritonContext",
    "batch",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "get_model_config",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
]
