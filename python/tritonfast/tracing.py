"""Request tracing in Triton's own ("triton") mode: settings, sampling and the trace file.

Settings exist globally and per model (a model's own setting, while set, wins over the global
one): ``trace_level`` (``OFF``, or ``TIMESTAMPS`` and/or ``TENSORS``), ``trace_rate`` (trace
one request in N), ``trace_count`` (how many more to trace; -1: no limit), ``log_frequency``
(write the file every N traces, to ``<file>.0``, ``<file>.1``…; 0: once, at shutdown),
``trace_file`` and ``trace_mode``. They come from ``--trace-config`` and the trace extension.

A traced request carries a :class:`RequestTrace`; every layer it passes through stamps it
(monotonic nanoseconds): the frontend (``HTTP_RECV_*``/``HTTP_SEND_*``, ``GRPC_*``), the data
plane (``REQUEST_START``/``REQUEST_END``), the scheduler (``QUEUE_START``) and the instance
(``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``). The file
is Triton's: one JSON array of events, ``{"id", "model_name", "model_version"[,
"request_id"]}``, ``{"id", "timestamps": [{"name", "ns"}]}`` (level ``TIMESTAMPS``) and, with
level ``TENSORS``, ``{"id", "activity": "TENSOR_QUEUE_INPUT" | "TENSOR_BACKEND_OUTPUT",
"tensor": {"name", "data": "1,2,3", "shape": "1,3", "dtype": "FP32"}}`` per tensor.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.errors import InvalidArgumentError, UnsupportedError

log = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
# The extension's setting names and the TraceSettings fields they name.
_FIELDS = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
    "trace_file": "file",
    "trace_mode": "mode",
}


@dataclass(frozen=True)
class TraceSettings:
    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    mode: str = "triton"
    # mode "opentelemetry": where spans go, and resource attributes (start-up only).
    url: str = ""
    resource: tuple[tuple[str, str], ...] = ()

    @property
    def active(self) -> bool:
        return "OFF" not in self.level and bool(self.level)

    def as_dict(self) -> dict[str, Any]:
        """The extension's JSON form: every value a string, the level a list."""
        values = {key: getattr(self, field) for key, field in _FIELDS.items()}
        return {
            key: list(value) if key == "trace_level" else str(value)
            for key, value in values.items()
        }


@dataclass
class RequestTrace:
    id: int
    model_name: str
    model_version: int = -1
    request_id: str = ""
    with_timestamps: bool = True
    with_tensors: bool = False
    # The trace of the request this one was made for (an ensemble's step, a BLS call); 0: none.
    parent_id: int = 0
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    tensors: list[dict[str, Any]] = field(default_factory=list)

    def stamp(self, name: str, ns: int) -> None:
        if self.with_timestamps:
            self.timestamps.append((name, ns))

    def record_tensors(self, activity: str, tensors: Iterable[Any]) -> None:
        """Record tensors (objects with name, datatype, shape, data) at ``activity``."""
        if not self.with_tensors:
            return
        for tensor in tensors:
            data = tensor.data
            if not isinstance(data, np.ndarray):  # device memory (a CUDA window): its bytes
                data = np.asarray(data).view(NUMPY_DTYPES[tensor.datatype])
            self.tensors.append(
                {
                    "id": self.id,
                    "activity": activity,
                    "tensor": {
                        "name": tensor.name,
                        "data": _tensor_text(data),
                        "shape": ",".join(str(int(d)) for d in tensor.shape),
                        "dtype": tensor.datatype,
                    },
                }
            )

    def events(self) -> list[dict[str, Any]]:
        head: dict[str, Any] = {"id": self.id, "model_name": self.model_name}
        head["model_version"] = self.model_version
        if self.request_id:
            head["request_id"] = self.request_id
        if self.parent_id:
            head["parent_id"] = self.parent_id
        events = [head, *self.tensors]
        if self.with_timestamps:
            stamps = [{"name": n, "ns": ns} for n, ns in self.timestamps]
            events.append({"id": self.id, "timestamps": stamps})
        return events


def _tensor_text(data: Any) -> str:
    """A tensor's elements as Triton writes them in a trace: comma-separated, as a C++ stream
    prints them (``1`` for 1.0, six significant digits, booleans as 0/1)."""
    return ",".join(_element_text(item) for item in np.asarray(data).ravel().tolist())


