"""PyTriton's client exception classes (``pytriton.client.exceptions``)."""

from __future__ import annotations


class PyTritonClientError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def __str__(self) -> str:
        return self._message

    @property
    def message(self) -> str:
        return self._message


class PyTritonClientValueError(PyTritonClientError):
    pass


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    pass


class PyTritonClientTimeoutError(PyTritonClientError):
    pass


class PyTritonClientModelUnavailableError(PyTritonClientError):
    pass


class PyTritonClientClosedError(PyTritonClientError):
    pass


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    pass


class PyTritonClientInferenceServerError(PyTritonClientError):
    pass


class PyTritonClientQueueFullError(PyTritonClientError):
    pass
