"""Tensor contents on the HTTP wire: JSON element lists and binary tensor data.

Numeric tensors travel in the binary extension as their raw little-endian bytes and are
viewed (``np.frombuffer``), never copied. BYTES tensors use Triton's layout: each element
is a 4-byte little-endian length followed by that many bytes. BF16 tensors are ``uint16``
arrays of raw bfloat16 bit patterns; in JSON they (and FP16) are plain numbers.
"""

from __future__ import annotations

import math
import struct
import sys
from typing import Any

import numpy as np

from tritonfast.errors import InvalidArgumentError
from tritonfast.runtime.types import ELEMENT_SIZES, NUMPY_DTYPES

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("tritonfast's HTTP codec assumes a little-endian host")

_LEN = struct.Struct("<I")
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


def element_count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


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


# -- BYTES ------------------------------------------------------------------------------------
def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's binary BYTES layout for ``array`` (elements in C order)."""
    parts: list[bytes] = []
    append = parts.append
    pack = _LEN.pack
    for item in array.reshape(-1):
        data = _as_bytes(item)
        append(pack(len(data)))
        append(data)
    return b"".join(parts)


def request_prefix(request_id: str) -> str:
    """How Triton's core starts messages about a request."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def deserialize_bytes(
    buf: memoryview, count: int, name: str, model: str, request_id: str = ""
) -> np.ndarray:
    """Split Triton's BYTES layout into a 1-D object array of exactly ``count`` bytes."""
    items: list[bytes] = []
    append = items.append
    unpack = _LEN.unpack_from
    end = len(buf)
    pos = 0
    while end - pos >= 4:
        if len(items) >= count:
            raise InvalidArgumentError(
                f"{request_prefix(request_id)}unexpected number of string elements"
                f" {len(items) + 1} for inference input '{name}' for model '{model}', expecting"
                f" {count}"
            )
        (length,) = unpack(buf, pos)
        pos += 4
        if length > end - pos:
            raise InvalidArgumentError(
                f"incomplete string data for inference input '{name}', expecting string of "
                f"length {length} but only {end - pos} bytes available"
            )
        append(buf[pos : pos + length].tobytes())
        pos += length
    if pos != end:
        raise InvalidArgumentError(
            f"{request_prefix(request_id)}element byte size indicator exceeds the end of the"
            " buffer."
        )
    if len(items) != count:
        raise InvalidArgumentError(
            f"{request_prefix(request_id)}expected {count} string elements for inference input"
            f" '{name}' for model '{model}', got {len(items)}"
        )
    out = np.empty(count, dtype=object)
    out[:] = items
    return out


# -- binary input -----------------------------------------------------------------------------
def from_binary(
    datatype: str,
    shape: tuple[int, ...],
    buf: memoryview,
    name: str,
    model: str,
    request_id: str = "",
) -> np.ndarray:
    """View (numeric) or split (BYTES) one input's binary data, shaped as ``shape``."""
    count = element_count(shape)
    if datatype == "BYTES":
        return deserialize_bytes(buf, count, name, model, request_id).reshape(shape)
    expected = count * ELEMENT_SIZES[datatype]
    if len(buf) != expected:
        raise InvalidArgumentError(
            f"{request_prefix(request_id)}input byte size mismatch for input '{name}' for model"
            f" '{model}'. "
            f"Expected {expected}, got {len(buf)}"
        )
    return np.frombuffer(buf, dtype=NUMPY_DTYPES[datatype], count=count).reshape(shape)


