"""Triton's classification extension: an output requested with a ``classification`` count K
comes back as its top K elements, as BYTES ``"<value>:<index>"`` (``":<label>"`` added when the
output has a ``label_filename``), highest value first, ties in index order.

Values print as C prints them (``%f`` for floating point, e.g. ``0.700000``; integers as they
are). A batching model's output is classified per batch element (shape ``[batch, K]``),
another's as a whole (shape ``[K]``); K above the element count gives them all. A count of 0
leaves the output as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tritonfast.data.types import InferResponse, OutputTensor, RequestedOutput
from tritonfast.errors import InvalidArgumentError

# An output's labels by name (None: it has no label file).
Labels = Callable[[str], list[str] | None]


def wants_classification(outputs: list[RequestedOutput] | None) -> bool:
    return outputs is not None and any(o.parameters.get("classification") for o in outputs)


def classify(
    response: InferResponse,
    outputs: list[RequestedOutput],
    labels: Labels,
    batched: bool,
) -> None:
    """Replace each output asked for with a classification count by its top K (in place)."""
    counts = {o.name: int(o.parameters.get("classification") or 0) for o in outputs}
    for position, tensor in enumerate(response.outputs):
        count = counts.get(tensor.name, 0)
        if count > 0:
            response.outputs[position] = _top(tensor, count, labels(tensor.name), batched)


def _top(tensor: OutputTensor, count: int, labels: list[str] | None, batched: bool) -> OutputTensor:
    data = np.asarray(tensor.data)
    if data.dtype.kind not in "biuf" or tensor.datatype == "BF16":
        raise InvalidArgumentError(
            f"class result not available for output '{tensor.name}' due to unsupported type"
            f" '{tensor.datatype}'"
        )
    rows = data.reshape(data.shape[0], -1) if batched and data.ndim > 0 else data.reshape(1, -1)
    floating = data.dtype.kind == "f"
    results = [_row(row, count, labels, floating) for row in rows]
    width = len(results[0]) if results else 0
    shape = (len(results), width) if batched and data.ndim > 0 else (width,)
    text = np.array([item for row in results for item in row], dtype=object).reshape(shape)
    return OutputTensor(tensor.name, "BYTES", shape, text)


def _row(values: np.ndarray, count: int, labels: list[str] | None, floating: bool) -> list[bytes]:
    numbers = values.tolist()
    order = sorted(range(len(numbers)), key=lambda i: -numbers[i])[:count]
    items = []
    for index in order:
        value = "%f" % numbers[index] if floating else str(int(numbers[index]))  # noqa: UP031
        label = f":{labels[index]}" if labels is not None and index < len(labels) else ""
        items.append(f"{value}:{index}{label}".encode())
    return items
