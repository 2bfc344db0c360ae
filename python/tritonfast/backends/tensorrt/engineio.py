"""A TensorRT engine's inputs and outputs as plain data, and the rules that need only that:
datatypes, optimization-profile selection, the batch size the profiles allow, request shapes
against a profile. Nothing here imports TensorRT; :func:`describe` reads an engine through the
TensorRT 10 API (``num_io_tensors``, ``get_tensor_*``) by duck typing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonfast._proto import model_config_pb2 as mc

Shape = tuple[int, ...]

# TensorRT DataType names -> config datatypes (TYPE_INVALID for those Triton cannot carry).
CONFIG_TYPES: dict[str, int] = {
    "FLOAT": mc.TYPE_FP32,
    "HALF": mc.TYPE_FP16,
    "BF16": mc.TYPE_BF16,
    "INT8": mc.TYPE_INT8,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "BOOL": mc.TYPE_BOOL,
    "UINT8": mc.TYPE_UINT8,
}


@dataclass(frozen=True, slots=True)
class Profile:
    """One optimization profile's shapes for one input: (min, opt, max)."""

    min: Shape
    opt: Shape
    max: Shape

    def fits(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= d <= hi for d, lo, hi in zip(shape, self.min, self.max, strict=True)
        )


@dataclass(frozen=True, slots=True)
class EngineTensor:
    name: str
    is_input: bool
    dtype: str  # TensorRT DataType name, e.g. "FLOAT"
    shape: Shape  # -1 for a dimension fixed only at run time
    profiles: tuple[Profile, ...] = ()  # inputs: one per optimization profile
    shape_tensor: bool = False
    on_host: bool = False  # TensorRT reads or writes it in host memory
    linear: bool = True  # a plain row-major layout (not a vectorized format)

    @property
    def config_type(self) -> int:
        return CONFIG_TYPES.get(self.dtype, mc.TYPE_INVALID)


@dataclass(frozen=True, slots=True)
class EngineIO:
    tensors: tuple[EngineTensor, ...]
    profile_count: int = 1

    @property
    def inputs(self) -> list[EngineTensor]:
        return [t for t in self.tensors if t.is_input]

    @property
    def outputs(self) -> list[EngineTensor]:
        return [t for t in self.tensors if not t.is_input]

    def tensor(self, name: str) -> EngineTensor | None:
        for tensor in self.tensors:
            if tensor.name == name:
                return tensor
        return None


def describe(engine: Any) -> EngineIO:
    """The I/O of a deserialized ``tensorrt.ICudaEngine`` (TensorRT 10 API)."""
    import tensorrt as trt

    profile_count = int(engine.num_optimization_profiles)
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        profiles: tuple[Profile, ...] = ()
        if is_input:
            profiles = tuple(
                Profile(*(tuple(s) for s in engine.get_tensor_profile_shape(name, p)))
                for p in range(profile_count)
            )
        tensors.append(
            EngineTensor(
                name,
                is_input,
                engine.get_tensor_dtype(name).name,
                tuple(engine.get_tensor_shape(name)),
                profiles,
                bool(engine.is_shape_inference_io(name)),
                engine.get_tensor_location(name) == trt.TensorLocation.HOST,
                engine.get_tensor_format(name) == trt.TensorFormat.LINEAR,
            )
        )
    return EngineIO(tuple(tensors), profile_count)


def profile_max_batch(io: EngineIO, profile: int) -> int:
    """The largest batch profile ``profile`` allows every input: the smallest maximum first
    dimension over the inputs (Triton's rule; it does not ask whether that dimension is a
    batch)."""
    firsts = [t.profiles[profile].max[0] for t in io.inputs if t.profiles[profile].max]
    return min(firsts) if firsts else 0


def max_batch_size(io: EngineIO, profiles: Sequence[int] = ()) -> int:
    """The largest batch over ``profiles`` (profile 0 when none are listed), as Triton's
    TensorRT backend auto-completes it."""
    return max((profile_max_batch(io, p) for p in (list(profiles) or [0])), default=0)


def select_profile(
    io: EngineIO, shapes: Mapping[str, Shape], allowed: Sequence[int] = ()
) -> int | None:
    """The profile for a batch whose inputs have ``shapes`` (full shapes, batch dimension
    included), as Triton picks it: of the ``allowed`` profiles (all when none are listed)
    whose ranges hold every shape, the one whose optimal shapes are nearest (Manhattan
    distance; the lower index on a tie). None when no profile holds them."""
    best: tuple[int, int] | None = None
    for index in list(allowed) or range(io.profile_count):
        distance = 0
        for tensor in io.inputs:
            shape = shapes.get(tensor.name)
            if shape is None or tensor.shape_tensor:
                continue
            profile = tensor.profiles[index]
            if not profile.fits(shape):
                break
            distance += sum(abs(d - o) for d, o in zip(shape, profile.opt, strict=True))
        else:
            if best is None or distance < best[0]:
                best = (distance, index)
    return None if best is None else best[1]


def shape_error(tensor: EngineTensor, profile: int, shape: Shape) -> str:
    """Why ``shape`` does not fit ``tensor`` in ``profile``: Triton's error details."""
    limits = tensor.profiles[profile]
    if len(shape) != len(limits.min):
        return f"model expected {len(limits.min)} dimensions but received {len(shape)} dimensions"
    for index, (d, lo, hi) in enumerate(zip(shape, limits.min, limits.max, strict=True)):
        if not lo <= d <= hi:
            return (
                f"model expected the shape of dimension {index} to be between {lo} and {hi}"
                f" but received {d}"
            )
    return "the shape fits"


def shape_text(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"
