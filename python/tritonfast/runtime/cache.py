"""The response cache (``--cache-config local,size=BYTES``; per model ``response_cache
{ enable: true }``): identical requests are answered from memory without running the model.

A request's key is a digest of what determines its response, as Triton keys its cache: the
model's name and version, and each input's name, datatype, shape and bytes (in the request's
order), plus the outputs asked for. Only successful responses of single-response models are
kept. The cache holds at most ``size`` bytes, shared by every model that uses it, counting what
each entry really costs: its output bytes, and the memory around them (key, entry, arrays,
names, parameters), so even answers with no output bytes fill it. The least recently used
responses are evicted first. A response larger than the whole cache is not kept.

A model's output arrays are copied once into the cache when kept, and made read-only there;
each hit gets response objects of its own over those arrays (nothing downstream writes into
an answer's arrays).
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from tritonfast.data import rawtensor
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import InvalidArgumentError

# What an entry costs besides its output bytes, as Python allocates it (upper bounds of what
# tracemalloc measures; tests/unit/test_response_cache_memory.py keeps them so): the entry with
# its slot in the LRU order and its key ...
ENTRY_COST = 360
# ... and each output's tensor object, array header, name and shape.
OUTPUT_COST = 280


@dataclass(frozen=True, slots=True)
class _Entry:
    outputs: tuple[OutputTensor, ...]
    parameters: dict[str, object] | None
    cost: int


def parse_cache_config(values: list[str]) -> int | None:
    """The local cache's size in bytes from ``--cache-config`` values (``local,size=N``;
    tritonserver's other spelling ``local,size,N`` too), or None when no cache is asked for."""
    size: int | None = None
    for value in values:
        name, _, setting = value.partition(",")
        if name != "local":
            raise InvalidArgumentError(
                f"unsupported cache '{name}': tritonfast has the 'local' cache only"
            )
        key, _, number = setting.replace(",", "=", 1).partition("=")
        if key != "size" or not number.isdigit():
            raise InvalidArgumentError(f"--cache-config expects local,size=BYTES, got '{value}'")
        size = int(number)
    return size


class ResponseCache:
    """An LRU cache of responses, bounded by the bytes of their output data; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self.evictions = 0

    @staticmethod
    def key(model: str, version: str, request: InferRequest) -> bytes:
        digest = hashlib.blake2b(digest_size=20)
        described = [model, version]
        for tensor in request.inputs:
            described += (tensor.name, tensor.datatype, str(tensor.shape))
            raw = rawtensor.to_raw(tensor.datatype, tensor.data)
            digest.update(raw if isinstance(raw, bytes) else raw.data)
        if request.outputs is not None:
            described += (o.name for o in request.outputs)
        digest.update("\0".join(described).encode())
        return digest.digest()

    def get(self, key: bytes, request: InferRequest) -> InferResponse | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
        outputs = [OutputTensor(o.name, o.datatype, o.shape, o.data) for o in entry.outputs]
        parameters = dict(entry.parameters) if entry.parameters else {}
        return InferResponse(
            request.model_name, request.model_version, request.id, outputs, parameters
        )

    def put(self, key: bytes, response: InferResponse) -> None:
        if any(o.in_shared_memory for o in response.outputs):  # its bytes are not here
            return
        outputs = tuple(
            OutputTensor(o.name, o.datatype, o.shape, _frozen_copy(o.data))
            for o in response.outputs
        )
        parameters = dict(response.parameters) if response.parameters else None
        cost = _cost(key, outputs, parameters)
        if cost > self.size:
            return
        with self._lock:
            if key in self._entries:
                return
            while self._used + cost > self.size and self._entries:
                _, evicted = self._entries.popitem(last=False)
                self._used -= evicted.cost
                self.evictions += 1
            self._entries[key] = _Entry(outputs, parameters, cost)
            self._used += cost

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def used(self) -> int:
        return self._used


def _frozen_copy(data: np.ndarray) -> np.ndarray:
    copy = np.array(data, copy=True)
    copy.flags.writeable = False
    return copy


def _cost(
    key: bytes, outputs: tuple[OutputTensor, ...], parameters: dict[str, object] | None
) -> int:
    """The bytes an entry holds: its outputs' data and everything around it."""
    cost = ENTRY_COST + len(key)
    for output in outputs:
        cost += OUTPUT_COST + len(output.name) + 8 * len(output.shape) + _nbytes(output.data)
    if parameters:
        cost += sys.getsizeof(parameters) + sum(
            sys.getsizeof(name) + sys.getsizeof(value) for name, value in parameters.items()
        )
    return cost


def _nbytes(data: np.ndarray) -> int:
    if data.dtype.hasobject:  # BYTES elements: each a bytes object of its own
        return int(data.nbytes) + sum(sys.getsizeof(item) for item in data.flat)
    return int(data.nbytes)
