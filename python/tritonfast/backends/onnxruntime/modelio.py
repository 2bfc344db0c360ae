"""An ONNX model's inputs and outputs against its configuration: auto-complete from the model,
and the load-time checks, with the rules and messages of Triton's ONNX Runtime backend
(docs/onnxruntime.md lists them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tritonfast._proto import model_config_pb2 as mc
from tritonfast.backends.onnxruntime.datatypes import ORT_TYPES, config_type
from tritonfast.errors import InternalError, InvalidArgumentError, UnsupportedError

log = logging.getLogger(__name__)

# Triton's default for --backend-config=onnxruntime,default-max-batch-size=N.
DEFAULT_MAX_BATCH_SIZE = 4


@dataclass(frozen=True, slots=True)
class ModelTensor:
    """One input or output as the model declares it."""

    name: str
    ort_type: str  # e.g. "tensor(float)"
    dims: tuple[int, ...]  # symbolic and unknown dimensions as -1


@dataclass(frozen=True, slots=True)
class ModelIO:
    inputs: tuple[ModelTensor, ...]
    outputs: tuple[ModelTensor, ...]
    # Graph inputs with an initializer (a default): a config may leave them out, or list them
    # as optional inputs.
    overridable: tuple[ModelTensor, ...] = ()


def _tensor(arg: Any) -> ModelTensor:
    if not str(arg.type).startswith("tensor("):
        raise UnsupportedError(
            f"Unsupported ONNX Type '{arg.type}' for I/O '{arg.name}', expected 'ONNX_TYPE_TENSOR'."
        )
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return ModelTensor(arg.name, arg.type, dims)


def model_io(session: Any) -> ModelIO:
    """The inputs and outputs of an ``onnxruntime.InferenceSession``."""
    return ModelIO(
        tuple(_tensor(a) for a in session.get_inputs()),
        tuple(_tensor(a) for a in session.get_outputs()),
        tuple(_tensor(a) for a in session.get_overridable_initializers()),
    )


def _shape_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


# -- auto-complete ----------------------------------------------------------------------------
def wants_completion(config: mc.ModelConfig) -> bool:
    """Whether auto-complete looks at the model: not when the config lists inputs and
    outputs both, as in Triton (which logs that it skips)."""
    if (config.input or config.batch_input) and config.output:
        log.info(
            "skipping model configuration auto-complete for '%s': inputs and outputs already"
            " specified",
            config.name,
        )
        return False
    return True


def auto_complete(config: mc.ModelConfig, io: ModelIO, default_max_batch_size: int) -> None:
    """Fill in ``config`` from the model, as Triton's backend does (when
    :func:`wants_completion`): ``max_batch_size`` (and dynamic batching) when every tensor's
    first dimension is variable, then the whole input list and/or the whole output list if it
    is empty (a partial list is left as written)."""
    _complete_max_batch(config, io, default_max_batch_size)
    if not config.input and not config.batch_input:
        _complete_tensors(config, config.input, io.inputs)
    if not config.output:
        _complete_tensors(config, config.output, io.outputs)


def _complete_max_batch(config: mc.ModelConfig, io: ModelIO, default_max_batch_size: int) -> None:
    batchable = all(t.dims and t.dims[0] == -1 for t in (*io.inputs, *io.outputs))
    if not batchable:
        if config.max_batch_size != 0:
            raise InvalidArgumentError(
                f"autofill failed for model '{config.name}': model does not support batching"
                " while non-zero max_batch_size is specified"
            )
        return
    if config.max_batch_size != 0:
        return
    config.max_batch_size = max(default_max_batch_size, 0)
    log.warning(
        "autofilled max_batch_size to %d for model '%s' since batching is supported but no"
        " max_batch_size is specified in model configuration. Must specify max_batch_size to"
        " utilize autofill with a larger max batch size",
        config.max_batch_size,
        config.name,
    )
    if (
        config.max_batch_size > 1
        and not config.HasField("dynamic_batching")
        and not config.HasField("sequence_batching")
    ):
        config.dynamic_batching.SetInParent()


def _complete_tensors(config: mc.ModelConfig, listed: Any, tensors: Sequence[ModelTensor]) -> None:
    batching = config.max_batch_size > 0
    for tensor in tensors:
        entry = listed.add()
        entry.name = tensor.name
        entry.data_type = config_type(tensor.ort_type)
        dims = tensor.dims[1:] if batching else tensor.dims
        if dims:
            entry.dims.extend(dims)
        else:
            entry.dims.append(1)
            if batching:
                entry.reshape.SetInParent()


# -- checks at load ---------------------------------------------------------------------------
def check(config: mc.ModelConfig, io: ModelIO) -> None:
    """Refuse a configuration that does not fit the model (Triton's messages)."""
    model = config.name
    required = [t for t in config.input if not t.optional]
    sequence = _sequence_inputs(config, io)
    expected = len(required) + len(config.batch_input) + len(sequence)
    if expected != len(io.inputs):
        raise InvalidArgumentError(
            f"unable to load model '{model}', configuration expects {expected} inputs, model"
            f" provides {len(io.inputs)}"
        )
    allowed_inputs = {t.name: t for t in (*io.inputs, *io.overridable)}
    for tensor in config.input:
        if tensor.optional and config.max_batch_size != 0:
            raise InvalidArgumentError(
                f"unable to load model '{model}', optional input '{tensor.name}' is not"
                " supported for models that support batching"
            )
        found = allowed_inputs.get(tensor.name)
        if found is None:
            raise InvalidArgumentError(
                f"unexpected inference input '{tensor.name}', allowed inputs are:"
                f" {', '.join(sorted(allowed_inputs))}"
            )
        _check_tensor(config, tensor, found, "input", exact=False)
    allowed_outputs = {t.name: t for t in io.outputs}
    for state in config.sequence_batching.state:
        if state.output_name not in allowed_outputs:
            raise InvalidArgumentError(
                f"unexpected inference output '{state.output_name}', allowed outputs are:"
                f" {', '.join(sorted(allowed_outputs))}"
            )
    for tensor in config.output:
        found = allowed_outputs.get(tensor.name)
        if found is None:
            raise InvalidArgumentError(
                f"unexpected inference output '{tensor.name}', allowed outputs are:"
                f" {', '.join(sorted(allowed_outputs))}"
            )
        _check_tensor(config, tensor, found, "output", exact=True)


def _sequence_inputs(config: mc.ModelConfig, io: ModelIO) -> list[str]:
    """The model inputs the sequence batcher fills in: its controls and implicit states
    (each must be a model input, as in Triton)."""
    names = {t.name for t in io.inputs}
    sequence = config.sequence_batching
    controls = [control.name for control in sequence.control_input]
    for name in controls:
        if name not in names:
            raise InternalError(
                f"configuration specified sequence control '{name}', but model does not"
                " provide that input"
            )
    states = [state.input_name for state in sequence.state]
    for name in states:
        if name not in names:
            raise InvalidArgumentError(
                f"unexpected inference input '{name}', allowed inputs are:"
                f" {', '.join(sorted(names))}"
            )
    return controls + states


def _check_tensor(
    config: mc.ModelConfig,
    tensor: mc.ModelInput | mc.ModelOutput,
    model_tensor: ModelTensor,
    kind: str,
    *,
    exact: bool,
) -> None:
    model = config.name
    type_name = mc.DataType.Name(tensor.data_type)
    wanted = ORT_TYPES.get(tensor.data_type)
    if wanted is None:
        raise InternalError(
            f"unsupported datatype {type_name} for {kind} '{tensor.name}' for model '{model}'"
        )
    if wanted != model_tensor.ort_type:
        provided = config_type(model_tensor.ort_type)
        provided_name = (
            "BYTES"
            if provided == mc.TYPE_STRING
            else mc.DataType.Name(provided).removeprefix("TYPE_")
        )
        raise InvalidArgumentError(
            f"unable to load model '{model}', configuration expects datatype {type_name} for"
            f" {kind} '{tensor.name}', model provides TYPE_{provided_name}"
        )
    dims = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)
    if not model_tensor.dims:
        if any(d != 1 for d in dims):
            raise InvalidArgumentError(
                f"unable to load model '{model}', scalar tensor '{tensor.name}', should only"
                " provide 1 in the model configuration when the model doesn't support"
                f" batching. Model configuration provided: {_shape_text(dims)}."
            )
        return
    _compare_dims(config, tensor.name, model_tensor.dims, dims, exact)


