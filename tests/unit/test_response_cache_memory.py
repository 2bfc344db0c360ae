"""The response cache counts what its entries really cost: its bound holds for the memory
Python allocates for them (tracemalloc), not just for their output bytes."""

from __future__ import annotations

import gc
import hashlib
import tracemalloc

import numpy as np
import pytest
from tritonfast.data.types import InferResponse, OutputTensor
from tritonfast.runtime.cache import ResponseCache

ENTRIES = 2000


def _response(index: int, shapes: list[tuple[int, ...]], kind: str, params: bool) -> InferResponse:
    outputs = []
    for position, shape in enumerate(shapes):
        if kind == "BYTES":
            data = np.array([b"w%d" % index] * int(np.prod(shape)), dtype=object).reshape(shape)
        else:
            data = np.full(shape, index, dtype=np.float32)
        outputs.append(OutputTensor(f"OUTPUT{position}", kind, shape, data))
    parameters: dict[str, object] = {"tag": f"t{index}", "n": index} if params else {}
    return InferResponse("m", "1", str(index), outputs, parameters)


def _key(index: int) -> bytes:
    return hashlib.blake2b(index.to_bytes(8, "little"), digest_size=20).digest()


@pytest.mark.parametrize(
    ("shapes", "kind", "params"),
    [
        ([(1,)], "FP32", False),  # a 4-byte answer: nearly all of its cost is around the data
        ([(1,), (1,), (1,)], "FP32", False),
        ([(4, 0)], "FP32", False),  # no output bytes at all
        ([(16, 16)], "FP32", True),
        ([(2,)], "BYTES", False),
    ],
    ids=["one-scalar", "three-scalars", "empty", "matrix-with-parameters", "bytes"],
)
def test_the_counted_cost_of_an_entry_bounds_what_it_allocates(shapes, kind, params) -> None:
    cache = ResponseCache(1 << 40)
    responses = [_response(i, shapes, kind, params) for i in range(ENTRIES)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index, response in enumerate(responses):
            cache.put(_key(index), response)
        gc.collect()
        allocated = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.entries == ENTRIES
    # What the cache counts covers what it holds, and is not wildly more (the bound must
    # still let a cache hold about as many answers as its size allows).
    assert cache.used >= allocated, (cache.used / ENTRIES, allocated / ENTRIES)
    assert cache.used <= 2 * allocated + ENTRIES * 64, (cache.used / ENTRIES, allocated / ENTRIES)


def test_empty_answers_fill_the_cache_and_evict_like_any_other() -> None:
    cache = ResponseCache(64 * 1024)
    for index in range(10_000):
        cache.put(_key(index), _response(index, [(4, 0)], "FP32", False))
    assert cache.used <= cache.size
    assert cache.evictions > 0
    assert cache.entries < 10_000


def test_the_cache_never_counts_more_than_its_size() -> None:
    cache = ResponseCache(1 << 20)
    for index in range(20_000):
        cache.put(_key(index), _response(index, [(1,)], "FP32", False))
        assert cache.used <= cache.size
    # 4-byte answers cost about 700 bytes each here: about 1,500 fit in 1 MiB, not 262,144.
    assert 1000 < cache.entries < 3000
    assert cache.evictions == 20_000 - cache.entries
