"""The protocol-neutral request and response that travel from a codec to a backend and back.

Codecs turn wire bytes into these objects (tensor data as numpy arrays, viewed over the
wire buffer where the protocol allows) and turn responses back into wire bytes. Nothing
here knows about HTTP, gRPC or a particular backend.

Tensor data conventions:
- numeric tensors are numpy arrays of the datatype's numpy dtype, C-contiguous, already
  shaped;
- BYTES tensors are numpy ``object`` arrays whose elements are ``bytes``;
- BF16 tensors are ``uint16`` arrays holding the raw bfloat16 bit patterns (numpy has no
  bfloat16), which is why every tensor carries its Triton ``datatype`` string too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Triton wire datatype -> numpy dtype. BYTES is an object array of bytes.
NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),
    "BYTES": np.dtype(np.object_),
}

# Byte size of one element of each fixed-size datatype (BYTES has none).
ELEMENT_SIZES: dict[str, int] = {
    name: dtype.itemsize for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"
}


def datatype_of(array: np.ndarray) -> str:
    """The Triton datatype for a numpy array (object/str/bytes arrays are BYTES)."""
    kind = array.dtype
    if kind.kind in ("O", "S", "U"):
        return "BYTES"
    for name, dtype in NUMPY_DTYPES.items():
        if dtype == kind and name != "BF16":
            return name
    raise ValueError(f"unsupported numpy dtype {kind}")


@dataclass(slots=True)
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its wire parameters (e.g. ``binary_data``)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" selects the model's default version
    id: str = ""
    inputs: list[InputTensor] = field(default_factory=list)
    # None means "every output the model produces".
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # Set when the caller went away after the request had started running; models see it
    # through pb_utils InferenceRequest.is_cancelled().
    cancelled: bool = False
    # Set by codecs when an input or requested output names a shared-memory region (its
    # parameters say where); such inputs arrive with empty data for the data plane to fill.
    uses_shared_memory: bool = False
    # A tracing.RequestTrace when this request is traced (every layer stamps it), else None.
    trace: Any = None


@dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)
    # Already written into the client's shared memory: the response carries metadata only.
    in_shared_memory: bool = False


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[OutputTensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
