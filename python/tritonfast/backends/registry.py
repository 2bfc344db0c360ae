"""Which :class:`~tritonfast.backends.base.Backend` serves a model, by its config's
``backend`` or ``platform`` name.

Backends shipped with tritonfast are listed in :data:`BUILTIN`; each is imported the first
time a model needs it, so a backend whose framework is not installed costs nothing until a
model asks for it. Other packages add backends through the ``tritonfast.backends`` entry-point
group (each entry point names a :class:`Backend` subclass), or a program registers one with
:func:`register`. The repository manager knows no backend by name: it asks :func:`lookup`.
"""

from __future__ import annotations

import importlib
import logging
from importlib import metadata

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend
from tritonfast.errors import InvalidArgumentError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tritonfast.backends"

# Backend name -> "module:class" of the backends that come with tritonfast.
BUILTIN: dict[str, str] = {
    "python": "tritonfast.backends.python.kind:PythonBackend",
    "ensemble": "tritonfast.backends.ensemble.kind:EnsembleBackend",
    "onnxruntime": "tritonfast.backends.onnxruntime.kind:OnnxRuntimeBackend",
    "tensorrt": "tritonfast.backends.tensorrt.kind:TensorRTBackend",
    "tritonfast_callable": "tritonfast.callables.backend:CallableBackend",
}
# Platform name -> the built-in backend that serves it.
BUILTIN_PLATFORMS: dict[str, str] = {
    "ensemble": "ensemble",
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
}
# The platforms Triton knows, and the backend each stands for: a model naming another platform
# (and no backend) is refused while the repository is polled, one whose backend is missing
# fails its versions.
TRITON_PLATFORMS: dict[str, str] = {
    **BUILTIN_PLATFORMS,
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "pytorch_libtorch": "pytorch",
}

_by_name: dict[str, type[Backend]] = {}
_by_platform: dict[str, type[Backend]] = {}
_entry_points_read = False


class BackendSettings:
    """``--backend-config`` values: ``BACKEND,KEY=VALUE`` for one backend, ``KEY=VALUE`` for
    every backend (a backend's own value wins)."""

    def __init__(self, flags: list[str] | None = None) -> None:
        self._values: dict[str, dict[str, str]] = {}
        for flag in flags or []:
            head, equals, value = flag.partition("=")
            backend, comma, key = head.rpartition(",")
            if not equals or not key:
                raise InvalidArgumentError(
                    f"--backend-config option format is '<backend name>,<setting>=<value>' or"
                    f" '<setting>=<value>', got '{flag}'"
                )
            self._values.setdefault(backend if comma else "", {})[key] = value

    def for_backend(self, name: str) -> dict[str, str]:
        return {**self._values.get("", {}), **self._values.get(name, {})}


def register(backend: type[Backend]) -> None:
    """Serve models whose config names ``backend.name`` (or one of ``backend.platforms``)
    with ``backend``; a later registration of the same name replaces the earlier one."""
    _by_name[backend.name] = backend
    for platform in backend.platforms:
        _by_platform[platform] = backend


def lookup(config: model_config_pb2.ModelConfig) -> type[Backend]:
    """The backend for ``config``. None known by its names: :class:`UnknownPlatformError` for
    a platform Triton does not know either (and no backend named), else InvalidArgumentError
    in Triton's words for a backend library it cannot find."""
    backend = _find(config)
    if backend is None:
        _read_entry_points()
        backend = _find(config)
    if backend is not None:
        return backend
    name = config.backend or TRITON_PLATFORMS.get(config.platform)
    if name is None:
        raise UnknownPlatformError(
            f"unexpected platform type '{config.platform}' for {config.name}"
        )
    raise InvalidArgumentError(
        f"unable to find backend library for backend '{name}', try specifying runtime on the"
        " model configuration."
    )


class UnknownPlatformError(InvalidArgumentError):
    """A model's config names a platform no backend serves and Triton does not know."""


def _find(config: model_config_pb2.ModelConfig) -> type[Backend] | None:
    if config.backend:
        return _find_by_name(config.backend)
    if config.platform not in _by_platform and config.platform in BUILTIN_PLATFORMS:
        return _find_by_name(BUILTIN_PLATFORMS[config.platform])
    return _by_platform.get(config.platform)


def _find_by_name(name: str) -> type[Backend] | None:
    backend = _by_name.get(name)
    if backend is None and name in BUILTIN:
        module_name, _, class_name = BUILTIN[name].partition(":")
        backend = getattr(importlib.import_module(module_name), class_name)
        register(backend)
    return backend


def _read_entry_points() -> None:
    """Register the backends other installed packages declare (once per process)."""
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            backend = entry.load()
        except Exception:  # a broken plugin must not stop the server's own backends
            log.exception("cannot load the backend '%s' (%s)", entry.name, entry.value)
            continue
        if not (isinstance(backend, type) and issubclass(backend, Backend)):
            log.error("entry point '%s' (%s) is not a Backend subclass", entry.name, entry.value)
            continue
        if backend.name not in _by_name:  # built-in and registered backends come first
            register(backend)
