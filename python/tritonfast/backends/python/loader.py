"""The Python backend: runs a Triton ``model.py`` (``class TritonPythonModel``) in-process.

Triton starts a stub process per instance and copies tensors through shared memory; here
``execute`` receives the numpy arrays the codec decoded, without a copy, on the instance's
own thread.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, PhaseClock, Result
from tritonfast.backends.python import pb_utils
from tritonfast.config.jsonform import config_to_json, json_to_config
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError, error_for
from tritonfast.runtime import batchtensor
from tritonfast.runtime.types import InferRequest, InferResponse, OutputTensor
from tritonfast.runtime.validate import WIRE_DATATYPES

DEFAULT_MODEL_FILE = "model.py"
MODEL_CLASS = "TritonPythonModel"

_module_ids = itertools.count()


def _install_pb_utils() -> None:
    """Make ``import triton_python_backend_utils`` in model.py find our module."""
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)


def model_file(config: model_config_pb2.ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or DEFAULT_MODEL_FILE)


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
    except Exception as exc:
        raise InvalidArgumentError(
            f"failed to load the Python model file '{path}': {_describe(exc)}"
        ) from exc
    model_class = getattr(module, MODEL_CLASS, None)
    if not isinstance(model_class, type):
        raise InvalidArgumentError(f"'{path}' does not define class {MODEL_CLASS}")
    return model_class


def auto_complete(model_class: type, config: model_config_pb2.ModelConfig) -> None:
    """Let the model fill in its configuration (``auto_complete_config``), in place."""
    hook = getattr(model_class, "auto_complete_config", None)
    if hook is None:
        return
    wrapper = pb_utils.ModelConfig(config_to_json(config))
    try:
        completed = hook(wrapper)
    except Exception as exc:
        raise InvalidArgumentError(
            f"auto_complete_config failed for model '{config.name}': {_describe(exc)}"
        ) from exc
    result = (
        completed.as_dict() if isinstance(completed, pb_utils.ModelConfig) else wrapper.as_dict()
    )
    fresh = model_config_pb2.ModelConfig()
    json_to_config(result, fresh)
    config.CopyFrom(fresh)


class PythonInstance(Backend):
    """One instance of a Python model: its own TritonPythonModel object."""

    def __init__(
        self,
        model_class: type,
        config: model_config_pb2.ModelConfig,
        *,
        instance_name: str,
        repository_path: Path,
        version: int,
        device_id: int = 0,
    ) -> None:
        self._config = config
        self._instance_name = instance_name
        self._output_names = [o.name for o in config.output]
        # numpy has no bfloat16: a BF16 output arrives as uint16 bits and takes the config's type.
        self._bf16_outputs = {
            o.name for o in config.output if o.data_type == model_config_pb2.TYPE_BF16
        }
        self._output_types = {o.name: WIRE_DATATYPES[o.data_type] for o in config.output}
        self._model = model_class()
        # A model may take whole-batch arrays instead of a list of requests (tritonfast only).
        self._batched = getattr(self._model, "execute_batched", None)
        # A coroutine execute() needs an event loop of its own, never the server's.
        self.may_run_on_event_loop = not inspect.iscoroutinefunction(
            self._batched or self._model.execute
        )
        initialize = getattr(self._model, "initialize", None)
        if initialize is not None:
            args = {
                "model_config": json.dumps(config_to_json(config)),
                "model_instance_kind": "CPU",
                "model_instance_name": instance_name,
                "model_instance_device_id": str(device_id),
                "model_repository": str(repository_path),
                "model_version": str(version),
                "model_name": config.name,
            }
            try:
                initialize(args)
            except Exception as exc:
                raise InternalError(
                    f"Failed to initialize model instance '{instance_name}': {_describe(exc)}"
                ) from exc

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        if self._batched is not None and self._config.max_batch_size > 0:
            return self._execute_batched(self._batched, requests, clock)
        pb_requests = [self._to_pb(r) for r in requests]
        clock.inputs_ready()
        try:
            responses = self._model.execute(pb_requests)
        except Exception as exc:
            return [self._failed(exc)] * len(requests)
        clock.infer_done()
        if not isinstance(responses, list) or len(responses) != len(requests):
            count = len(responses) if isinstance(responses, list) else "no"
            error = InternalError(
                f"model instance '{self._instance_name}' returned {count} responses for"
                f" {len(requests)} requests: execute() must return one response per request"
            )
            return [error] * len(requests)
        return [self._from_pb(req, resp) for req, resp in zip(requests, responses, strict=True)]

    def _failed(self, exc: Exception) -> InternalError:
        return InternalError(
            f"Failed to process the request(s) for model '{self._instance_name}',"
            f" message: {_describe(exc)}"
        )

    def _execute_batched(
        self, execute_batched: Any, requests: list[InferRequest], clock: PhaseClock
    ) -> list[Result]:
        """``execute_batched({input: whole-batch array}) -> {output: whole-batch array}``:
        each input concatenated along the batch dimension (one pooled copy), each output split
        back into one view per request."""
        sizes = [r.inputs[0].shape[0] if r.inputs else 0 for r in requests]
        names = [t.name for t in requests[0].inputs]
        # The batcher keeps a batch's input names and non-batch dimensions uniform.
        inputs = {
            name: batchtensor.gather([r.inputs[i].data for r in requests])
            for i, name in enumerate(names)
        }
        clock.inputs_ready()
        try:
            outputs = execute_batched(inputs)
        except Exception as exc:
            return [self._failed(exc)] * len(requests)
        clock.infer_done()
        try:
            pieces = self._split_outputs(outputs, sizes)
        except InternalError as error:
            return [error] * len(requests)
        results: list[Result] = []
        for index, request in enumerate(requests):
            wanted = None if request.outputs is None else {o.name for o in request.outputs}
            tensors = [
                OutputTensor(name, self._output_types[name], split[index].shape, split[index])
                for name, split in pieces.items()
                if wanted is None or name in wanted
            ]
            results.append(
                InferResponse(request.model_name, str(request.model_version), request.id, tensors)
            )
        return results

    def _split_outputs(self, outputs: Any, sizes: list[int]) -> dict[str, list[np.ndarray]]:
        if not isinstance(outputs, dict):
            raise InternalError(
                f"model instance '{self._instance_name}': execute_batched must return a dict"
                f" of output arrays, not {type(outputs).__name__}"
            )
        total = sum(sizes)
        pieces = {}
        for name, value in outputs.items():
            array = np.asarray(value)
            if name not in self._output_types or array.ndim == 0 or array.shape[0] != total:
                raise InternalError(
                    f"model instance '{self._instance_name}': output '{name}' must be a declared"
                    f" output with {total} rows (the batch), got shape {list(array.shape)}"
                )
            pieces[name] = batchtensor.scatter(array, sizes)
        return pieces

    def finalize(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        if finalize is not None:
            finalize()

    def _to_pb(self, request: InferRequest) -> pb_utils.InferenceRequest:
        wanted = (
            [o.name for o in request.outputs] if request.outputs is not None else self._output_names
        )
        params = request.parameters
        pb_request = pb_utils.InferenceRequest(
            model_name=request.model_name,
            requested_output_names=wanted,
            inputs=[pb_utils.Tensor._wrap(t.name, t.data, t.datatype) for t in request.inputs],
            request_id=request.id,
            correlation_id=params.get("sequence_id", 0),
            parameters=params,
        )
        pb_request._origin = request
        return pb_request

    def _from_pb(self, request: InferRequest, response: Any) -> Result:
        if not isinstance(response, pb_utils.InferenceResponse):
            return InternalError(
                f"model instance '{self._instance_name}' returned {type(response).__name__},"
                " expected pb_utils.InferenceResponse"
            )
        if response.has_error():
            error = response.error()
            assert error is not None
            code = pb_utils.ERROR_CODES.get(
                error.code(), pb_utils.ERROR_CODES[pb_utils.TritonError.INTERNAL]
            )
            return error_for(code, error.message())
        wanted = None if request.outputs is None else {o.name for o in request.outputs}
        outputs = []
        for tensor in response.output_tensors():
            if wanted is not None and tensor.name() not in wanted:
                continue
            array = tensor.as_numpy()
            datatype = tensor.wire_datatype
            if datatype == "UINT16" and tensor.name() in self._bf16_outputs:
                datatype = "BF16"
            outputs.append(OutputTensor(tensor.name(), datatype, array.shape, array))
        return InferResponse(
            model_name=request.model_name,
            model_version=str(request.model_version),
            id=request.id,
            outputs=outputs,
            parameters=response.parameter_dict,
        )


def _describe(exc: BaseException) -> str:
    """``Type: message`` and the model's frames, in the layout Triton's Python backend uses:
    ``ValueError: boom\n\nAt:\n  /path/model.py(4): execute\n`` (innermost frame first)."""
    if isinstance(exc, TritonError):
        return exc.message
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # drop our own calling frame
    at = "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return f"{type(exc).__name__}: {exc}\n\nAt:\n{at}"
