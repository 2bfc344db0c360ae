"""How a batch's tensors lie in a shared-memory segment between the server and a worker
process: back to back, each at an aligned offset (:func:`write_tensors`), described by a
:data:`TensorSlot` that travels over the pipe; the other side views or copies each one
(:func:`read_tensor`). Large tensors in a client's system shared memory stay there: their slot
names the client's object instead (:mod:`.sharedobjects`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tritonfast._core import copy_into
from tritonfast.backends.python.sharedobjects import Place, SharedObjects
from tritonfast.data import rawtensor
from tritonfast.memory.bufferpool import POOL
from tritonfast.memory.shmsegment import SegmentWriter, aligned

# Tensors from this size on are copied into and out of the segments with the GIL released;
# smaller ones (quicker than handing the GIL to and fro) with it held.
POOLED_COPY_BYTES = 64 * 1024
# A reply's outputs up to this many bytes in all travel in the reply message itself
# (:func:`inline_tensors`): one join of small byte strings costs the worker 4-6 µs less per
# batch than laying each out in its segment, and costs the message a few copies of its
# bytes, which for larger outputs come to more than that.
INLINE_BYTES = 8 * 1024

# A tensor's place: (name, datatype, shape, offset, nbytes, object place): at ``offset`` of the
# message's segment, or, with an object place, in a client's shared-memory object there.
TensorSlot = tuple[str, str, tuple[int, ...], int, int, Place | None]


def raw_bytes(datatype: str, data: np.ndarray) -> np.ndarray:
    """A tensor's wire bytes as a uint8 array (BYTES: the length-prefixed layout)."""
    raw = rawtensor.to_raw(datatype, data)
    return np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else raw


# A tensor to lay out: (name, datatype, shape, data, object place or None). Those with an
# object place are already there (inputs) or written there by the caller (outputs).
Laid = tuple[str, str, tuple[int, ...], np.ndarray, Place | None]


def write_tensors(writer: SegmentWriter, tensors: list[Laid]) -> tuple[str, int, list[TensorSlot]]:
    """Copy the tensors without an object place into the writer's segment, back to back."""
    raws = [None if place else raw_bytes(datatype, data) for _, datatype, _, data, place in tensors]
    offsets = []
    end = 0
    for raw in raws:
        offsets.append(end)
        if raw is not None:
            end = aligned(end + raw.nbytes)
    segment = writer.reserve(end)
    memory = np.frombuffer(segment.buffer, np.uint8)
    slots: list[TensorSlot] = []
    for (name, datatype, shape, data, place), raw, offset in zip(
        tensors, raws, offsets, strict=True
    ):
        if raw is None:
            slots.append((name, datatype, tuple(shape), 0, data.nbytes, place))
            continue
        if raw.nbytes < POOLED_COPY_BYTES:
            memory[offset : offset + raw.nbytes] = raw
        else:  # with the GIL released (large ones on the core's copy threads)
            copy_into(memory[offset : offset + raw.nbytes], np.ascontiguousarray(raw))
        slots.append((name, datatype, tuple(shape), offset, raw.nbytes, None))
    return segment.name, segment.size, slots


def inline_tensors(tensors: list[Laid]) -> tuple[bytes, list[TensorSlot]] | None:
    """The bytes of the tensors without an object place, one after another, to travel in a
    reply message, and the slots that find them there; None when they are more than
    :data:`INLINE_BYTES` (the segment takes them)."""
    parts: list[bytes] = []
    slots: list[TensorSlot] = []
    end = 0
    for name, datatype, shape, data, place in tensors:
        if place is not None:
            slots.append((name, datatype, tuple(shape), 0, data.nbytes, place))
            continue
        if datatype != "BYTES" and end + data.nbytes > INLINE_BYTES:
            return None  # (before copying it)
        raw = rawtensor.wire_bytes(datatype, data)
        size = len(raw)
        if end + size > INLINE_BYTES:
            return None
        slots.append((name, datatype, tuple(shape), end, size, None))
        parts.append(raw)
        end += size
    return b"".join(parts), slots


def read_tensor(
    buffer: Any, slot: TensorSlot, model: str, objects: SharedObjects | None, *, copy: bool
) -> np.ndarray:
    """A tensor in a segment (or, in a worker, a client's object): a view, or (``copy``) a
    copy in a recycled pool buffer, made with the GIL released, that outlives the segment's
    next reuse."""
    name, datatype, shape, offset, nbytes, place = slot
    if place is None and not copy:
        # The common case, a fixed-size tensor viewed where it lies: one numpy object (half
        # the time of frombuffer and reshape); the checks below word what is wrong with a
        # slot this does not fit.
        dtype = rawtensor.FIXED_SIZE_DTYPES.get(datatype)
        if dtype is not None:
            try:
                array = np.ndarray(shape, dtype, buffer, offset)
            except (TypeError, ValueError):  # (beyond the buffer; a negative dimension)
                pass
            else:
                if array.nbytes == nbytes:
                    return array
    if place is not None and objects is not None:
        view = objects.window(place)[:nbytes].toreadonly()  # as the server's own views
    else:
        view = memoryview(buffer)[offset : offset + nbytes]
    if copy and datatype != "BYTES":
        if nbytes < POOLED_COPY_BYTES:
            view = memoryview(bytearray(view))  # quicker than handing the GIL to and fro
        else:
            view = np.asarray(POOL.gather([np.frombuffer(view, np.uint8)])).data
    return rawtensor.from_raw(datatype, shape, view, name, model)
