"""A TensorRT model's configuration against its engine: auto-complete and the load-time
checks, with the rules and messages of Triton's TensorRT backend (docs/tensorrt.md). Pure
logic over :class:`~tritonfast.backends.tensorrt.engineio.EngineIO`: tested without a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tritonfast._proto import model_config_pb2 as mc
from tritonfast.backends.tensorrt.engineio import (
    CONFIG_TYPES,
    EngineIO,
    EngineTensor,
    max_batch_size,
    shape_error,
    shape_text,
)
from tritonfast.errors import InternalError, InvalidArgumentError

log = logging.getLogger(__name__)

KIND_GPU = mc.ModelInstanceGroup.KIND_GPU
_TRT_TYPES = frozenset(CONFIG_TYPES.values())


def profiles_of(config: mc.ModelConfig, io: EngineIO | None = None) -> list[int]:
    """The optimization profiles the instance groups name (each once, in order)."""
    chosen: list[int] = []
    for group in config.instance_group:
        for text in group.profile:
            try:
                index = int(text)
            except ValueError:
                raise InvalidArgumentError(f"unable to parse '{text}'") from None
            if index < 0 or (io is not None and index >= io.profile_count):
                count = io.profile_count if io is not None else 0
                raise InternalError(
                    f"unable to autofill for '{config.name}', configuration specified invalid"
                    f" profile {text} . Number of profiles supported by TensorRT engine: {count}"
                )
            if index not in chosen:
                chosen.append(index)
    return chosen


def _dims(tensor: mc.ModelInput | mc.ModelOutput) -> tuple[int, ...]:
    return tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)


# -- auto-complete ----------------------------------------------------------------------------
def auto_complete(config: mc.ModelConfig, io: EngineIO) -> None:
    """Fill in ``config`` from the engine as Triton's backend does (only when the first
    instance group is a GPU group): ``max_batch_size`` from the profiles, dynamic batching,
    and the inputs and outputs (a listed entry is completed, a missing one is not added
    unless its whole list is empty)."""
    if not config.instance_group or config.instance_group[0].kind != KIND_GPU:
        return
    computed = _batching_from_engine(config, io)
    if config.max_batch_size == 0:
        config.max_batch_size = computed
    elif config.max_batch_size > computed:
        raise InternalError(
            f"autofill failed for model '{config.name}': configuration specified max-batch"
            f" {config.max_batch_size} but TensorRT engine only supports max-batch {computed}"
        )
    if (
        config.max_batch_size > 1
        and not config.HasField("dynamic_batching")
        and not config.HasField("sequence_batching")
    ):
        config.dynamic_batching.SetInParent()
    _complete_tensors(config, config.input, io.inputs)
    _complete_tensors(config, config.output, io.outputs)


def _batching_from_engine(config: mc.ModelConfig, io: EngineIO) -> int:
    hint: bool | None = None
    any_dims = False
    for entry in (*config.input, *config.output):
        dims = _dims(entry)
        tensor = io.tensor(entry.name)
        if tensor is None or not dims:
            continue
        any_dims = True
        should_batch = len(tensor.shape) == len(dims) + 1
        if should_batch or entry_is_ragged(entry):
            if hint is False:
                _contradiction(config)
            hint = True
        elif hint is True:
            _contradiction(config)
        else:
            hint = False
    computed = max_batch_size(io, profiles_of(config, io))
    if any_dims and not hint:
        log.warning(
            "The specified dimensions in model config for %s hints that batching is unavailable",
            config.name,
        )
        return 0
    if hint and computed == 0:
        raise InternalError(
            f"autofill failed for model '{config.name}': model tensor shape configuration hints"
            " for dynamic batching but the underlying engine doesn't support batching."
        )
    return computed


def entry_is_ragged(entry: mc.ModelInput | mc.ModelOutput) -> bool:
    return bool(getattr(entry, "allow_ragged_batch", False))


def _contradiction(config: mc.ModelConfig) -> None:
    raise InternalError(
        f"unable to autofill for '{config.name}', model tensor configurations are contradicting"
        " each other in terms of whether batching is supported"
    )


def _complete_tensors(config: mc.ModelConfig, listed: Any, tensors: Sequence[EngineTensor]) -> None:
    skip_first = config.max_batch_size != 0
    if not listed:
        for tensor in tensors:
            _fill(listed.add(), tensor, skip_first, name=True)
        return
    by_name = {t.name: t for t in tensors}
    for entry in listed:
        found = by_name.get(entry.name)
        if found is None:
            raise InvalidArgumentError(f"binding for '{entry.name}' not found in the model.")
        _fill(entry, found, skip_first, name=False)


def _fill(entry: Any, tensor: EngineTensor, skip_first: bool, *, name: bool) -> None:
    if name:
        entry.name = tensor.name
    if entry.data_type == mc.TYPE_INVALID:
        entry.data_type = tensor.config_type
    if not entry.dims:
        dims = tensor.shape[1:] if skip_first else tensor.shape
        if dims:
            entry.dims.extend(dims)
        else:
            entry.dims.append(1)
            entry.reshape.SetInParent()
    if tensor.shape_tensor:
        entry.is_shape_tensor = True


# -- checks at load ---------------------------------------------------------------------------
def check(config: mc.ModelConfig, io: EngineIO, instance: str) -> None:
    """Refuse a configuration that does not fit the engine (Triton's messages)."""
    model = config.name
    _refuse_unsupported(config, io)
    if len(config.input) > len(io.inputs):
        raise InvalidArgumentError(
            f"unable to load model '{model}', configuration expects {len(config.input)} inputs,"
            f" model provides at most {len(io.inputs)}"
        )
    profiles = profiles_of(config, io) or [0]
    for kind, listed, tensors in (
        ("input", config.input, io.inputs),
        ("output", config.output, io.outputs),
    ):
        by_name = {t.name: t for t in tensors}
        for entry in listed:
            tensor = by_name.get(entry.name)
            if tensor is None:
                raise InvalidArgumentError(
                    f"unexpected inference {kind} '{entry.name}', allowed {kind}s are:"
                    f" {', '.join(sorted(by_name))}"
                )
            _check_entry(config, entry, tensor, kind, instance, profiles)
        configured = {entry.name for entry in listed}
        if kind == "input":  # the sequence batcher fills these in
            configured |= _sequence_inputs(config, by_name)
        else:
            configured |= _state_outputs(config, by_name)
        for tensor in tensors:
            if tensor.name not in configured:
                raise InvalidArgumentError(
                    f"expected configuration for {kind} '{tensor.name}' for {instance}"
                )


def _refuse_unsupported(config: mc.ModelConfig, io: EngineIO) -> None:
    """What this backend does not run yet, refused at load with the reason."""
    model = config.name
    for tensor in io.tensors:
        if tensor.shape_tensor or tensor.on_host:
            raise InvalidArgumentError(
                f"model '{model}': shape tensor '{tensor.name}' is not supported by tritonfast's"
                " TensorRT backend yet"
            )
        if not tensor.linear:
            raise InvalidArgumentError(
                f"model '{model}': tensor '{tensor.name}' has a vectorized (non-linear) format,"
                " which tritonfast's TensorRT backend does not support"
            )
    for entry in config.input:
        if entry.optional:
            raise InvalidArgumentError(
                f"model '{model}': optional input '{entry.name}' is not supported by the"
                " TensorRT backend"
            )
        if entry.allow_ragged_batch:
            raise InvalidArgumentError(
                f"model '{model}': ragged input '{entry.name}' is not supported by tritonfast's"
                " TensorRT backend yet"
            )


def _sequence_inputs(config: mc.ModelConfig, inputs: dict[str, EngineTensor]) -> set[str]:
    """The sequence batcher's control and state inputs, each an engine input."""
    sequence = config.sequence_batching
    names = [control.name for control in sequence.control_input]
    names += [state.input_name for state in sequence.state]
    for name in names:
        if name not in inputs:
            raise InternalError(
                f"configuration specified sequence control '{name}', but model does not"
                " provide that input"
            )
    return set(names)


def _state_outputs(config: mc.ModelConfig, outputs: dict[str, EngineTensor]) -> set[str]:
    """The implicit states' outputs, each an engine output."""
    names = {state.output_name for state in config.sequence_batching.state}
    for name in sorted(names):
        if name not in outputs:
            raise InvalidArgumentError(
                f"unexpected inference output '{name}', allowed outputs are:"
                f" {', '.join(sorted(outputs))}"
            )
    return names


def _check_entry(
    config: mc.ModelConfig,
    entry: mc.ModelInput | mc.ModelOutput,
    tensor: EngineTensor,
    kind: str,
    instance: str,
    profiles: list[int],
) -> None:
    model = config.name
    type_name = mc.DataType.Name(entry.data_type)
    if entry.data_type not in _TRT_TYPES:
        raise InternalError(
            f"unsupported datatype{type_name} for {kind} '{entry.name}' for model '{model}'"
        )
    if tensor.shape_tensor != bool(entry.is_shape_tensor):
        marked = "doesn't mark it as a shape tensor" if tensor.shape_tensor else None
        raise InternalError(
            f"{kind} '{entry.name}' for model '{model}' is a shape tensor but the model"
            f" configuration {marked}."
            if marked
            else f"{kind} '{entry.name}' for model '{model}' is incorrectly marked as a shape"
            " tensor in the model configuration."
        )
    if tensor.config_type != entry.data_type:
        engine_type = mc.DataType.Name(tensor.config_type)
        raise InvalidArgumentError(
            f"unexpected datatype {engine_type} for inference {kind} '{entry.name}', expecting"
            f" {type_name} for {instance}"
        )
    dims = _dims(entry)
    _compare_dims(config, entry.name, tensor.shape, dims)
    if kind == "input" and not tensor.shape_tensor:
        full = ((-1,) if config.max_batch_size > 0 else ()) + dims
        for profile in profiles:
            probe = tuple(
                d if d != -1 else tensor.profiles[profile].min[i] for i, d in enumerate(full)
            )
            if not tensor.profiles[profile].fits(probe):
                raise InvalidArgumentError(
                    f"model configuration specified invalid shape for input '{entry.name}' for"
                    f" model {model}. Error details: {shape_error(tensor, profile, probe)}"
                )


def _compare_dims(
    config: mc.ModelConfig, name: str, engine: tuple[int, ...], dims: tuple[int, ...]
) -> None:
    where = f"model '{config.name}', tensor '{name}'"
    if config.max_batch_size > 0:
        if not engine:
            raise InvalidArgumentError(
                f"{where}: for the model to support batching the shape should have at least 1"
                f" dimension; but shape expected by the model is {shape_text(engine)}"
            )
        full = (-1, *dims)
        if not _fits(engine, full):
            raise InvalidArgumentError(
                f"{where}: the model expects {len(engine)} dimensions (shape"
                f" {shape_text(engine)}) but the model configuration specifies {len(full)}"
                " dimensions (an initial batch dimension because max_batch_size > 0 followed"
                f" by the explicit tensor shape, making complete shape {shape_text(full)})"
            )
    elif not _fits(engine, dims):
        raise InvalidArgumentError(
            f"{where}: the model expects {len(engine)} dimensions (shape {shape_text(engine)})"
            f" but the model configuration specifies {len(dims)} dimensions (shape"
            f" {shape_text(dims)})"
        )


def _fits(engine: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """Same rank, and equal wherever neither side is -1."""
    if len(engine) != len(dims):
        return False
    return all(e == d for e, d in zip(engine, dims, strict=True) if e != -1 and d != -1)
