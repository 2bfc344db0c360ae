"""The errors of the callable API, with PyTriton's class names and hierarchy (so that
``tritonfast.pytriton.exceptions`` is this module): a callable that raises
:class:`PyTritonUnrecoverableError` stops the server; any other exception fails its requests
with the exception's traceback as the message."""

from __future__ import annotations


class PyTritonError(Exception):
    """Base of the callable API's errors."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def __str__(self) -> str:
        return self._message

    @property
    def message(self) -> str:
        return self._message


class PyTritonValidationError(PyTritonError):
    """A configuration or request that does not validate."""


class PyTritonInvalidOperationError(PyTritonError):
    """An operation not allowed in the server's current state."""


class PyTritonBadParameterError(PyTritonError):
    """A parameter that cannot be used."""


class PyTritonModelConfigError(PyTritonError):
    """A model configuration that cannot be used."""


class PyTritonUnrecoverableError(PyTritonError):
    """Raised by a callable that cannot go on: the server stops."""


class PyTritonRuntimeError(PyTritonError):
    """Any other error the API detects."""
