"""Tensor contents in HTTP's JSON: element lists in, element lists out.

Data Triton cannot read ("Unable to parse 'data': ...") is an INTERNAL error (500), as
Triton answers it.

Binary tensor data needs nothing HTTP-specific: :mod:`tritonfast.data.rawtensor` reads
and writes it. What is left here is JSON's: numbers and strings with TritonJson's type
rules, nested lists flattened, and BF16 (``uint16`` bit patterns) shown as plain numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.errors import InternalError, InvalidArgumentError
from tritonfast.frontends.http.jsonparse import TensorNumbers

_F32 = np.dtype(np.float32)
_U16 = np.dtype(np.uint16)
_U32 = np.dtype(np.uint32)

_SIGNED = frozenset(("INT8", "INT16", "INT32", "INT64"))
_UNSIGNED = frozenset(("UINT8", "UINT16", "UINT32", "UINT64"))
_FLOATS = frozenset(("FP16", "FP32", "FP64", "BF16"))

# TritonJson's messages when a JSON value has the wrong type.
_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_NUMBER = "attempt to access JSON non-number as double"
_NOT_STRING = "attempt to access JSON non-string as string"
_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"


# -- bfloat16 ---------------------------------------------------------------------------------
def float_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float values to bfloat16 (nearest, ties to even); return the uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype=_F32).view(_U32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    out = rounded.astype(_U16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = (bits[nan] >> 16).astype(_U16) | np.uint16(0x0040)  # keep NaNs quiet
    return out


def bf16_to_float(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32 values, exactly."""
    return (np.asarray(bits, dtype=_U16).astype(_U32) << 16).view(_F32)


# -- JSON input -------------------------------------------------------------------------------
def flatten(data: list[Any]) -> list[Any]:
    """The elements of nested lists, in order."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def from_json(
    datatype: str,
    shape: tuple[int, ...],
    data: Any,
    name: str,
    model: str,
    request_id: str = "",
) -> np.ndarray:
    """Build one input's array from its JSON ``data`` (flat or nested in any way)."""
    count = rawtensor.element_count(shape, name, model, request_id)
    if count == 0:
        # Triton never looks at 'data' for an empty tensor.
        return np.empty(shape, dtype=NUMPY_DTYPES[datatype])
    if type(data) is TensorNumbers:
        parsed = _parsed_numbers(datatype, data)
        if parsed is not None:
            if parsed.size != count:
                raise InternalError(_SHAPE_MISMATCH)
            return parsed.reshape(shape)
        data = data.as_list()  # not plain numbers of the datatype's kind: the rules below
    if type(data) is not list:
        raise InternalError("Unable to parse 'data': attempt to access JSON non-array as array")
    flat = data
    kinds = set(map(type, flat))
    if list in kinds:
        flat = flatten(data)
        kinds = set(map(type, flat))
    if datatype == "BYTES":
        if not kinds <= {str}:
            raise InternalError(f"Unable to parse JSON bytes array: {_NOT_STRING}")
        items = [s.encode("utf-8", "surrogateescape") for s in flat]
        if len(items) != count:
            raise rawtensor.string_count_error(name, model, request_id, count, len(items))
        return rawtensor.bytes_array(items).reshape(shape)
    array = _numbers(datatype, flat, kinds, name)
    if len(flat) != count:
        raise InternalError(_SHAPE_MISMATCH)
    return array.reshape(shape)


def _parsed_numbers(datatype: str, data: TensorNumbers) -> np.ndarray | None:
    """:func:`_numbers` for a large request's data left in its bytes: the same values, parsed
    without the GIL; None when they are not all numbers of the datatype's kind."""
    dtype = NUMPY_DTYPES[datatype]
    if datatype in _FLOATS:
        values = data.numbers("f64")
        if values is None:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            if datatype == "BF16":
                return float_to_bf16(values.astype(_F32))
            return values.astype(dtype, copy=False)
    kind = "i64" if datatype in _SIGNED else "u64" if datatype in _UNSIGNED else None
    if kind is None:  # BOOL and BYTES: the general path
        return None
    values = data.numbers(kind)
    # Narrowing wraps, as Triton's C casts do.
    return None if values is None else values.astype(dtype, copy=False)


def _numbers(datatype: str, flat: list[Any], kinds: set[type], name: str) -> np.ndarray:
    dtype = NUMPY_DTYPES[datatype]
    try:
        if datatype == "BOOL":
            if not kinds <= {bool}:
                raise InternalError(f"Unable to parse 'data': {_NOT_BOOL}")
            return np.array(flat, dtype=dtype)
        if datatype in _SIGNED:
            if not kinds <= {int}:
                raise InternalError(f"Unable to parse 'data': {_NOT_INT}")
            # Narrowing wraps, as Triton's C casts do.
            return np.array(flat, dtype=np.int64).astype(dtype)
        if datatype in _UNSIGNED:
            if not kinds <= {int} or (flat and min(flat) < 0):
                raise InternalError(f"Unable to parse 'data': {_NOT_UINT}")
            return np.array(flat, dtype=np.uint64).astype(dtype)
        if datatype in _FLOATS:
            if not kinds <= {int, float}:
                raise InternalError(f"Unable to parse 'data': {_NOT_NUMBER}")
            with np.errstate(over="ignore", invalid="ignore"):
                values = np.array(flat, dtype=np.float64)
                if datatype == "BF16":
                    return float_to_bf16(values.astype(_F32))
                return values.astype(dtype)
    except OverflowError:
        message = _NOT_UINT if datatype in _UNSIGNED else _NOT_INT
        raise InternalError(f"Unable to parse 'data': {message}") from None
    raise InvalidArgumentError(f"invalid datatype for input {name}")


# -- output -----------------------------------------------------------------------------------
def to_json(datatype: str, data: np.ndarray) -> Any:
    """One output's flat JSON ``data``: a 1-D array orjson writes natively, or a list."""
    if datatype == "BYTES":
        return [
            item.decode("utf-8", "replace") if isinstance(item, bytes) else _as_text(item)
            for item in np.asarray(data, dtype=object).reshape(-1)
        ]
    flat = rawtensor.wire_array(datatype, data).reshape(-1)
    if datatype == "BF16":
        flat = bf16_to_float(flat)
    if flat.dtype.kind == "f" and flat.dtype.itemsize < 8:
        # Write the exact value as a double, as Triton does, so any reader rounds it back.
        flat = flat.astype(np.float64)
    return flat


def _as_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    return rawtensor.element_bytes(item).decode("utf-8", "replace")
