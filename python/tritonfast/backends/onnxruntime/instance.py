"""One instance of an ONNX model: its own ``InferenceSession``, running a whole batch as one
``session.run``.

A batch's inputs are concatenated by the Rust core into pooled buffers with the GIL released
(:mod:`tritonfast.runtime.batchtensor`); ``session.run`` releases the GIL too, so instances,
the frontends and the event loop run beside it. Each request gets its rows of the outputs
back as views. BYTES tensors cross as Python strings (ORT's Python API takes and returns
``str``), so their elements must be UTF-8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import ModelInstance, PhaseClock
from tritonfast.data.datatypes import WIRE_DATATYPES
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError
from tritonfast.runtime.batchtensor import gather_inputs, scatter_outputs
from tritonfast.runtime.responses import Result

# How ORT's Python exceptions begin: "[ONNXRuntimeError] : <code> : <CODE NAME> : <message>".
_ORT_ERROR = re.compile(r"^\[ONNXRuntimeError\] : (\d+) : [A-Z_]+ : (.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """How one configured tensor crosses between the wire and the session."""

    name: str
    datatype: str  # wire datatype
    strings: bool  # BYTES: str elements for ORT, bytes on the wire
    # The shape to give the tensor on its way in (inputs: the model's, from ``reshape``;
    # outputs: the configured ``dims``), without the batch dimension; None: as it is.
    reshape: tuple[int, ...] | None


def tensor_plan(
    tensor: model_config_pb2.ModelInput | model_config_pb2.ModelOutput, is_input: bool
) -> TensorPlan:
    datatype = WIRE_DATATYPES[tensor.data_type]
    reshape = None
    if tensor.HasField("reshape"):
        reshape = tuple(tensor.reshape.shape) if is_input else tuple(tensor.dims)
    return TensorPlan(tensor.name, datatype, datatype == "BYTES", reshape)


def ort_error(exc: Exception) -> TritonError:
    """An exception from ``session.run`` worded as Triton's ONNX Runtime backend words it:
    "onnx runtime error <code>: <message>"."""
    text = str(exc).strip()
    match = _ORT_ERROR.match(text)
    if match is not None:
        return InternalError(f"onnx runtime error {match.group(1)}: {match.group(2)}")
    return InternalError(f"onnx runtime error: {text}")


class OnnxInstance(ModelInstance):
    def __init__(
        self, session: Any, config: model_config_pb2.ModelConfig, instance_name: str
    ) -> None:
        self._session = session
        self._name = instance_name
        self._batching = config.max_batch_size > 0
        self._inputs = {t.name: tensor_plan(t, True) for t in config.input}
        self._outputs = [tensor_plan(t, False) for t in config.output]
        # Implicit state: the sequence batcher asks for the next state by its output name.
        for state in config.sequence_batching.state:
            datatype = WIRE_DATATYPES[state.data_type]
            self._outputs.append(TensorPlan(state.output_name, datatype, datatype == "BYTES", None))
        self._output_types = {plan.name: plan.datatype for plan in self._outputs}
        self._plans = {plan.name: plan for plan in self._outputs}
        self._all_outputs = [plan.name for plan in self._outputs]

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        if not self._batching:
            return [self._run_one(request, clock) for request in requests]
        try:
            batch, sizes = gather_inputs(requests)
            rows = sum(sizes)
            feeds = {
                name: self._feed(array, self._input_plan(name, array), rows)
                for name, array in batch.items()
            }
            clock.inputs_ready()
            names = self._wanted(requests)
            produced = self._run(names, feeds)
            clock.infer_done()
            outputs = {
                name: self._fetched(array, self._plans[name], rows)
                for name, array in zip(names, produced, strict=True)
            }
            return list(scatter_outputs(outputs, sizes, requests, self._output_types, self._name))
        except TritonError as error:
            return [error] * len(requests)

    def _run_one(self, request: InferRequest, clock: PhaseClock) -> Result:
        try:
            feeds = {
                t.name: self._feed(t.data, self._input_plan(t.name, t.data), None)
                for t in request.inputs
            }
            clock.inputs_ready()
            names = self._wanted([request])
            produced = self._run(names, feeds)
            clock.infer_done()
            tensors = []
            for name, array in zip(names, produced, strict=True):
                plan = self._plans[name]
                data = self._fetched(array, plan, None)
                tensors.append(OutputTensor(name, plan.datatype, data.shape, data))
        except TritonError as error:
            return error
        return InferResponse(request.model_name, str(request.model_version), request.id, tensors)

    def _run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return list(self._session.run(names, feeds))
        except Exception as exc:  # ORT raises its own exception types, all Exceptions
            raise ort_error(exc) from None

    def _input_plan(self, name: str, data: np.ndarray) -> TensorPlan:
        """A configured input's plan; the sequence batcher's controls and states go in as
        they are."""
        plan = self._inputs.get(name)
        if plan is None:
            plan = TensorPlan(name, "", data.dtype.hasobject, None)
        return plan

    def _wanted(self, requests: list[InferRequest]) -> list[str]:
        """The outputs any request of the batch asked for, in config order."""
        wanted: set[str] = set()
        for request in requests:
            if request.outputs is None:
                return self._all_outputs
            wanted.update(o.name for o in request.outputs)
        return [name for name in self._all_outputs if name in wanted]

    @staticmethod
    def _feed(array: np.ndarray, plan: TensorPlan, rows: int | None) -> np.ndarray:
        if plan.strings:
            array = _to_strings(array, plan.name)
        if plan.reshape is not None:
            shape = plan.reshape if rows is None else (rows, *plan.reshape)
            array = array.reshape(shape)
        return array

    @staticmethod
    def _fetched(array: np.ndarray, plan: TensorPlan, rows: int | None) -> np.ndarray:
        if plan.strings:
            array = _to_bytes(array)
        if plan.reshape is not None:
            array = array.reshape(plan.reshape if rows is None else (rows, *plan.reshape))
        return array

    def finalize(self) -> None:
        self._session = None


def _to_strings(array: np.ndarray, name: str) -> np.ndarray:
    """BYTES elements as the ``str`` ORT's Python API takes."""
    flat = array.ravel()
    try:
        texts = [item if isinstance(item, str) else bytes(item).decode() for item in flat]
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(
            f"input '{name}': BYTES elements must be UTF-8 text for ONNX Runtime in tritonfast"
            f" ({exc})"
        ) from None
    out = np.empty(len(texts), dtype=object)
    out[:] = texts
    return out.reshape(array.shape)


def _to_bytes(array: np.ndarray) -> np.ndarray:
    flat = array.ravel()
    out = np.empty(len(flat), dtype=object)
    out[:] = [item.encode() if isinstance(item, str) else bytes(item) for item in flat]
    return out.reshape(array.shape)