# -- JSON input -------------------------------------------------------------------------------
def _flatten(data: list[Any]) -> list[Any]:
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
    count = element_count(shape)
    if count == 0:
        # Triton never looks at 'data' for an empty tensor.
        return np.empty(shape, dtype=NUMPY_DTYPES[datatype])
    if type(data) is not list:
        raise InvalidArgumentError(
            "Unable to parse 'data': attempt to access JSON non-array as array"
        )
    flat = data
    kinds = set(map(type, flat))
    if list in kinds:
        flat = _flatten(data)
        kinds = set(map(type, flat))
    if datatype == "BYTES":
        if not kinds <= {str}:
            raise InvalidArgumentError(f"Unable to parse JSON bytes array: {_NOT_STRING}")
        out = np.empty(len(flat), dtype=object)
        out[:] = [s.encode("utf-8", "surrogateescape") for s in flat]
        if len(flat) != count:
            more = len(flat) > count
            prefix = request_prefix(request_id)
            raise InvalidArgumentError(
                f"{prefix}unexpected number of string elements {count + 1} for inference input"
                f" '{name}' for model '{model}', expecting {count}"
                if more
                else f"{prefix}expected {count} string elements for inference input '{name}'"
                f" for model '{model}', got {len(flat)}"
            )
        return out.reshape(shape)
    array = _numbers(datatype, flat, kinds, name)
    if len(flat) != count:
        raise InvalidArgumentError(_SHAPE_MISMATCH)
    return array.reshape(shape)


def _numbers(datatype: str, flat: list[Any], kinds: set[type], name: str) -> np.ndarray:
    dtype = NUMPY_DTYPES[datatype]
    try:
        if datatype == "BOOL":
            if not kinds <= {bool}:
                raise InvalidArgumentError(f"Unable to parse 'data': {_NOT_BOOL}")
            return np.array(flat, dtype=dtype)
        if datatype in _SIGNED:
            if not kinds <= {int}:
                raise InvalidArgumentError(f"Unable to parse 'data': {_NOT_INT}")
            # Narrowing wraps, as Triton's C casts do.
            return np.array(flat, dtype=np.int64).astype(dtype)
        if datatype in _UNSIGNED:
            if not kinds <= {int} or (flat and min(flat) < 0):
                raise InvalidArgumentError(f"Unable to parse 'data': {_NOT_UINT}")
            return np.array(flat, dtype=np.uint64).astype(dtype)
        if datatype in _FLOATS:
            if not kinds <= {int, float}:
                raise InvalidArgumentError(f"Unable to parse 'data': {_NOT_NUMBER}")
            with np.errstate(over="ignore", invalid="ignore"):
                values = np.array(flat, dtype=np.float64)
                if datatype == "BF16":
                    return float_to_bf16(values.astype(_F32))
                return values.astype(dtype)
    except OverflowError:
        message = _NOT_UINT if datatype in _UNSIGNED else _NOT_INT
        raise InvalidArgumentError(f"Unable to parse 'data': {message}") from None
    raise InvalidArgumentError(f"invalid datatype for input {name}")


# -- output -----------------------------------------------------------------------------------
def to_wire_array(datatype: str, data: np.ndarray) -> np.ndarray:
    """``data`` as a C-contiguous array of the datatype's numpy dtype (copies only if needed)."""
    dtype = NUMPY_DTYPES[datatype]
    if data.dtype != dtype or not data.flags.c_contiguous:
        data = np.ascontiguousarray(data, dtype=dtype)
    return data


def to_binary(datatype: str, data: np.ndarray) -> bytes | np.ndarray:
    """One output's bytes for the binary extension (a byte view for numeric tensors)."""
    if datatype == "BYTES":
        return serialize_bytes(np.asarray(data, dtype=object))
    return to_wire_array(datatype, data).reshape(-1).view(np.uint8)


def to_json(datatype: str, data: np.ndarray) -> Any:
    """One output's flat JSON ``data``: a 1-D array orjson writes natively, or a list."""
    if datatype == "BYTES":
        return [
            item.decode("utf-8", "replace") if isinstance(item, bytes) else _as_text(item)
            for item in np.asarray(data, dtype=object).reshape(-1)
        ]
    flat = to_wire_array(datatype, data).reshape(-1)
    if datatype == "BF16":
        flat = bf16_to_float(flat)
    if flat.dtype.kind == "f" and flat.dtype.itemsize < 8:
        # Write the exact value as a double, as Triton does, so any reader rounds it back.
        flat = flat.astype(np.float64)
    return flat


def _as_text(item: Any) -> str:
    if isinstance(item, str):
        return item
    return _as_bytes(item).decode("utf-8", "replace")
