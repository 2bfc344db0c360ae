"""PyTriton's exception classes (``pytriton.exceptions``)."""

from tritonfast.callables.errors import (
    PyTritonBadParameterError,
    PyTritonError,
    PyTritonInvalidOperationError,
    PyTritonModelConfigError,
    PyTritonRuntimeError,
    PyTritonUnrecoverableError,
    PyTritonValidationError,
)

__all__ = [
    "PyTritonBadParameterError",
    "PyTritonError",
    "PyTritonInvalidOperationError",
    "PyTritonModelConfigError",
    "PyTritonRuntimeError",
    "PyTritonUnrecoverableError",
    "PyTritonValidationError",
]
