"""Importing a Triton ``model.py`` (``class TritonPythonModel``) and letting it complete its
configuration (``auto_complete_config``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import inspect
import itertools
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType

import tritonfast
from tritonfast._proto import model_config_pb2
from tritonfast.backends.python import pb_utils
from tritonfast.config.jsonform import config_to_json, json_to_config
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError

DEFAULT_MODEL_FILE = "model.py"
MODEL_CLASS = "TritonPythonModel"

_module_ids = itertools.count()


def _install_pb_utils() -> None:
    """Make ``import triton_python_backend_utils`` in model.py find our module."""
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)


def load_model_class(path: Path, model_name: str) -> type:
    """Import ``path`` as a fresh module and return its TritonPythonModel class."""
    if not path.is_file():
        raise InvalidArgumentError(f"unable to find the Python model file '{path}'")
    _install_pb_utils()
    module_name = f"_tritonfast_model_{next(_module_ids)}_{model_name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InvalidArgumentError(f"unable to import the Python model file '{path}'")
    module: ModuleType = importlib.util.module_from_spec(spec)
    # Models import helpers that sit next to model.py, as they can under Triton; a reload must
    # import them afresh, not reuse the modules a previous load cached.
    model_dir = str(path.parent)
    if model_dir not in sys.path:
        sys.path.insert(0, model_dir)
    inside = model_dir + os.sep
    for name, cached in list(sys.modules.items()):
        cached_file = getattr(cached, "__file__", None)
        if cached_file and cached_file.startswith(inside):  # helper modules and packages
            del sys.modules[name]
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the model's own error, as Triton's stub reports it
        raise InternalError(describe(exc)) from exc
    model_class = getattr(module, MODEL_CLASS, None)
    if not isinstance(model_class, type):
        raise InternalError(f"'{path}' does not define class {MODEL_CLASS}")
    return model_class


def auto_complete(model_class: type, config: model_config_pb2.ModelConfig) -> None:
    """Let the model fill in its configuration (``auto_complete_config``), in place."""
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return
    wrapper = pb_utils.ModelConfig(config_to_json(config))
    try:
        completed = hook(wrapper)
    except Exception as exc:  # the model's own error, as Triton's stub reports it
        raise InternalError(describe(exc)) from exc
    result = (
        completed.as_dict() if isinstance(completed, pb_utils.ModelConfig) else wrapper.as_dict()
    )
    fresh = model_config_pb2.ModelConfig()
    json_to_config(result, fresh)
    config.CopyFrom(fresh)


def describe(exc: BaseException) -> str:
    """``Type: message`` and the model's frames, in the layout Triton's Python backend uses:
    ``ValueError: boom\n\nAt:\n  /path/model.py(4): execute\n`` (innermost frame first)."""
    if isinstance(exc, TritonError):
        return exc.message
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _ours(f.filename)]
    # The calls between the server and the model (an async execute's event loop and future)
    # are ours too; the library code the model calls into is its own, and stays.
    while frames and frames[0].filename.startswith(_PLUMBING):
        frames.pop(0)
    at = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc}\n\nAt:\n{at}"


# Frames left out of a model's traceback: the server's own code (Triton shows only Python
# frames, and everything around a model there is C++), and the standard library's
# machinery an async execute runs through.
_OWN_CODE = os.path.dirname(str(tritonfast.__file__)) + os.sep
_BUNDLED_MODELS = os.path.join(_OWN_CODE, "examples") + os.sep  # models, not the server
_PLUMBING = tuple(os.path.dirname(str(m.__file__)) + os.sep for m in (asyncio, concurrent))


def _ours(filename: str) -> bool:
    return filename.startswith(_OWN_CODE) and not filename.startswith(_BUNDLED_MODELS)


# What a model calls to wait on the server (pb_utils InferenceRequest.exec / async_exec, and
# the model loading API).
SERVER_CALLS = frozenset(("exec", "async_exec", "load_model", "unload_model", "is_model_ready"))


def calls_server(model_class: type) -> bool:
    """Whether the code of the model's methods names a call that waits on the server.
    Helpers imported from elsewhere are not looked at: a call made from them is caught when
    it happens (see runtime.looprun)."""
    pending = [
        member.__code__
        for _, member in inspect.getmembers(model_class, inspect.isfunction)
        if member.__module__ == model_class.__module__
    ]
    while pending:
        code = pending.pop()
        if SERVER_CALLS.intersection(code.co_names):
            return True
        pending.extend(const for const in code.co_consts if inspect.iscode(const))
    return False
