"""``model_warmup``: sample requests every instance runs before its model is READY.

Each ``ModelWarmup`` entry names its inputs (datatype, dims, and ``zero_data``,
``random_data`` or ``input_data_file`` — a file in the model's ``warmup/`` directory holding
the raw tensor bytes), a ``batch_size`` for batching models, and a ``count`` of runs. A sample
that fails keeps the model from loading, with the reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, PhaseClock
from tritonfast.errors import InvalidArgumentError, TritonError
from tritonfast.runtime import rawtensor
from tritonfast.runtime.types import NUMPY_DTYPES, InferRequest, InputTensor
from tritonfast.runtime.validate import WIRE_DATATYPES

WARMUP_DIR = "warmup"


def warm_up(
    config: model_config_pb2.ModelConfig, instances: list[Backend], model_dir: Path
) -> None:
    """Run every warmup sample ``count`` times on every instance; raise on the first failure."""
    for sample in config.model_warmup:
        try:
            request = _request(config, sample, model_dir)
            for instance in instances:
                for _ in range(max(sample.count, 1)):
                    result = instance.execute([request], PhaseClock())[0]
                    if isinstance(result, TritonError):
                        raise result
        except TritonError as error:
            raise InvalidArgumentError(
                f"failed to warm up model '{config.name}' with sample '{sample.name}':"
                f" {error.message}"
            ) from None
        except (ValueError, TypeError, OverflowError) as error:  # e.g. dims of -1
            raise InvalidArgumentError(
                f"failed to warm up model '{config.name}' with sample '{sample.name}': {error}"
            ) from None


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
