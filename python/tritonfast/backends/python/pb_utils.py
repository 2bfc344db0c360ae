"""``triton_python_backend_utils`` for models that run inside tritonfast.

Triton's Python backend gives ``model.py`` a module named ``triton_python_backend_utils``;
tritonfast registers this module under that name before it imports a model, so existing
models run unchanged. Models run in-process: a request's tensors are the numpy arrays the
codec decoded (views of the request body where the protocol allows), never copies.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tritonfast import custommetrics
from tritonfast.backends.python import bls

# The values models exchange, under the names models use.
from tritonfast.backends.python.pb_values import (
    ERROR_CODES as ERROR_CODES,
)
from tritonfast.backends.python.pb_values import (
    TRITON_STRING_TO_NUMPY as TRITON_STRING_TO_NUMPY,
)
from tritonfast.backends.python.pb_values import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END as TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
)
from tritonfast.backends.python.pb_values import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START as TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
)
from tritonfast.backends.python.pb_values import (
    TRITONSERVER_REQUEST_RELEASE_ALL as TRITONSERVER_REQUEST_RELEASE_ALL,
)
from tritonfast.backends.python.pb_values import (
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE as TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
)
from tritonfast.backends.python.pb_values import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL as TRITONSERVER_RESPONSE_COMPLETE_FINAL,
)
from tritonfast.backends.python.pb_values import (
    InferenceResponse as InferenceResponse,
)
from tritonfast.backends.python.pb_values import (
    Tensor as Tensor,
)
from tritonfast.backends.python.pb_values import (
    TritonError as TritonError,
)
from tritonfast.backends.python.pb_values import (
    TritonModelException as TritonModelException,
)
from tritonfast.backends.python.pb_values import (
    _argument as _argument,
)
from tritonfast.backends.python.pb_values import (
    deserialize_bytes_tensor as deserialize_bytes_tensor,
)
from tritonfast.backends.python.pb_values import (
    numpy_to_triton_type as numpy_to_triton_type,
)
from tritonfast.backends.python.pb_values import (
    serialize_byte_tensor as serialize_byte_tensor,
)
from tritonfast.backends.python.pb_values import (
    triton_string_to_numpy as triton_string_to_numpy,
)
from tritonfast.backends.python.pb_values import (
    triton_to_numpy_type as triton_to_numpy_type,
)
from tritonfast.errors import TritonError as ServerError
from tritonfast.runtime import responses


class InferenceTrace:
    """A request's trace, as ``request.trace()`` gives it (see :meth:`InferenceRequest.trace`)."""

    __slots__ = ("_trace",)

    def __init__(self, trace: Any = None) -> None:
        self._trace = trace  # the server's tracing.RequestTrace, or None when not traced

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The OpenTelemetry context of the trace (none here: the trace is Triton-mode)."""
        return None


class MemoryType(enum.IntEnum):
    """Where a BLS call prefers its outputs (Triton's ``PreferredMemory`` memory types)."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """``InferenceRequest(..., preferred_memory=PreferredMemory(TRITONSERVER_MEMORY_CPU))``: where
    a BLS call would like its outputs. A hint, as in Triton: the callee's outputs come back as
    they are (host arrays from this server's backends)."""

    def __init__(
        self,
        preferred_memory_type: MemoryType = TRITONSERVER_MEMORY_CPU,
        preferred_device_id: int = 0,
    ) -> None:
        _argument("PreferredMemory", "preferred_memory_type", preferred_memory_type, MemoryType)
        _argument("PreferredMemory", "preferred_device_id", preferred_device_id, int)
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceRequest:
    """A request as ``execute`` sees it, or one a model builds to call another model of the
    server (BLS: :meth:`exec`, :meth:`async_exec`)."""

    def __init__(
        self,
        model_name: str | bytes = "",
        requested_output_names: Sequence[str] = (),
        inputs: Sequence[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        parameters: dict[str, Any] | str | None = None,
        trace: InferenceTrace | None = None,
        preferred_memory: PreferredMemory | None = None,
    ) -> None:
        # Arguments are checked as Triton's binding checks them: TypeError for a wrong type.
        _argument("InferenceRequest", "model_name", model_name, (str, bytes))
        _argument("InferenceRequest", "inputs", inputs, (list, tuple))
        _argument(
            "InferenceRequest", "requested_output_names", requested_output_names, (list, tuple)
        )
        for name in requested_output_names:
            _argument("InferenceRequest", "requested_output_names", name, str)
        _argument("InferenceRequest", "request_id", request_id, str)
        _argument("InferenceRequest", "correlation_id", correlation_id, (int, str))
        for what, number in (
            ("flags", flags),
            ("timeout", timeout),
            ("model_version", model_version),
        ):
            _argument("InferenceRequest", what, number, int)
        if not all(isinstance(tensor, Tensor) for tensor in inputs):
            raise TritonModelException("InferenceRequest: every input must be a Tensor")
        # Models often pass a name read from a BYTES tensor as it is: Triton takes bytes too.
        if isinstance(model_name, bytes):
            model_name = model_name.decode()
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._set(
            model_name,
            list(requested_output_names),
            list(inputs),
            request_id,
            correlation_id,
            parameters or {},
        )
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._trace: InferenceTrace | None = trace

    @classmethod
    def _of(cls, *fields: Any) -> InferenceRequest:
        """A request the backend builds for ``execute``, whose fields (those of :meth:`_set`)
        are known good: no checks on the path of every request."""
        request = cls.__new__(cls)
        request._set(*fields)
        return request

    def _set(
        self,
        model_name: str,
        requested_output_names: list[str],
        inputs: list[Tensor],
        request_id: str,
        correlation_id: int | str,
        parameters: dict[str, Any],
    ) -> None:
        self._model_name = model_name
        self._requested_output_names = requested_output_names
        self._inputs = inputs
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._parameters: dict[str, Any] = parameters
        self._model_version = -1
        self._flags = 0
        self._timeout = 0
        self._trace = None
        self._cancelled = False
        # The server-side request this wraps (set by the backend), and the backend's
        # conversion of a model's InferenceResponse for it (what its response sender sends).
        self._origin: Any = None
        self._convert: Any = None

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def trace(self) -> InferenceTrace:
        """This request's trace: pass it as ``trace=`` to the requests made for it (BLS), so
        that their traces name this one as their parent."""
        if self._trace is None:
            origin = self._origin
            self._trace = InferenceTrace(origin.trace if origin is not None else None)
        return self._trace

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def requested_output_names(self) -> list[str]:
        return self._requested_output_names

    def parameters(self) -> str:
        """The request parameters as a JSON string (compact, as Triton writes it), without
        those the protocol itself uses (``data.types.PROTOCOL_PARAMETERS``)."""
        return json.dumps(self._parameters, separators=(",", ":"))

    def is_cancelled(self) -> bool:
        return self._cancelled or (
            self._origin is not None and responses.is_cancelled(self._origin)
        )

    def set_cancelled(self) -> None:
        self._cancelled = True

    def set_flags(self, flags: int) -> None:
        """The sequence flags of a request this model sends (BLS)."""
        _argument("InferenceRequest.set_flags", "flags", flags, int)
        self._flags = flags

    def set_release_flags(self, flags: int) -> None:
        """What becomes of this request once ``execute`` returns:
        ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` runs it again in a later batch (request
        rescheduling, for models with ``sequence_batching { iterative_sequence: true }``; a
        non-decoupled model returns ``None`` for it meanwhile), ``..._RELEASE_ALL`` (the
        default) ends it."""
        _argument("InferenceRequest.set_release_flags", "flags", flags, int)
        if self._origin is not None:
            self._origin.release_flags = flags

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender through which the model answers this request instead of returning its
        response from ``execute`` (decoupled models: any number of responses, then
        ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``)."""
        origin = self._origin
        if origin is None or (origin.sink is None and origin.sender is None):
            raise TritonModelException(
                "this request has no response sender: only requests the server passes to"
                " execute() of an in-process model have one"
            )
        return InferenceResponseSender(responses.sender_of(origin), origin, self._convert)

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the model it names and wait for the response (an
        InferenceResponse whose ``has_error()`` tells if it failed); with ``decoupled``, an
        iterator of the responses of a model that may send any number."""
        return bls.execute(self, decoupled)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """:meth:`exec` for ``async def execute``: many requests may be in flight at once."""
        return await bls.execute_async(self, decoupled)


class InferenceResponseSender:
    """Sends the responses of one request (``request.get_response_sender()``)."""

    __slots__ = ("_convert", "_origin", "_sender")

    def __init__(self, sender: Any, origin: Any, convert: Any) -> None:
        self._sender = sender
        self._origin = origin
        self._convert = convert

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags == 0:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        result = None if response is None else self._convert(self._origin, response)
        try:
            self._sender.send(result, final=flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except ServerError as error:
            raise TritonModelException(error.message) from None

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entry in model_config.get("input", []):
        if entry["name"] == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for entry in model_config.get("output", []):
        if entry["name"] == name:
            return entry
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class ModelConfig:
    """The configuration handed to ``auto_complete_config``; models fill in what is missing."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = model_config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def max_batch_size(self) -> int:
        return int(self._config.get("max_batch_size", 0))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise ValueError("max_batch_size must be a non-negative integer")
        current = int(self._config.get("max_batch_size", 0))
        if current != 0 and current != max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config"
                f" function for model '{self._config.get('name', '')}' specified max_batch_size"
                f" {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model transaction property '{key}' is not supported")
        policy = self._config.setdefault("model_transaction_policy", {})
        policy.update(transaction_policy_dict)

    def add_input(self, input: dict[str, Any]) -> None:
        self._add_tensor("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_tensor("output", output)

    def _add_tensor(self, kind: str, tensor: dict[str, Any]) -> None:
        if not isinstance(tensor, dict):
            raise ValueError(f"{kind} for model must be a dict")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{tensor.get('name', '')}' is missing the '{key}' property"
                )
        entries = self._config.setdefault(kind, [])
        for existing in entries:
            if existing.get("name") != tensor["name"]:
                continue
            # Already in config.pbtxt: the two must agree on whatever both specify.
            for key in ("data_type", "dims"):
                if key in existing and _norm(existing[key]) != _norm(tensor[key]):
                    raise ValueError(
                        f"unable to add {kind} '{tensor['name']}': configuration specified"
                        f" {key} {existing[key]}, auto-complete-config specified {tensor[key]}"
                    )
            existing.update({k: v for k, v in tensor.items() if k not in existing})
            return
        entries.append(dict(tensor))


def _norm(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return value


# -- model control from a model (Triton's model loading API for BLS) ----------------------------
def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name`` as the repository extension's load does: ``config``
    the model configuration as JSON, ``files`` its files by ``"file:<path>"`` (with a config).
    Returns once it is loaded; TritonModelException when it fails (e.g. when the server is not
    in explicit model control mode)."""
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths"
            " and file contents"
        )
    parameters: dict[str, Any] = dict(files or {})
    if config:
        parameters["config"] = config
    _control("Failed to load model", "load_model", model_name, parameters)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (and, with ``unload_dependents``, an ensemble's step models) as the
    repository extension's unload does; returns once it is unloaded."""
    _control("Failed to unload model", "unload_model", model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (``model_version``, an integer > 0 as a string; empty: the
    model's versions as a whole) is ready."""
    if model_version:
        try:
            valid = int(model_version) >= 0
        except ValueError:
            valid = False
        if not valid:
            raise TritonModelException(
                "Failed to check model readiness: failed to get model version from specified"
                f" version string '{model_version}', version should be an integral value > 0"
            )
    return bool(
        _control("Failed to check model readiness", "model_ready", model_name, model_version)
    )


def _control(failure: str, operation: str, *arguments: Any) -> Any:
    from tritonfast.runtime import handle

    try:
        return getattr(handle.current(), operation)(*arguments)
    except ServerError as error:
        raise TritonModelException(f"{failure}: {error.message}") from None


class LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_Level = LogLevel  # the enum, where Logger's own LogLevel attribute would shadow it


class Logger:
    """Model logging routed into the server's log (``pb_utils.Logger.log_info(...)``). A record
    names the model's file and line that logged it, as Triton's do. The levels are also
    attributes of the class (``pb_utils.Logger.INFO``, ``pb_utils.Logger.LogLevel``), as in
    Triton's binding."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    _log = logging.getLogger("tritonfast.model")

    @classmethod
    def log(cls, message: str, level: _Level = _Level.INFO) -> None:
        cls._emit(message, level, "Logger.log")

    @classmethod
    def log_info(cls, message: str) -> None:
        cls._emit(message, LogLevel.INFO, "Logger.log_info")

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls._emit(message, LogLevel.WARNING, "Logger.log_warn")

    @classmethod
    def log_error(cls, message: str) -> None:
        cls._emit(message, LogLevel.ERROR, "Logger.log_error")

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls._emit(message, LogLevel.VERBOSE, "Logger.log_verbose")

    @classmethod
    def _emit(cls, message: str, level: _Level, function: str) -> None:
        """Called by the public methods only: the record's location is their caller's."""
        _argument(function, "message", message, str)
        _argument(function, "level", level, LogLevel)  # a LogLevel, not a number
        python_level = {
            LogLevel.INFO: logging.INFO,
            LogLevel.WARNING: logging.WARNING,
            LogLevel.ERROR: logging.ERROR,
            LogLevel.VERBOSE: logging.DEBUG,
        }.get(level, logging.INFO)
        cls._log.log(python_level, "%s", message, stacklevel=3)


# -- custom metrics ---------------------------------------------------------------------------
_METRIC_KINDS = {0: custommetrics.COUNTER, 1: custommetrics.GAUGE, 2: custommetrics.HISTOGRAM}


def _metric_call(operation: Any, *args: Any) -> Any:
    try:
        return operation(*args)
    except custommetrics.MetricError as error:
        raise TritonModelException(str(error)) from None


class Metric:
    """One labelled metric of a :class:`MetricFamily` (made by ``MetricFamily.Metric``)."""

    def __init__(
        self,
        registry: custommetrics.CustomMetrics,
        family: custommetrics.Family,
        series: custommetrics.Series,
    ) -> None:
        # The internal family, not the MetricFamily object: deleting that object ends the
        # family, after which this metric refuses every operation (as in Triton).
        self._registry = registry
        self._family = family
        self._series = series

    def increment(self, value: float) -> None:
        _metric_call(self._registry.increment, self._family, self._series, float(value))

    def set(self, value: float) -> None:
        _metric_call(self._registry.set, self._family, self._series, float(value))

    def observe(self, value: float) -> None:
        _metric_call(self._registry.observe, self._family, self._series, float(value))

    def value(self) -> float:
        return float(_metric_call(self._registry.value, self._family, self._series))


class MetricFamily:
    """A custom metric family exported on the ``/metrics`` of the server the model runs in
    (Triton's API)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in _METRIC_KINDS:
            raise TritonModelException(f"unknown metric family kind {kind!r}")
        from tritonfast.runtime import handle

        try:
            self._registry = handle.current().custom_metrics.registry
        except ServerError as error:
            raise TritonModelException(error.message) from None
        self._family = _metric_call(
            self._registry.acquire_family, name, description, _METRIC_KINDS[kind]
        )

    def Metric(  # Triton's name
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        series = _metric_call(self._registry.series, self._family, labels or {}, buckets)
        return Metric(self._registry, self._family, series)

    def __del__(self) -> None:
        family = getattr(self, "_family", None)
        if family is not None:
            self._registry.release_family(family)


if not TYPE_CHECKING:  # (type checkers go on reporting misspelt names)

    def __getattr__(name: str) -> Any:
        """A name this module lacks, reported under the name models import it by."""
        raise AttributeError(f"module 'triton_python_backend_utils' has no attribute '{name}'")
