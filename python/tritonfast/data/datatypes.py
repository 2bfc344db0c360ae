"""The one table of tensor datatypes, derived from ``inference.DataType`` (model_config.proto).

Each ``TYPE_<X>`` value has a wire name (``<X>``, except ``TYPE_STRING``, which travels as
``BYTES``) and a numpy dtype for its tensors. The enum's numbers are also the
``TRITONSERVER_DataType`` numbers the Python backend's ``triton_dtype()`` uses (BOOL 1 ...
BYTES 13, BF16 14).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonfast._proto import model_config_pb2


def _wire_name(enum_name: str) -> str:
    return "BYTES" if enum_name == "TYPE_STRING" else enum_name.removeprefix("TYPE_")


def _numpy_dtype(wire: str) -> np.dtype[Any]:
    """numpy has no bfloat16: BF16 tensors are uint16 arrays of the raw bits; BYTES tensors
    are object arrays whose elements are ``bytes``."""
    if wire == "BYTES":
        return np.dtype(np.object_)
    if wire == "BF16":
        return np.dtype(np.uint16)
    if wire.startswith("FP"):
        return np.dtype(f"float{wire[2:]}")
    return np.dtype(wire.lower())  # bool, uint8 ... int64


# Config enum value -> wire name, for every datatype but TYPE_INVALID.
WIRE_DATATYPES: dict[int, str] = {
    value: _wire_name(name)
    for name, value in model_config_pb2.DataType.items()
    if value != model_config_pb2.TYPE_INVALID
}
# Wire name -> config enum value.
CONFIG_DATATYPES: dict[str, int] = {wire: value for value, wire in WIRE_DATATYPES.items()}
# Wire name -> numpy dtype.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    wire: _numpy_dtype(wire) for wire in WIRE_DATATYPES.values()
}
