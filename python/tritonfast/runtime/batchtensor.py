"""One tensor for a whole batch: requests' inputs concatenated, outputs split back as views.

For any backend whose model takes whole-batch tensors (:func:`gather_inputs`,
:func:`scatter_outputs`).

The concatenation is a copy the Rust core makes into a pooled buffer with the GIL released
(so the event loop and other instances keep running), and the buffer goes back to the pool
when the last numpy view of it dies. Splitting an output is free: each request gets a view.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import InternalError
from tritonfast.memory.bufferpool import POOL


def gather(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` (same dtype and non-batch dimensions) concatenated along dimension 0: one
    array or arrays that already lie back to back (a batch the core laid out in its segment)
    as they are, others copied."""
    first = arrays[0]
    shape = (sum(a.shape[0] for a in arrays), *first.shape[1:])
    if first.dtype.hasobject:  # BYTES elements are references, not bytes to copy
        return np.concatenate(arrays)
    if len(arrays) == 1:
        return first
    if _back_to_back(arrays):
        return np.lib.stride_tricks.as_strided(first, shape, first.strides, writeable=False)
    parts = [np.ascontiguousarray(a) for a in arrays]
    buffer: Any = POOL.gather(parts)
    return np.asarray(buffer).view(first.dtype).reshape(shape)


def _back_to_back(arrays: list[np.ndarray]) -> bool:
    """Whether ``arrays`` are contiguous views of one buffer, each starting where the one
    before it ends (then one view of the first spans them all: the buffer outlives it)."""
    owner = _owner(arrays[0])
    if owner is None:
        return False
    end = arrays[0].__array_interface__["data"][0]
    for array in arrays:
        if not array.flags.c_contiguous or _owner(array) is not owner:
            return False
        if array.__array_interface__["data"][0] != end:
            return False
        end += array.nbytes
    return True


def _owner(array: np.ndarray) -> Any:
    """The object whose memory ``array`` views (None: the array owns its memory)."""
    owner: Any = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    if isinstance(owner, memoryview):
        owner = owner.obj
    return None if owner is array else owner


def scatter(batched: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """``batched`` split along dimension 0 into pieces of ``sizes`` rows (views, no copy)."""
    pieces = []
    start = 0
    for size in sizes:
        pieces.append(batched[start : start + size])
        start += size
    return pieces


def gather_inputs(requests: list[InferRequest]) -> tuple[dict[str, np.ndarray], list[int]]:
    """A batch's inputs as whole-batch arrays, ``{name: array}``, each request's rows in
    request order, and how many rows each request holds. The batcher keeps a batch's input
    names and non-batch dimensions uniform."""
    sizes = [r.inputs[0].shape[0] if r.inputs else 0 for r in requests]
    names = [t.name for t in requests[0].inputs]
    inputs = {
        name: gather([_input_data(r, i, name) for r in requests]) for i, name in enumerate(names)
    }
    return inputs, sizes


def _input_data(request: InferRequest, index: int, name: str) -> Any:
    """Input ``name`` of ``request``, usually at ``index`` (clients may list a batch's inputs
    in different orders)."""
    inputs = request.inputs
    if index < len(inputs) and inputs[index].name == name:
        return inputs[index].data
    for tensor in inputs:
        if tensor.name == name:
            return tensor.data
    raise InternalError(f"a request of the batch has no input '{name}'")


def scatter_outputs(
    outputs: Mapping[str, Any],
    sizes: list[int],
    requests: list[InferRequest],
    datatypes: Mapping[str, str],
    instance_name: str,
) -> list[InferResponse]:
    """Whole-batch outputs, ``{name: array}``, split back into one response per request (each
    output a view of its rows), keeping only the outputs a request asked for. ``datatypes``
    maps every declared output to its wire datatype. Raises InternalError for an output that
    is not declared or does not hold the batch's rows."""
    if not isinstance(outputs, Mapping):
        raise InternalError(
            f"model instance '{instance_name}': the whole-batch outputs must be a dict of"
            f" arrays, not {type(outputs).__name__}"
        )
    total = sum(sizes)
    pieces = {}
    for name, value in outputs.items():
        array = np.asarray(value)
        if name not in datatypes or array.ndim == 0 or array.shape[0] != total:
            raise InternalError(
                f"model instance '{instance_name}': output '{name}' must be a declared"
                f" output with {total} rows (the batch), got shape {list(array.shape)}"
            )
        pieces[name] = scatter(array, sizes)
    responses = []
    for index, request in enumerate(requests):
        wanted = None if request.outputs is None else {o.name for o in request.outputs}
        tensors = [
            OutputTensor(name, datatypes[name], split[index].shape, split[index])
            for name, split in pieces.items()
            if wanted is None or name in wanted
        ]
        responses.append(
            InferResponse(request.model_name, str(request.model_version), request.id, tensors)
        )
    return responses