def _element_text(item: Any) -> str:
    if isinstance(item, bytes):
        return item.decode("utf-8", "replace")
    if isinstance(item, bool):
        return "1" if item else "0"
    if isinstance(item, float):
        return format(item, "g")
    return str(item)


def parse_trace_config(values: list[str]) -> TraceSettings:
    """``--trace-config`` values: ``[triton,]key=value`` with keys file, log-frequency, rate,
    count, level (repeatable), mode."""
    settings = TraceSettings()
    levels: list[str] = []
    for value in values:
        scope, _, setting = value.partition(",") if "," in value else ("", "", value)
        key, separator, text = setting.partition("=")
        if not separator:
            raise InvalidArgumentError(f"--trace-config expects key=value, got '{value}'")
        if scope == "opentelemetry" and key == "url":
            settings = replace(settings, url=text)
        elif scope == "opentelemetry" and key == "resource":
            name, _, attribute = text.partition("=")
            settings = replace(settings, resource=(*settings.resource, (name, attribute)))
        elif scope == "opentelemetry":
            continue  # batch-processor tuning Triton accepts; the SDK's defaults apply
        elif key == "level":
            if text.upper() not in LEVELS:
                raise InvalidArgumentError(f"unknown trace level '{text}'")
            levels.append(text.upper())
        elif key == "file":
            settings = replace(settings, file=text)
        elif key == "mode":
            if text not in ("triton", "opentelemetry"):
                raise InvalidArgumentError(f"unknown trace mode '{text}'")
            settings = replace(settings, mode=text)
        elif key == "rate":
            settings = replace(settings, rate=_integer(key, text, 0))
        elif key == "count":
            settings = replace(settings, count=_integer(key, text, -1))
        elif key == "log-frequency":
            settings = replace(settings, log_frequency=_integer(key, text, 0))
        else:
            raise InvalidArgumentError(f"unknown --trace-config setting '{key}'")
    if levels:
        settings = replace(settings, level=tuple(dict.fromkeys(levels)))
    return settings


def _integer(key: str, text: str, minimum: int) -> int:
    try:
        number = int(text)
    except ValueError:
        raise InvalidArgumentError(f"Unable to parse '{key}', got: {text}") from None
    if number < minimum:
        raise InvalidArgumentError(
            f"Unable to parse '{key}'. Expecting value >= {minimum}, got:{number}"
        )
    return number