def _compare_dims(
    config: mc.ModelConfig,
    name: str,
    model_dims: tuple[int, ...],
    dims: tuple[int, ...],
    exact: bool,
) -> None:
    where = f"model '{config.name}', tensor '{name}'"
    if config.max_batch_size > 0:
        if not model_dims or model_dims[0] != -1:
            raise InvalidArgumentError(
                f"{where}: for the model to support batching the shape should have at least 1"
                " dimension and the first dimension must be -1; but shape expected by the"
                f" model is {_shape_text(model_dims)}"
            )
        full = (-1, *dims)
        if not _dims_fit(model_dims, full, exact):
            raise InvalidArgumentError(
                f"{where}: the model expects {len(model_dims)} dimensions (shape"
                f" {_shape_text(model_dims)}) but the model configuration specifies"
                f" {len(full)} dimensions (an initial batch dimension because max_batch_size"
                " > 0 followed by the explicit tensor shape, making complete shape"
                f" {_shape_text(full)})"
            )
    elif not _dims_fit(model_dims, dims, exact):
        raise InvalidArgumentError(
            f"{where}: the model expects {len(model_dims)} dimensions (shape"
            f" {_shape_text(model_dims)}) but the model configuration specifies {len(dims)}"
            f" dimensions (shape {_shape_text(dims)})"
        )


def _dims_fit(model_dims: tuple[int, ...], dims: tuple[int, ...], exact: bool) -> bool:
    if len(model_dims) != len(dims):
        return False
    return all(m == d for m, d in zip(model_dims, dims, strict=True) if exact or m != -1)
