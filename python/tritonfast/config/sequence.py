"""The ``sequence_batching`` section: Triton's checks (with its error texts) and defaults.

Checked at load, before any instance starts: control inputs (one tensor per kind, a name
used once, exactly one of ``int32_false_true`` / ``fp32_false_true`` / ``bool_false_true``
with two entries for START, END and READY, an integer or string ``data_type`` for CORRID),
the direct strategy's slot utilization, the oldest strategy's preferred sizes, and implicit
states (unique names, at most one ``initial_state`` whose type and fixed dims match the
state's, and whose ``data_file`` holds enough bytes).
"""

from __future__ import annotations

import math
from pathlib import Path

from tritonfast._proto.model_config_pb2 import DataType, ModelConfig, ModelSequenceBatching
from tritonfast.data.datatypes import NUMPY_DTYPES, WIRE_DATATYPES
from tritonfast.errors import InvalidArgumentError

# Triton's default max_sequence_idle_microseconds, filled in when the config leaves it 0.
DEFAULT_IDLE_US = 1_000_000

Control = ModelSequenceBatching.Control
_BOOLEAN_LISTS = ("int32_false_true", "fp32_false_true", "bool_false_true")
_CORRID_TYPES = (
    DataType.TYPE_UINT64,
    DataType.TYPE_INT64,
    DataType.TYPE_UINT32,
    DataType.TYPE_INT32,
    DataType.TYPE_STRING,
)


def validate_sequence_batching(config: ModelConfig, model_dir: Path) -> None:
    """Raise Triton's error for a ``sequence_batching`` section it would refuse."""
    if not config.HasField("sequence_batching"):
        return
    batching = config.sequence_batching
    model = config.name
    _validate_controls(batching, model)
    if batching.HasField("direct"):
        utilization = batching.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            raise InvalidArgumentError(
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] for "
                + model
            )
    if batching.HasField("oldest"):
        for size in batching.oldest.preferred_batch_size:
            if size <= 0:
                raise InvalidArgumentError(
                    f"sequence batching preferred batch size must be positive for {model}"
                )
            if size > config.max_batch_size:
                raise InvalidArgumentError(
                    f"sequence batching preferred batch size must be <= max batch size for {model}"
                )


def validate_sequence_states(config: ModelConfig, model_dir: Path) -> None:
    """Raise Triton's error for implicit states it would refuse (it fails the model's
    versions with these, where :func:`validate_sequence_batching`'s refuse the model while
    the repository is polled)."""
    if config.HasField("sequence_batching"):
        _validate_states(config.sequence_batching, model_dir)


def complete_sequence_batching(config: ModelConfig) -> None:
    """Triton's normalisation: the idle default, and the oldest strategy's preferred size."""
    if not config.HasField("sequence_batching"):
        return
    batching = config.sequence_batching
    if batching.max_sequence_idle_microseconds == 0:
        batching.max_sequence_idle_microseconds = DEFAULT_IDLE_US
    preferred = batching.oldest.preferred_batch_size
    if batching.HasField("oldest") and config.max_batch_size > 0 and not preferred:
        preferred.append(config.max_batch_size)


