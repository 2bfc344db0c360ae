"""The JSON form of a model configuration, as Triton's HTTP config endpoint returns it.

Triton renders ``ModelConfig`` with protobuf field names, enum names and every scalar field
(defaults included). 64-bit integers come out as protobuf's JSON has them, strings, except in
the fields Triton turns back into numbers (:data:`NUMERIC_INT64`: tensor dims and reshapes,
versions, queue delays and timeouts, ensemble step versions, warmup dims); so a state's
``dims`` reads ``["1"]`` while an input's reads ``[1]``, as in Triton. The same dict is what
Python models see (``args['model_config']``, auto-complete).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from tritonfast.errors import InvalidArgumentError

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


# The 64-bit fields Triton writes as JSON numbers (by their path of field names from the
# ModelConfig; a map's values and a list's items are on their field's path).
NUMERIC_INT64 = frozenset(
    {
        ("input", "dims"),
        ("input", "reshape", "shape"),
        ("output", "dims"),
        ("output", "reshape", "shape"),
        ("version_policy", "specific", "versions"),
        ("dynamic_batching", "max_queue_delay_microseconds"),
        ("dynamic_batching", "priority_levels"),
        ("dynamic_batching", "default_priority_level"),
        ("dynamic_batching", "default_queue_policy", "default_timeout_microseconds"),
        ("dynamic_batching", "priority_queue_policy", "default_timeout_microseconds"),
        ("sequence_batching", "max_sequence_idle_microseconds"),
        ("sequence_batching", "state", "dims"),
        ("sequence_batching", "oldest", "max_queue_delay_microseconds"),
        ("sequence_batching", "direct", "max_queue_delay_microseconds"),
        ("ensemble_scheduling", "step", "model_version"),
        ("model_warmup", "inputs", "dims"),
    }
)


def config_to_json(message: Message, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Render a protobuf message (normally a ModelConfig) as Triton's JSON dict; ``path``:
    where ``message`` lies in the ModelConfig."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        where = (*path, field.name)
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {  # JSON keys are strings (priority_queue_policy's are numbers)
                str(key): _scalar_or_message(value_field, item, where)
                for key, item in value.items()
            }
        elif _is_repeated(field):
            out[field.name] = [_scalar_or_message(field, item, where) for item in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if message.HasField(field.name):
                out[field.name] = config_to_json(value, where)
        elif field.containing_oneof is not None:
            if message.WhichOneof(field.containing_oneof.name) == field.name:
                out[field.name] = _scalar_or_message(field, value, where)
        else:
            out[field.name] = _scalar_or_message(field, value, where)
    return out


def json_to_config(data: dict[str, Any], message: Message) -> Message:
    """Fill ``message`` from a JSON dict (numbers or strings for 64-bit ints both accepted)."""
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        raise InvalidArgumentError(f"failed to parse model configuration JSON: {exc}") from exc
    return message


def _scalar_or_message(field: FieldDescriptor, value: Any, where: tuple[str, ...]) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return config_to_json(value, where)
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if field.type in _INT64_TYPES:
        return int(value) if where in NUMERIC_INT64 else str(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.decode("latin-1")
    return value


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 6.31 deprecates ``label`` in favour of ``is_repeated``.
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == FieldDescriptor.LABEL_REPEATED


def _is_map(field: FieldDescriptor) -> bool:
    return (
        _is_repeated(field)
        and field.type == FieldDescriptor.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
    )
