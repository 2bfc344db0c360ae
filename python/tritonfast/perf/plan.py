"""What a level sends: the payloads (bytes on the wire, made once), the order each context
sends them in, and how the answers count. A sequence model's contexts each run sequences of
their own (IDs that no other context uses, the first request with ``sequence_start``, the last
with ``sequence_end``, lengths varied around ``--sequence-length``); a decoupled model's
requests go on gRPC streams and ask for the empty final response that says a request is
complete."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tritonfast.perf import payloads
from tritonfast.perf.inputs import InputError, Tensor
from tritonfast.perf.options import PerfOptions
from tritonfast.perf.server import ModelInfo
from tritonfast.perf.sharedmemory import Regions

# Sequences per context before its script repeats (and so sequence IDs per context).
SEQUENCES_PER_CONTEXT = 4
DEFAULT_SEQUENCE_LENGTH = 20


@dataclass(frozen=True)
class Plan:
    protocol: str  # "http", "grpc" or "grpc-stream" (LoadRun's protocols)
    path: str
    payloads: list[bytes]
    scripts: list[list[int]]  # empty: the payloads in turn
    decoupled: bool
    sequence_ends: tuple[int, ...]  # payloads that end a sequence
    inputs: list[list[Tensor]]  # each payload's inputs


class _Payloads:
    """Payloads made once each, numbered in the order first asked for, with the inputs each
    carries."""

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}
        self.inputs: list[list[Tensor]] = []

    def add(self, payload: bytes, tensors: list[Tensor]) -> int:
        if payload not in self.index:
            self.index[payload] = len(self.index)
            self.inputs.append(tensors)
        return self.index[payload]

    def all(self) -> list[bytes]:
        return list(self.index)


def plan(
    options: PerfOptions,
    model: ModelInfo,
    address: str,
    streams: list[list[list[Tensor]]],
    concurrency: int,
    regions: Regions | None = None,
) -> Plan:
    """``regions``: put the inputs and outputs in shared memory (``--shared-memory``)."""
    if model.decoupled and not options.streaming:
        raise InputError(
            f"{model.name!r} is decoupled: measure it on gRPC streams (-i grpc --streaming)"
        )
    outputs = [spec.name for spec in model.outputs]
    extra: payloads.Parameters = (
        {"triton_enable_empty_final_response": True} if model.decoupled else {}
    )

    def encode(tensors: list[Tensor], parameters: payloads.Parameters) -> bytes:
        parameters = {**options.request_parameters, **parameters, **extra}
        placed = None
        if regions is not None:
            placed = payloads.Placement(
                {t.name: regions.input(payloads.tensor_bytes(t)) for t in tensors},
                {name: regions.output(name) for name in outputs},
            )
        if options.protocol == "grpc":
            return payloads.grpc_request(
                options.model, options.version, tensors, outputs, parameters, placed
            )
        return payloads.http_request(
            address, options.model, options.version, tensors, outputs, parameters, placed
        )

    made = _Payloads()
    if model.sequence:
        # A request rate takes turns over --num-of-sequences sequences at once.
        slots = options.num_of_sequences if options.rate_mode else concurrency
        scripts, ends = _sequences(options, streams, slots, encode, made)
    else:
        for stream in streams:
            for tensors in stream:
                made.add(encode(tensors, {}), tensors)
        scripts, ends = [], ()
    if options.streaming:
        protocol, path = "grpc-stream", ""
    else:
        protocol, path = options.protocol, payloads.GRPC_INFER_PATH
    return Plan(protocol, path, made.all(), scripts, model.decoupled, ends, made.inputs)


def _sequences(
    options: PerfOptions,
    streams: list[list[list[Tensor]]],
    concurrency: int,
    encode: Callable[[list[Tensor], payloads.Parameters], bytes],
    made: _Payloads,
) -> tuple[list[list[int]], tuple[int, ...]]:
    """One script per context: its own sequences, one after another."""
    first_id, last_id = options.sequence_ids
    needed = concurrency * SEQUENCES_PER_CONTEXT
    if last_id is not None and last_id - first_id < needed:
        raise InputError(
            f"--sequence-id-range {first_id}:{last_id} holds {last_id - first_id} IDs;"
            f" {concurrency} concurrent sequences need {needed}"
        )
    random = np.random.default_rng(0)
    scripts: list[list[int]] = []
    ends: set[int] = set()
    for context in range(concurrency):
        script = []
        for turn in range(SEQUENCES_PER_CONTEXT):
            number = context * SEQUENCES_PER_CONTEXT + turn
            sequence_id = first_id + number
            steps = streams[number % len(streams)]
            length = _length(options, len(steps), random)
            for step in range(length):
                parameters: payloads.Parameters = {
                    "sequence_id": sequence_id,
                    "sequence_start": step == 0,
                    "sequence_end": step == length - 1,
                }
                tensors = steps[step % len(steps)]
                index = made.add(encode(tensors, parameters), tensors)
                script.append(index)
                if step == length - 1:
                    ends.add(index)
        scripts.append(script)
    return scripts, tuple(sorted(ends))


def _length(options: PerfOptions, steps: int, random: np.random.Generator) -> int:
    """A sequence's length: its data stream's, or ``--sequence-length`` varied by
    ``--sequence-length-variation`` percent either way."""
    if options.sequence_length is None and steps > 1:
        return steps
    base = options.sequence_length or DEFAULT_SEQUENCE_LENGTH
    spread = base * options.sequence_variation / 100
    return max(1, round(base + random.uniform(-spread, spread)))