def _validate_controls(batching: ModelSequenceBatching, model: str) -> None:
    names: set[str] = set()
    kinds: set[int] = set()
    for control_input in batching.control_input:
        if not control_input.name:
            raise InvalidArgumentError(
                f"sequence batching control tensor must have a name for {model}"
            )
        if control_input.name in names or len(control_input.control) > 1:
            raise InvalidArgumentError(
                f"sequence batching control tensor '{control_input.name}' is specified for"
                f" multiple control kinds for {model}"
            )
        names.add(control_input.name)
        for control in control_input.control:
            kind = Control.Kind.Name(control.kind)
            if control.kind in kinds:
                raise InvalidArgumentError(
                    f"sequence batching specifies multiple {kind} tensors for {model}"
                )
            kinds.add(control.kind)
            given = [name for name in _BOOLEAN_LISTS if len(getattr(control, name)) > 0]
            if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                if given:
                    raise InvalidArgumentError(
                        "sequence batching must not specify either 'int32_false_true',"
                        " 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_CORRID"
                        f" for {model}"
                    )
                if control.data_type not in _CORRID_TYPES:
                    raise InvalidArgumentError(
                        "unexpected data type for control CONTROL_SEQUENCE_CORRID for"
                        f" {model}. Allowed data types are TYPE_UINT64, TYPE_INT64,"
                        " TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
                    )
                continue
            if not given:
                raise InvalidArgumentError(
                    "sequence batching must specify either 'int32_false_true',"
                    f" 'fp32_false_true' or 'bool_false_true' for {kind} for {model}"
                )
            if len(given) > 1:
                raise InvalidArgumentError(
                    "sequence batching specifies more than one from 'int32_false_true',"
                    f" 'fp32_false_true' and 'bool_false_true' for {kind} for {model}"
                )
            if len(getattr(control, given[0])) != 2:
                raise InvalidArgumentError(
                    f"sequence batching control '{given[0]}' must have exactly 2 entries for"
                    f" {kind} for {model}"
                )


def _validate_states(batching: ModelSequenceBatching, model_dir: Path) -> None:
    inputs: set[str] = set()
    for state in batching.state:
        name = state.input_name
        if name in inputs:
            raise InvalidArgumentError(f"State input name '{name}' specified more than once.")
        inputs.add(name)
        if len(state.initial_state) > 1:
            raise InvalidArgumentError(
                f"initial_state field for state input '{name}' must contain exactly one or zero"
                f" element. Found '{len(state.initial_state)}' elements."
            )
        for initial in state.initial_state:
            _validate_initial_state(state, initial, model_dir)


def _validate_initial_state(
    state: ModelSequenceBatching.State,
    initial: ModelSequenceBatching.InitialState,
    model_dir: Path,
) -> None:
    name = state.input_name
    if initial.data_type != state.data_type:
        raise InvalidArgumentError(
            f"The data type used for 'initial_state' field of state '{name}' does not match"
            " the state data type."
        )
    if not initial.name:
        raise InvalidArgumentError(
            f"Field 'name' must be set when using initial_state for state input '{name}'."
        )
    if len(initial.dims) != len(state.dims):
        raise InvalidArgumentError(
            f"Number of dimensions in 'initial_state' doesn't match the size of 'state'"
            f" dimensions for state input '{name}'. {len(initial.dims)} != {len(state.dims)}"
        )
    for initial_dim, state_dim in zip(initial.dims, state.dims, strict=True):
        if initial_dim == -1:
            raise InvalidArgumentError(
                f"'initial_state' field for state input name '{name}' contains variable dimensions."
            )
        if state_dim != -1 and initial_dim != state_dim:
            raise InvalidArgumentError(
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim"
                f" description. {initial_dim} != {state_dim}"
            )
    which = initial.WhichOneof("state_data")
    if which is None:
        raise InvalidArgumentError(
            f"initial_state setting expects state'{name}' to have state_data set"
        )
    if which == "data_file" and initial.data_type != DataType.TYPE_STRING:
        path = initial_state_path(model_dir, initial.data_file)
        itemsize = NUMPY_DTYPES[WIRE_DATATYPES[initial.data_type]].itemsize
        expected = math.prod(initial.dims) * itemsize
        found = path.stat().st_size if path.is_file() else 0
        if found < expected:
            raise InvalidArgumentError(
                f"initial_state setting expects {expected} bytes, but the data provided from"
                f" {initial.data_file}only has {found} bytes."
            )


def initial_state_path(model_dir: Path, data_file: str) -> Path:
    """Where an ``initial_state``'s ``data_file`` lives (as in Triton)."""
    return model_dir / "initial_state" / data_file
