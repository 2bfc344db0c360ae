"""Errors with Triton's status codes.

Every layer raises :class:`TritonError` (or a subclass) carrying one neutral
:class:`Code`; each frontend maps the code to its wire status with one table
(``frontends/http/codec.py`` and ``frontends/grpc/codec.py``).
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Triton's server error codes (TRITONSERVER_Error_Code)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"


# How Triton names the codes in a status it writes out (Status::CodeString), e.g. a version's
# load failure "Internal: <message>".
CODE_NAMES = {
    Code.UNKNOWN: "Unknown",
    Code.INTERNAL: "Internal",
    Code.NOT_FOUND: "Not found",
    Code.INVALID_ARG: "Invalid argument",
    Code.UNAVAILABLE: "Unavailable",
    Code.UNSUPPORTED: "Unsupported",
    Code.ALREADY_EXISTS: "Already exists",
    Code.CANCELLED: "Cancelled",
}


class TritonError(Exception):
    """An error that reaches the client with a Triton status code and message."""

    code: Code = Code.INTERNAL

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.value}: {self.message!r})"


class UnknownError(TritonError):
    code = Code.UNKNOWN


class InternalError(TritonError):
    code = Code.INTERNAL


class NotFoundError(TritonError):
    code = Code.NOT_FOUND


class InvalidArgumentError(TritonError):
    code = Code.INVALID_ARG


class UnavailableError(TritonError):
    code = Code.UNAVAILABLE


class UnsupportedError(TritonError):
    code = Code.UNSUPPORTED


class AlreadyExistsError(TritonError):
    code = Code.ALREADY_EXISTS


class CancelledError(TritonError):
    code = Code.CANCELLED


_BY_CODE: dict[Code, type[TritonError]] = {
    cls.code: cls
    for cls in (
        UnknownError,
        InternalError,
        NotFoundError,
        InvalidArgumentError,
        UnavailableError,
        UnsupportedError,
        AlreadyExistsError,
        CancelledError,
    )
}


def error_for(code: Code, message: str) -> TritonError:
    """The most specific exception class for ``code``."""
    return _BY_CODE[code](message)


# How Triton refuses a single-response endpoint to a decoupled model (after the endpoint's name).
DECOUPLED_REFUSAL = "doesn't support models with decoupled transaction policy"
