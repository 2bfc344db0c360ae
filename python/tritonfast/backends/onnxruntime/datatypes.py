"""ONNX Runtime's tensor types (``NodeArg.type``, e.g. ``"tensor(float)"``) and the model
configuration's ``TYPE_*`` values, both ways, as Triton's ONNX Runtime backend maps them.

BF16 has no numpy type ORT's Python API takes, so a model with bfloat16 inputs or outputs is
refused (see docs/onnxruntime.md).
"""

from __future__ import annotations

from tritonfast._proto import model_config_pb2 as mc

# ORT type string -> config datatype.
CONFIG_TYPES: dict[str, int] = {
    "tensor(bool)": mc.TYPE_BOOL,
    "tensor(uint8)": mc.TYPE_UINT8,
    "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32,
    "tensor(uint64)": mc.TYPE_UINT64,
    "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16,
    "tensor(int32)": mc.TYPE_INT32,
    "tensor(int64)": mc.TYPE_INT64,
    "tensor(float16)": mc.TYPE_FP16,
    "tensor(float)": mc.TYPE_FP32,
    "tensor(double)": mc.TYPE_FP64,
    "tensor(string)": mc.TYPE_STRING,
}
# Config datatype -> ORT type string.
ORT_TYPES: dict[int, str] = {value: ort for ort, value in CONFIG_TYPES.items()}


def config_type(ort_type: str) -> int:
    """The config datatype of an ORT type string; TYPE_INVALID for one tritonfast cannot
    serve (bfloat16, sequences, maps, optional types)."""
    return CONFIG_TYPES.get(ort_type, mc.TYPE_INVALID)


def config_type_name(value: int) -> str:
    return mc.DataType.Name(value)
