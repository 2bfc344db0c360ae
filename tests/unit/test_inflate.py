"""The HTTP frontend's inflating of compressed bodies (``_core.Inflater`` through
``app._inflate``) against Python's zlib with Triton's setting (``windowBits = 15 + 32``): the
same body for whole, cut short and damaged streams, the size bound and the body budget."""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonfast.errors import InvalidArgumentError
from tritonfast.frontends.http import app
from tritonfast.memory.bodybudget import BodyBudget


def zlib_reference(body: bytes) -> bytes:
    """The body zlib inflates from ``body``: empty if it finds the stream corrupt (as the
    frontend answers it: a JSON parser's error for an empty document)."""
    inflater = zlib.decompressobj(15 + 32)
    try:
        return inflater.decompress(body)
    except zlib.error:
        return b""


def inflated(body: bytes) -> bytes:
    out, _ = app._inflate(bytearray(body), BodyBudget())
    return bytes(out)


COMPRESSORS = [gzip.compress, zlib.compress]


@settings(max_examples=150, deadline=None)
@given(
    data=st.binary(max_size=4096) | st.builds(lambda n: b"ab" * n, st.integers(0, 200_000)),
    compress=st.sampled_from(COMPRESSORS),
    cut=st.floats(0, 1),
    flip=st.none() | st.tuples(st.floats(0, 1), st.integers(0, 7)),
)
def test_the_same_bytes_as_zlib(data, compress, cut, flip) -> None:
    body = bytearray(compress(data))
    body = body[: max(1, round(len(body) * cut))] if cut < 1 else body
    if flip is not None:
        at, bit = flip
        body[min(len(body) - 1, int(len(body) * at))] ^= 1 << bit
    assert inflated(bytes(body)) == zlib_reference(bytes(body))


def test_a_corrupt_body_is_empty_and_counts_nothing() -> None:
    out, counted = app._inflate(bytearray(b"\x1f\x8b not really gzip"), BodyBudget())
    assert (len(out), counted) == (0, 0)


def test_a_body_that_inflates_past_the_bound_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(app, "MAX_BODY_BYTES", 1000)
    with pytest.raises(InvalidArgumentError, match="larger than 1000 bytes"):
        app._inflate(bytearray(gzip.compress(b" " * 1001)), BodyBudget())
    out, _ = app._inflate(bytearray(gzip.compress(b" " * 1000)), BodyBudget())
    assert bytes(out) == b" " * 1000


def test_large_bodies_are_counted_against_the_budget_and_refused_past_it() -> None:
    budget = BodyBudget(1 << 20)
    out, counted = app._inflate(bytearray(gzip.compress(b" " * (512 << 10))), budget)
    assert counted == len(out) == budget.held == 512 << 10
    with pytest.raises(Exception, match="past its budget"):
        app._inflate(bytearray(gzip.compress(b" " * (1 << 20))), budget)
    assert budget.held == 512 << 10  # the refused body gave back what it had counted
