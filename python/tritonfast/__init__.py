"""tritonfast: a Triton-compatible inference server with a Rust core.

The names below are the API for serving Python callables from a program
(docs/callables.md); they are imported on first use, so that ``python -m tritonfast serve``
does not pay for them.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("tritonfast")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+local"

_API = {
    "Server": "tritonfast.inprocess",
    "ModelConfig": "tritonfast.callables.spec",
    "Tensor": "tritonfast.callables.spec",
    "DynamicBatcher": "tritonfast.callables.spec",
    "QueuePolicy": "tritonfast.callables.spec",
    "TimeoutAction": "tritonfast.callables.spec",
    "Request": "tritonfast.callables.request",
    "batch": "tritonfast.callables.decorators",
    "sample": "tritonfast.callables.decorators",
    "group_by_keys": "tritonfast.callables.decorators",
    "group_by_values": "tritonfast.callables.decorators",
    "first_value": "tritonfast.callables.decorators",
    "fill_optionals": "tritonfast.callables.decorators",
    "pad_batch": "tritonfast.callables.decorators",
    "triton_context": "tritonfast.callables.decorators",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'tritonfast' has no attribute {name!r}")
    return getattr(import_module(module), name)
