"""The values a Python model exchanges with the server, as ``triton_python_backend_utils``
names them: tensors, responses, errors, flags and datatype helpers. :mod:`.pb_utils` is the
module models import, and gives these under the same names; they live apart so that the BLS
glue (:mod:`.bls`), which builds responses, needs nothing of ``pb_utils`` itself.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import numpy as np

from tritonfast.data import rawtensor
from tritonfast.data.datatypes import CONFIG_DATATYPES, NUMPY_DTYPES, WIRE_DATATYPES
from tritonfast.data.types import RELEASE_RESCHEDULE
from tritonfast.errors import Code

# Flags Triton exposes to models.
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = RELEASE_RESCHEDULE

# Config data type name -> numpy type, as the Python backend documents it (BOOL as Python's
# bool; BF16 has no numpy type and is left out).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    f"TYPE_{'STRING' if wire == 'BYTES' else wire}": bool if wire == "BOOL" else dtype.type
    for wire, dtype in NUMPY_DTYPES.items()
    if wire != "BF16"
}

# The numeric TRITONSERVER_DataType values (the config enum's numbers) by wire name and back.
_WIRE_TO_TRITON_ENUM: dict[str, int] = CONFIG_DATATYPES
_TRITON_ENUM_TO_WIRE: dict[int, str] = WIRE_DATATYPES
# numpy types for the enum values the Python backend's dtype helpers know (BF16 has none).
_TRITON_ENUM_TO_NUMPY: dict[int, Any] = {
    CONFIG_DATATYPES[wire]: dtype.type for wire, dtype in NUMPY_DTYPES.items() if wire != "BF16"
}
_NUMPY_TO_TRITON_ENUM: dict[Any, int] = {
    np.dtype(numpy_type): enum for enum, numpy_type in _TRITON_ENUM_TO_NUMPY.items()
}
# The wire datatype of an array of each of these dtypes: a Tensor of one needs no more checks.
_PLAIN_DTYPE_WIRE: dict[Any, str] = {
    dtype: _TRITON_ENUM_TO_WIRE[enum] for dtype, enum in _NUMPY_TO_TRITON_ENUM.items()
}


def triton_to_numpy_type(data_type: int) -> Any:
    return _TRITON_ENUM_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type is np.bytes_ or data_type is np.object_:
        return 13
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("S", "O"):
        return 13
    return _NUMPY_TO_TRITON_ENUM.get(dtype)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray | None:
    """Flatten a bytes/object tensor into Triton's length-prefixed layout (uint8 array)."""
    if input_tensor.size == 0:
        return np.empty(0, dtype=np.uint8)
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        raise TritonModelException("cannot serialize bytes tensor: invalid datatype")
    return np.frombuffer(rawtensor.serialize_bytes(input_tensor), dtype=np.uint8)


