"""``model_warmup``: sample requests every instance runs before its model is READY.

Each ``ModelWarmup`` entry names its inputs (datatype, dims, and ``zero_data``,
``random_data`` or ``input_data_file`` — a file in the model's ``warmup/`` directory holding
the raw tensor bytes), a ``batch_size`` for batching models, and a ``count`` of runs. A sample
that fails keeps the model from loading, with the reason.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import ModelInstance, PhaseClock
from tritonfast.data import rawtensor
from tritonfast.data.datatypes import NUMPY_DTYPES, WIRE_DATATYPES
from tritonfast.data.types import InferRequest, InputTensor
from tritonfast.errors import InternalError, InvalidArgumentError, TritonError
from tritonfast.runtime.responses import SENDER_CLOSED_MESSAGE, Result

WARMUP_DIR = "warmup"
# How long a sample's responses may take when the model sends them through its sender.
RESPONSE_TIMEOUT_S = 60.0


def warm_up(
    config: model_config_pb2.ModelConfig, instances: list[ModelInstance], model_dir: Path
) -> None:
    """Run every warmup sample ``count`` times on every instance; raise on the first failure."""
    decoupled = config.model_transaction_policy.decoupled
    for sample in config.model_warmup:
        try:
            for instance in instances:
                for _ in range(max(sample.count, 1)):
                    _run(instance, _request(config, sample, model_dir), decoupled)
        except TritonError as error:
            raise InvalidArgumentError(
                f"failed to warm up model '{config.name}' with sample '{sample.name}':"
                f" {error.message}"
            ) from None
        except (ValueError, TypeError, OverflowError) as error:  # e.g. dims of -1
            raise InvalidArgumentError(
                f"failed to warm up model '{config.name}' with sample '{sample.name}': {error}"
            ) from None


def _run(instance: ModelInstance, request: InferRequest, decoupled: bool) -> None:
    """Run one sample request; raise the first error among its responses."""
    collector = request.sender = _Collector(decoupled)
    results = instance.execute([request], PhaseClock())
    if results is not None and results[0] is not None:
        outcome = [results[0]]
    else:
        if not collector.done.wait(RESPONSE_TIMEOUT_S):
            raise InternalError(
                f"the model sent no final response within {RESPONSE_TIMEOUT_S:.0f} s"
            )
        outcome = collector.results
    for result in outcome:
        if isinstance(result, TritonError):
            raise result


class _Collector:
    """Takes a sample request's responses in place of a response sender."""

    def __init__(self, decoupled: bool) -> None:
        self.decoupled = decoupled
        self.results: list[Result] = []
        self.done = threading.Event()
        self.closed = False

    def send(self, result: Result | None = None, final: bool = False) -> None:
        if self.closed:
            raise InternalError(SENDER_CLOSED_MESSAGE)
        if result is not None:
            self.results.append(result)
        if final:
            self.closed = True
            self.done.set()

    def is_cancelled(self) -> bool:
        return False

    def abandon(self, error: TritonError) -> None:
        if not self.closed:
            self.send(error, final=True)


def _request(
    config: model_config_pb2.ModelConfig, sample: model_config_pb2.ModelWarmup, model_dir: Path
) -> InferRequest:
    batch = [max(sample.batch_size, 1)] if config.max_batch_size > 0 else []
    inputs = []
    for name, spec in sorted(sample.inputs.items()):
        datatype = WIRE_DATATYPES.get(spec.data_type)
        if datatype is None:
            raise InvalidArgumentError(f"input '{name}' has no valid data_type")
        shape = (*batch, *(int(d) for d in spec.dims))
        data = _data(config, sample, name, spec, shape, model_dir)
        inputs.append(InputTensor(name, datatype, shape, data))
    return InferRequest(model_name=config.name, id=f"warmup:{sample.name}", inputs=inputs)


def _data(
    config: model_config_pb2.ModelConfig,
    sample: model_config_pb2.ModelWarmup,
    name: str,
    spec: model_config_pb2.ModelWarmup.Input,
    shape: tuple[int, ...],
    model_dir: Path,
) -> np.ndarray:
    datatype = WIRE_DATATYPES[spec.data_type]
    count = int(np.prod(shape, dtype=np.int64))
    source = spec.WhichOneof("input_data_type")
    if source == "input_data_file":
        path = model_dir / WARMUP_DIR / spec.input_data_file
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise InvalidArgumentError(f"cannot read {path}: {error.strerror}") from None
        return rawtensor.from_raw(datatype, shape, raw, name, config.name)
    if datatype == "BYTES":
        return rawtensor.bytes_array([b""] * count).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if source != "random_data":
        return np.zeros(shape, dtype=dtype)
    rng = np.random.default_rng()
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    random_bytes = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return random_bytes.view(dtype).reshape(shape)
