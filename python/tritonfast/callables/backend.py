"""The backend that runs bound Python callables in the server's process.

A callable gets a list of :class:`~tritonfast.callables.request.Request` (one per request of
the batch) and returns a list of output dicts, one per request, PyTriton's contract (the
decorators of :mod:`.decorators` adapt other shapes of function to it). It may be an
``async def`` (run on the instance's own event loop) or, for a decoupled model, a generator
that yields such a list once per round of responses.

A callable is found through the model's config: the in-process ``Server`` serves bound models
from a generated repository (as PyTriton does) whose config.pbtxt names the callable by a key
of that server's bindings (``Backend.bound``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, InstancePlacement, ModelInstance, PhaseClock
from tritonfast.callables import decorators
from tritonfast.callables.errors import PyTritonUnrecoverableError
from tritonfast.callables.request import Request
from tritonfast.callables.spec import ModelConfig, Tensor
from tritonfast.data.datatypes import NUMPY_DTYPES, WIRE_DATATYPES
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import InternalError, UnavailableError
from tritonfast.runtime.responses import Result

log = logging.getLogger(__name__)

BACKEND_NAME = "tritonfast_callable"
KEY_PARAMETER = "TRITONFAST_CALLABLE"


@dataclass
class Binding:
    """A bound callable (or one per instance) and what its model promises."""

    name: str
    functions: list[Callable[..., Any]]
    inputs: list[Tensor]
    outputs: list[Tensor]
    config: ModelConfig
    strict: bool = False
    # Called with the error's text when a callable raises PyTritonUnrecoverableError.
    on_unrecoverable: Callable[[str], None] = lambda text: None
    extra: dict[str, Any] = field(default_factory=dict)


class CallableBackend(Backend):
    name = BACKEND_NAME

    def __init__(self, model_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        super().__init__(model_dir, settings)

    def binding(self, config: model_config_pb2.ModelConfig) -> Binding:
        key = config.parameters[KEY_PARAMETER].string_value
        found = self.bound.get(key)
        if not isinstance(found, Binding):
            raise UnavailableError(f"model '{config.name}': its callable is no longer bound")
        return found

    def validate(self, config: model_config_pb2.ModelConfig) -> None:
        self.binding(config)

    def runs_on_event_loop(self, config: model_config_pb2.ModelConfig) -> bool:
        return not config.model_transaction_policy.decoupled

    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        binding = self.binding(config)
        index = int(placement.name.rsplit("_", 1)[-1])
        function = binding.functions[index % len(binding.functions)]
        return CallableInstance(function, binding, config)


class CallableInstance(ModelInstance):
    def __init__(
        self,
        function: Callable[..., Any],
        binding: Binding,
        config: model_config_pb2.ModelConfig,
    ) -> None:
        self._function = function
        self._binding = binding
        self._batching = config.max_batch_size > 0
        self._decoupled = config.model_transaction_policy.decoupled
        self._outputs = {t.name: WIRE_DATATYPES[t.data_type] for t in config.output}
        self._output_dims = {t.name: tuple(t.dims) for t in config.output}
        self._coroutine = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
            getattr(function, "__call__", None)  # noqa: B004 - a callable object's method
        )
        self._generator = inspect.isgeneratorfunction(function)
        self._loop: asyncio.AbstractEventLoop | None = None
        spec = binding.config
        self._context = decorators.TritonModelConfig(
            binding.name,
            spec.batching,
            config.max_batch_size,
            spec.batcher if spec.batching else None,
            binding.inputs,
            binding.outputs,
            spec.decoupled,
            spec.response_cache,
        )
        # Plain functions may run on the event loop when short (runtime.looprun decides).
        self.may_run_on_event_loop = not (self._coroutine or self._generator or self._decoupled)

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        # The decorators read the calling model's configuration (generators run here too).
        decorators.calling(self._context)
        try:
            return self._execute(requests, clock)
        finally:
            decorators.calling(None)

    def _execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        inputs = [_request(r) for r in requests]
        clock.inputs_ready()
        if self._decoupled:
            self._stream(requests, inputs)
            return None
        try:
            returned = self._call(inputs)
            results: list[Result] = list(self._responses(requests, returned))
        except PyTritonUnrecoverableError as exc:
            text = _failure(exc)
            self._binding.on_unrecoverable(text)
            results = [InternalError(text)] * len(requests)
        except Exception as exc:
            results = [InternalError(_failure(exc))] * len(requests)
        clock.infer_done()
        return results

    def _call(self, inputs: list[Request]) -> Any:
        returned = self._awaited(self._function(inputs))
        if inspect.isgenerator(returned):  # a generator for a model that is not decoupled
            rounds = list(returned)
            if len(rounds) != 1:
                raise ValueError(
                    f"model `{self._binding.name}` is not decoupled: its callable must give one"
                    f" list of responses, it gave {len(rounds)}"
                )
            returned = rounds[0]
        return returned

    def _stream(self, requests: list[InferRequest], inputs: list[Request]) -> None:
        """A decoupled model: each round the callable yields is one response per request."""
        senders = [r.sender for r in requests]
        try:
            returned = self._function(inputs)
            rounds = returned if inspect.isgenerator(returned) else [self._awaited(returned)]
            for round_ in rounds:
                for sender, response in zip(
                    senders, self._responses(requests, round_), strict=True
                ):
                    sender.send(response, final=False)
        except PyTritonUnrecoverableError as exc:
            text = _failure(exc)
            self._binding.on_unrecoverable(text)
            for sender in senders:
                sender.send(InternalError(text), final=False)
        except Exception as exc:
            for sender in senders:
                sender.send(InternalError(_failure(exc)), final=False)
        for sender in senders:
            sender.send(None, final=True)

    def _awaited(self, returned: Any) -> Any:
        """What an ``async def`` callable gives, run on the instance's own loop."""
        if inspect.isawaitable(returned):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(returned)
        return returned

    def _responses(self, requests: list[InferRequest], returned: Any) -> list[InferResponse]:
        model = self._binding.name
        validate_outputs(model, returned, len(requests))
        responses = []
        for request, outputs in zip(requests, returned, strict=True):
            wanted = None if request.outputs is None else {o.name for o in request.outputs}
            tensors = []
            for name, value in outputs.items():
                datatype = self._outputs.get(name)
                if datatype is None:
                    if self._binding.strict:
                        raise ValueError(
                            f"Returned output `{name}` is not defined in model config for model"
                            f" `{model}`."
                        )
                    continue  # as Triton does with an output its config does not declare
                if self._binding.strict:
                    self._check_strictly(name, value)
                if wanted is not None and name not in wanted:
                    continue
                data = _wire_array(value, datatype)
                tensors.append(OutputTensor(name, datatype, data.shape, data))
            responses.append(
                InferResponse(request.model_name, str(request.model_version), request.id, tensors)
            )
        return responses

    def _check_strictly(self, name: str, value: np.ndarray) -> None:
        """PyTriton's strict checks of a returned output against the model's config."""
        model = self._binding.name
        expected = next(t for t in self._binding.outputs if t.name == name)
        datatype = self._outputs[name]
        if (value.dtype.kind not in "OSU" and value.dtype != NUMPY_DTYPES[datatype]) or (
            value.dtype.kind in "OSU" and datatype != "BYTES"
        ):
            raise ValueError(
                f"Returned output `{name}` for model `{model}` has invalid type. Returned:"
                f" {value.dtype} ({value.dtype.kind}). Expected: {expected.dtype}."
            )
        shape = value.shape[1:] if self._batching else value.shape
        dims = self._output_dims[name]
        if len(shape) != len(dims):
            raise ValueError(
                f"Returned output `{name}` for model `{model}` has invalid shapes. Returned:"
                f" {shape}. Expected: {tuple(expected.shape)}."
            )
        if any(x != y != -1 for x, y in zip(shape, dims, strict=True)):
            raise ValueError(
                f"Returned output `{name}` for model `{model}` has invalid shapes at one or more"
                f" positions. Returned: {shape}. Expected: {tuple(expected.shape)}."
            )

    def finalize(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def _request(request: InferRequest) -> Request:
    return Request(
        {t.name: t.data for t in request.inputs},
        parameters=dict(request.parameters),
        requested_output_names=(
            None if request.outputs is None else [o.name for o in request.outputs]
        ),
    )


def validate_outputs(model: str, returned: Any, count: int) -> None:
    """What a callable returned must be one dict of numpy arrays per request (PyTriton's
    checks and messages)."""
    if not isinstance(returned, list):
        raise ValueError(
            f"Outputs returned by `{model}` model callable must be list of response dicts with"
            f" numpy arrays. Got outputs={returned} instead."
        )
    if len(returned) != count:
        raise ValueError(
            f"Number of outputs returned by `{model}` inference callable ({len(returned)}) does"
            f" not match number of requests ({count}) received from Triton."
        )
    for response in returned:
        if not isinstance(response, dict):
            raise ValueError(
                f"Outputs returned by `{model}` model callable must be list of response dicts"
                f" with numpy arrays. Got response={response} instead."
            )
        for name, value in response.items():
            if not isinstance(name, str):
                raise ValueError(f"Not all keys returned by `{model}` model callable are string")
            if not isinstance(value, np.ndarray):
                raise ValueError(
                    f"Not all values returned by `{model}` model callable are numpy arrays"
                )
            if value.dtype.kind not in "biufOSU":
                raise ValueError(
                    "Only bool, numeric, string, unicode and object arrays are supported by"
                    f" Triton (dtype.kind: biufOSU). Returned `{name}` for model `{model}` has"
                    f" `{value.dtype.kind}` dtype.kind."
                )


def _wire_array(value: np.ndarray, datatype: str) -> np.ndarray:
    """A returned array as the wire carries it: BYTES as an object array of bytes; other
    types converted to the declared one (a no-op when they match)."""
    if datatype == "BYTES":
        if value.dtype.kind == "O":
            return value
        flat = value.ravel()
        items = [x.encode() if isinstance(x, str) else bytes(x) for x in flat.tolist()]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(value.shape)
    dtype = NUMPY_DTYPES[datatype]
    return value if value.dtype == dtype else value.astype(dtype)


def _failure(exc: BaseException) -> str:
    """A callable's exception as PyTriton reports it: the formatted traceback."""
    return "".join(traceback.format_exception(exc)).rstrip()