def deserialize_bytes_tensor(encoded_tensor: bytes | np.ndarray) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of bytes."""
    if isinstance(encoded_tensor, np.ndarray):  # viewed, not copied
        raw = np.ascontiguousarray(encoded_tensor).data.cast("B")
    else:
        raw = memoryview(encoded_tensor).cast("B")
    return rawtensor.bytes_array(rawtensor.split_bytes(raw))


class _ErrorCode(enum.IntEnum):
    """TritonError's codes: an enum, as in Triton's binding (``error.code().name``), and ints."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError:
    """An error a model attaches to a response (or raises as TritonModelException)."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = _ErrorCode.INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        """The code as the enum (an int too); a number outside it as it was given."""
        code = self._code
        return _ErrorCode(code) if code in _ErrorCode._value2member_map_ else code

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


# pb_utils.TritonError code -> the server's neutral Code.
ERROR_CODES: dict[int, Code] = {
    TritonError.UNKNOWN: Code.UNKNOWN,
    TritonError.INTERNAL: Code.INTERNAL,
    TritonError.NOT_FOUND: Code.NOT_FOUND,
    TritonError.INVALID_ARG: Code.INVALID_ARG,
    TritonError.UNAVAILABLE: Code.UNAVAILABLE,
    TritonError.UNSUPPORTED: Code.UNSUPPORTED,
    TritonError.ALREADY_EXISTS: Code.ALREADY_EXISTS,
    TritonError.CANCELLED: Code.CANCELLED,
}


class TritonModelException(Exception):
    """Raised by models (and by this module) to report a failure."""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        return self._msg


class Tensor:
    """A named tensor: a request input or a response output."""

    __slots__ = ("_array", "_name", "_wire_dtype")

    def __init__(self, name: str, numpy_array: Any, triton_dtype: int | str | None = None) -> None:
        if triton_dtype is None and type(name) is str and type(numpy_array) is np.ndarray:
            plain = _PLAIN_DTYPE_WIRE.get(numpy_array.dtype)
            if plain is not None:  # (a model's usual output: the checks below would pass)
                self._name = name
                self._array = numpy_array
                self._wire_dtype = plain
                return
        _argument("Tensor", "name", name, str)
        if numpy_array is None:
            raise TypeError("Tensor(): 'numpy_array' must be an array, not None")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        if array.dtype.type is np.str_ or array.dtype.kind == "V":
            raise TritonModelException(
                "Tensor dtype used for numpy_array is not supported by Python backend."
                " Please use np.object_ instead."
            )
        wire: str | None
        if triton_dtype is None:
            enum = numpy_to_triton_type(array.dtype)
            if enum is None:
                raise TritonModelException(
                    f"unsupported numpy dtype {array.dtype} for tensor '{name}'"
                )
            wire = _TRITON_ENUM_TO_WIRE[enum]
        else:
            wire = (
                triton_dtype
                if isinstance(triton_dtype, str)
                else _TRITON_ENUM_TO_WIRE.get(triton_dtype)
            )
            if wire is None:
                raise TritonModelException(f"unknown triton dtype {triton_dtype!r}")
            numpy_type = triton_to_numpy_type(_WIRE_TO_TRITON_ENUM[wire]) or np.uint16
            if wire != "BYTES" and array.dtype != np.dtype(numpy_type):
                array = array.view(numpy_type)  # reinterpret, as the Python backend does
        self._name = name
        self._array = array
        self._wire_dtype = wire

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, wire_dtype: str) -> Tensor:
        """Wrap a decoded input without re-deriving its datatype (hot path)."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._wire_dtype = wire_dtype
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        return _WIRE_TO_TRITON_ENUM[self._wire_dtype]

    @property
    def wire_datatype(self) -> str:
        """The protocol datatype name (tritonfast extension)."""
        return self._wire_dtype

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        if self._wire_dtype == "BYTES":
            raise TritonModelException("BYTES tensors cannot be exported with DLPack")
        try:
            return self._array.__dlpack__()
        except BufferError:
            # Read-only views (inputs decoded in place from the request body) can only be
            # exported with DLPack >= 1.0, which carries a read-only flag.
            return self._array.__dlpack__(max_version=(1, 0))

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        """A tensor over DLPack memory (an object with __dlpack__, or a raw capsule)."""
        try:
            if hasattr(capsule, "__dlpack__"):
                array = np.from_dlpack(capsule)
            else:
                array = np.from_dlpack(_CapsuleHolder(capsule))
        except (TypeError, ValueError, BufferError, RuntimeError) as error:
            raise TritonModelException(f"from_dlpack: not a DLPack tensor: {error}") from None
        return cls(name, array)

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._wire_dtype}, shape={list(self._array.shape)})"


class _CapsuleHolder:
    """Adapts a bare DLPack capsule to numpy's __dlpack__ protocol (CPU memory only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


class InferenceResponse:
    """A model's answer to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: list[Tensor] | tuple[Tensor, ...] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if type(output_tensors) is not list:  # (a model's own list is kept, not copied)
            _argument("InferenceResponse", "output_tensors", output_tensors, (list, tuple))
            output_tensors = list(output_tensors)
        for tensor in output_tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException("InferenceResponse: every output must be a Tensor")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(  # refused here, as Triton's binding refuses it
                f"InferenceResponse(): 'error' must be a TritonError, not {type(error).__name__}"
            )
        self._output_tensors = output_tensors
        self._error = error
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._parameters: dict[str, Any] = parameters or {}

    def output_tensors(self) -> list[Tensor]:
        return self._output_tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters, separators=(",", ":"))

    @property
    def parameter_dict(self) -> dict[str, Any]:
        return self._parameters


def _argument(function: str, name: str, value: Any, kinds: type | tuple[type, ...]) -> None:
    """TypeError for an argument of the wrong type, as Triton's (pybind11) binding raises."""
    if not isinstance(value, kinds) or (isinstance(value, bool) and kinds is int):
        raise TypeError(f"{function}(): '{name}' cannot be {type(value).__name__}")
