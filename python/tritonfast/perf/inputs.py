"""The tensors each request carries: shapes from the model's metadata and ``--shape``, values
zero, random or from a JSON file in perf_analyzer's input-data format."""

from __future__ import annotations

import base64
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritonfast.data.datatypes import NUMPY_DTYPES
from tritonfast.perf.server import ModelInfo, TensorSpec


class InputError(ValueError):
    """The model's inputs cannot be filled as asked; the text says which input and why."""


@dataclass(frozen=True)
class Tensor:
    """One input of one request: numbers as an array, BYTES as a list of byte strings."""

    name: str
    datatype: str
    shape: list[int]
    values: np.ndarray | list[bytes]


def request_shapes(
    model: ModelInfo, batch_size: int, shapes: dict[str, list[int]], variable: bool = False
) -> dict[str, list[int]]:
    """Each input's shape in a request, the batch dimension first for a batching model;
    ``variable``: a variable dimension may stay -1 (each data entry gives its shape)."""
    known = {spec.name for spec in model.inputs}
    for name in shapes:
        if name not in known:
            raise InputError(f"--shape names {name!r}, which is not an input of {model.name!r}")
    if model.max_batch_size == 0 and batch_size > 1:
        raise InputError(f"{model.name!r} does not support batching: -b must be 1")
    if model.max_batch_size and batch_size > model.max_batch_size:
        raise InputError(
            f"-b {batch_size} is above {model.name!r}'s max_batch_size of {model.max_batch_size}"
        )
    resolved = {}
    for spec in model.inputs:
        dims = spec.shape[1:] if model.max_batch_size else spec.shape
        given = shapes.get(spec.name)
        if given is not None:
            if len(given) != len(dims) or any(
                d not in (-1, g) for d, g in zip(dims, given, strict=True)
            ):
                raise InputError(
                    f"--shape {spec.name}:{','.join(map(str, given))} does not fit the input's"
                    f" shape {dims}"
                )
            dims = given
        elif any(d < 0 for d in dims) and not variable:
            raise InputError(
                f"input {spec.name!r} has a variable shape {dims}: give it with"
                f" --shape {spec.name}:<dims>"
            )
        resolved[spec.name] = [batch_size, *dims] if model.max_batch_size else list(dims)
    return resolved


def generated(
    model: ModelInfo,
    shapes: dict[str, list[int]],
    kind: str,
    string_length: int,
    string_data: str | None,
    seed: int = 0,
) -> list[list[Tensor]]:
    """One request's inputs, zero or random (perf_analyzer's ``--input-data zero|random``)."""
    random = np.random.default_rng(seed)
    tensors = []
    for spec in model.inputs:
        shape = shapes[spec.name]
        count = int(np.prod(shape))
        if spec.datatype == "BYTES":
            tensors.append(
                Tensor(
                    spec.name,
                    "BYTES",
                    shape,
                    _strings(count, kind, string_length, string_data, random),
                )
            )
            continue
        dtype = _numpy_type(spec)
        if kind == "zero":
            values = np.zeros(shape, dtype)
        elif np.issubdtype(dtype, np.floating):
            values = random.random(shape).astype(dtype)
        elif dtype == np.bool_:
            values = random.integers(0, 2, shape).astype(np.bool_)
        else:
            info = np.iinfo(dtype)
            values = random.integers(
                max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype, endpoint=True
            )
        tensors.append(Tensor(spec.name, spec.datatype, shape, values))
    return [tensors]


def _strings(
    count: int, kind: str, length: int, fixed: str | None, random: np.random.Generator
) -> list[bytes]:
    if fixed is not None:
        return [fixed.encode()] * count
    if kind == "zero":
        return [b""] * count
    letters = np.frombuffer((string.ascii_letters + string.digits).encode(), np.uint8)
    return [letters[random.integers(0, len(letters), length)].tobytes() for _ in range(count)]


def _numpy_type(spec: TensorSpec) -> Any:
    try:
        return NUMPY_DTYPES[spec.datatype].type
    except KeyError:
        raise InputError(
            f"input {spec.name!r}: datatype {spec.datatype} is not supported"
        ) from None