class Tracer:
    """Sampling, the settings in force, and writing traces out."""

    def __init__(self, settings: TraceSettings | None = None) -> None:
        self._startup = settings or TraceSettings()
        self._exporter: Any = None
        if self._startup.mode == "opentelemetry":
            from tritonfast.otel import DEFAULT_URL, OpenTelemetryExporter

            url = self._startup.url or DEFAULT_URL
            self._exporter = OpenTelemetryExporter(url, dict(self._startup.resource))
        self._global = self._startup
        self._models: dict[str, dict[str, Any]] = {}  # a model's own settings, key by key
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}
        self._remaining: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._done: list[RequestTrace] = []
        self._files = itertools.count()
        # What update() derives, so that start() only looks up: a model's settings in force,
        # the models that sample on their own (own rate or count), and whether any is active.
        self._effective: dict[str, TraceSettings] = {}
        self._own_sampling: frozenset[str] = frozenset()
        self._any_active = self._global.active

    # -- settings (the trace extension) ----------------------------------------------------------
    def settings(self, model: str = "") -> TraceSettings:
        return self._effective.get(model, self._global) if model else self._global

    def update(self, changes: dict[str, Any], model: str = "") -> TraceSettings:
        """Apply the extension's changes (strings, level a list; ``None`` resets a setting: a
        model's to the global value, a global one to its start-up value)."""
        parsed: dict[str, Any] = {}
        resets: list[str] = []
        for key, value in changes.items():
            if key not in _FIELDS:
                continue
            if value is None:
                resets.append(key)
                continue
            if key == "trace_file":
                raise UnsupportedError(
                    "trace file location can not be updated through network protocol"
                )
            if key == "trace_level":
                levels = [str(v) for v in value]
                if not levels:
                    continue  # an empty list changes nothing
                if "OFF" in levels and len(levels) > 1:
                    raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
                parsed["level"] = tuple(level for level in levels if level in LEVELS) or ("OFF",)
            elif key == "trace_rate":
                parsed["rate"] = _integer("trace_rate", value, 0)
            elif key == "trace_count":
                parsed["count"] = _integer("trace_count", value, -1)
            elif key == "log_frequency":
                parsed["log_frequency"] = _integer("log_frequency", value, 0)
            elif key == "trace_mode":
                parsed["mode"] = str(value)
        with self._lock:
            if model:
                own = self._models.setdefault(model, {})
                own.update(parsed)
                for key in resets:
                    own.pop(_FIELDS[key], None)
            else:
                reset_values = {_FIELDS[k]: getattr(self._startup, _FIELDS[k]) for k in resets}
                self._global = replace(self._global, **parsed, **reset_values)
            if "count" in parsed:
                self._remaining.pop(model, None)
            self._derive()
            settings = self.settings(model)
            if settings.active and not settings.file and self._exporter is None:
                raise InvalidArgumentError(
                    "Attempting to set invalid trace setting :trace file name is not given"
                )
            return settings

    def _derive(self) -> None:
        """Recompute what :meth:`start` looks up (with the lock held)."""
        models = self._models
        self._effective = {m: replace(self._global, **own) for m, own in models.items()}
        self._own_sampling = frozenset(
            m for m, own in models.items() if "rate" in own or "count" in own
        )
        self._any_active = self._global.active or any(s.active for s in self._effective.values())

    # -- tracing requests --------------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """Whether any request may be traced (frontends skip their stamps otherwise)."""
        return self._any_active

    def start(
        self, model: str, version: int, request_id: str, parent_id: int = 0
    ) -> RequestTrace | None:
        """A trace for this request if it is sampled (one in ``trace_rate``), else None. A
        request made for a traced one (``parent_id``: an ensemble's step, a BLS call) is
        traced with it, as in Triton."""
        if not self._any_active:
            return None
        settings = self.settings(model)
        if parent_id:
            return self._new(settings, model, version, request_id, parent_id)
        if not settings.active or settings.rate <= 0:
            return None
        # Sampling counts per owner of the settings in force: the model when it has its own
        # rate or count, else the global settings (shared by every such model, as in Triton).
        owner = model if model in self._own_sampling else ""
        with self._lock:
            seen = self._seen.get(owner, 0) + 1
            self._seen[owner] = seen
            if (seen - 1) % settings.rate:
                return None
            remaining = self._remaining.get(owner, settings.count)
            if remaining == 0:
                return None
            if remaining > 0:
                self._remaining[owner] = remaining - 1
            return self._new(settings, model, version, request_id, 0)

    def _new(
        self, settings: TraceSettings, model: str, version: int, request_id: str, parent_id: int
    ) -> RequestTrace:
        return RequestTrace(
            next(self._ids),
            model,
            version,
            request_id,
            with_timestamps="TIMESTAMPS" in settings.level,
            with_tensors="TENSORS" in settings.level,
            parent_id=parent_id,
        )

    def finish(self, trace: RequestTrace) -> None:
        if self._exporter is not None:
            self._exporter.export(trace)
            return
        settings = self.settings(trace.model_name)
        with self._lock:
            self._done.append(trace)
            if settings.log_frequency and len(self._done) >= settings.log_frequency:
                self._write(self._numbered(settings.file))

    def flush(self) -> None:
        """Write (or send) what is left (at shutdown)."""
        if self._exporter is not None:
            self._exporter.shutdown()
            return
        with self._lock:
            if not self._done:
                return
            settings = self._global
            path = settings.file if not settings.log_frequency else None
            self._write(path or self._numbered(settings.file))

    def _numbered(self, file: str) -> str:
        """The next of the numbered files ``file.N`` (none when no file is set: the traces
        are dropped, never written as ``.N`` in the working directory)."""
        return f"{file}.{next(self._files)}" if file else ""

    def _write(self, path: str) -> None:
        events = [event for trace in self._done for event in trace.events()]
        self._done = []
        if not path:
            return
        try:
            Path(path).write_text(json.dumps(events))
        except OSError as error:
            log.error("cannot write the trace file %s: %s", path, error)