def from_file(
    model: ModelInfo, shapes: dict[str, list[int]], path: Path, batch_size: int
) -> list[list[list[Tensor]]]:
    """Streams of requests from a JSON file in perf_analyzer's format: ``{"data": [{input:
    values}, ...]}`` (one stream), or ``{"data": [[...], [...]]}`` (a sequence model's streams);
    values a flat or nested list, ``{"content": [...], "shape": [...]}`` or ``{"b64": "..."}``.
    Each entry is one request; an entry holding one batch's row is repeated ``-b`` times."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"--input-data {path}: {e}") from None
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputError(f'--input-data {path}: expected {{"data": [ {{...}}, ... ]}}')
    streams = entries if isinstance(entries[0], list) else [entries]
    return [_stream(model, shapes, path, batch_size, stream) for stream in streams]


def _stream(
    model: ModelInfo,
    shapes: dict[str, list[int]],
    path: Path,
    batch_size: int,
    entries: list[dict[str, Any]],
) -> list[list[Tensor]]:
    requests = []
    for index, entry in enumerate(entries):
        tensors = []
        for spec in model.inputs:
            if spec.name not in entry:
                raise InputError(f"--input-data {path}: entry {index} has no input {spec.name!r}")
            tensors.append(
                _from_entry(
                    spec,
                    entry[spec.name],
                    shapes[spec.name],
                    model,
                    batch_size,
                    f"{path} entry {index}",
                )
            )
        requests.append(tensors)
    return requests


def _from_entry(
    spec: TensorSpec, value: Any, shape: list[int], model: ModelInfo, batch_size: int, where: str
) -> Tensor:
    if isinstance(value, dict) and "shape" in value:
        given = [int(d) for d in value["shape"]]
        shape = [batch_size, *given] if model.max_batch_size else given
    if any(d < 0 for d in shape):
        raise InputError(
            f"--input-data {where}: input {spec.name!r} has a variable shape: give it with"
            f' --shape or with "content" and "shape" in each entry'
        )
    if isinstance(value, dict) and "b64" in value:
        if spec.datatype == "BYTES":
            raise InputError(f"--input-data {where}: b64 data is for non-BYTES inputs")
        flat = np.frombuffer(base64.b64decode(value["b64"]), _numpy_type(spec))
    else:
        content = value["content"] if isinstance(value, dict) else value
        if spec.datatype == "BYTES":
            strings = [
                s.encode() if isinstance(s, str) else json.dumps(s).encode()
                for s in np.ravel(np.array(content, dtype=object))
            ]
            return Tensor(spec.name, "BYTES", shape, _batched(strings, shape, where, spec.name))
        flat = np.asarray(content, dtype=_numpy_type(spec)).ravel()
    values = np.asarray(
        _batched(list(flat), shape, where, spec.name), dtype=_numpy_type(spec)
    ).reshape(shape)
    return Tensor(spec.name, spec.datatype, shape, values)


def _batched(flat: list[Any], shape: list[int], where: str, name: str) -> list[Any]:
    """The values for the whole request: as given, or one batch row repeated."""
    total = int(np.prod(shape))
    if len(flat) == total:
        return flat
    if shape and total and len(flat) * shape[0] == total:
        return flat * shape[0]
    raise InputError(
        f"--input-data {where}: input {name!r} has {len(flat)} values,"
        f" the shape {shape} needs {total}"
    )


def streams(
    model: ModelInfo,
    batch_size: int,
    shapes_given: dict[str, list[int]],
    input_data: str,
    string_length: int,
    string_data: str | None,
) -> list[list[list[Tensor]]]:
    """The requests' inputs, as streams of requests (one stream but for a sequence model's
    input-data file)."""
    if not model.inputs:
        raise InputError(f"model {model.name!r} has no inputs")
    if input_data in ("zero", "random"):
        shapes = request_shapes(model, batch_size, shapes_given)
        return [generated(model, shapes, input_data, string_length, string_data)]
    shapes = request_shapes(model, batch_size, shapes_given, variable=True)
    return from_file(model, shapes, Path(input_data), batch_size)
