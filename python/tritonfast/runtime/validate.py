"""Check an inference request against its model's configuration before it is queued.

The checks and messages follow Triton's request normalisation, so a client sees the same
error from tritonfast as from Triton. The per-model tables are built once at load time;
checking a request is a few dict look-ups.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tritonfast._proto import model_config_pb2
from tritonfast.data.datatypes import WIRE_DATATYPES
from tritonfast.data.rawtensor import request_prefix
from tritonfast.data.types import InferRequest
from tritonfast.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension
    optional: bool = False


def _shape_text(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


class RequestValidator:
    """Knows one model's inputs and outputs and checks requests against them."""

    def __init__(self, config: model_config_pb2.ModelConfig) -> None:
        self.model_name = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = {t.name: _spec(t) for t in config.input}
        self.outputs = {t.name: _spec(t) for t in config.output}
        self._required = [s.name for s in self.inputs.values() if not s.optional]

    def check(self, request: InferRequest) -> int:
        """Raise InvalidArgumentError for a bad request; return its batch size (1 if none)."""
        model = self.model_name
        batch_size = 1
        count = len(request.inputs)
        if count > len(self.inputs) or count < len(self._required):  # Triton counts first
            sent = {t.name for t in request.inputs}
            raise self._count_error(request, count, [n for n in self._required if n not in sent])
        seen: set[str] = set()
        for tensor in request.inputs:
            spec = self.inputs.get(tensor.name)
            if spec is None:
                raise InvalidArgumentError(
                    f"unexpected inference input '{tensor.name}' for model '{model}'"
                )
            if tensor.name in seen:
                raise _refused(
                    request,
                    f"input '{tensor.name}' is specified more than once for model '{model}'",
                )
            seen.add(tensor.name)
            if tensor.datatype != spec.datatype:
                raise _refused(
                    request,
                    f"inference input '{tensor.name}' data-type is '{tensor.datatype}',"
                    f" but model '{model}' expects '{spec.datatype}'",
                )
            shape = tensor.shape
            if self.max_batch_size > 0:
                if len(shape) != len(spec.dims) + 1:
                    raise _refused(
                        request,
                        f"{self._shape_error(tensor.name, tensor.shape, spec)}{_BATCH_DIM_NOTE}",
                    )
                this_batch = shape[0]
                if this_batch > self.max_batch_size:
                    raise _refused(
                        request,
                        f"inference request batch-size must be <= {self.max_batch_size}"
                        f" for '{model}'",
                    )
                if len(seen) > 1 and this_batch != batch_size:
                    raise _refused(
                        request,
                        f"input '{tensor.name}' batch size does not match other inputs"
                        f" for '{model}'",
                    )
                batch_size = this_batch
                shape = shape[1:]
            if not _shape_matches(shape, spec.dims):
                raise _refused(request, f"{self._shape_error(tensor.name, tensor.shape, spec)}")
        missing = [n for n in self._required if n not in seen]
        if missing:
            raise self._count_error(request, len(seen), missing)
        if request.outputs is not None:
            for output in request.outputs:
                if output.name not in self.outputs:
                    raise InvalidArgumentError(
                        f"unexpected inference output '{output.name}' for model '{model}'"
                    )
        return batch_size

    def _count_error(
        self, request: InferRequest, count: int, missing: list[str]
    ) -> InvalidArgumentError:
        required, every = len(self._required), len(self.inputs)
        expected = (
            f"{every} inputs"
            if required == every
            else f"number of inputs between {required} and {every}"
        )
        # With none missing (too many inputs) Triton's list of them reads "]".
        missing_list = _name_list(missing) if missing else "]"
        return _refused(
            request,
            f"expected {expected} but got {count} inputs for model '{self.model_name}'. Got"
            f" input(s) {_name_list(t.name for t in request.inputs)}, but missing required"
            f" input(s) {missing_list}. Please provide all required input(s).",
        )

    def _shape_error(self, name: str, shape: tuple[int, ...], spec: TensorSpec) -> str:
        expected = ([-1] if self.max_batch_size > 0 else []) + list(spec.dims)
        return (
            f"unexpected shape for input '{name}' for model '{self.model_name}'."
            f" Expected {_shape_text(expected)}, got {_shape_text(shape)}. "
        )


# Triton adds this hint when a batching model gets an input without its batch dimension.
_BATCH_DIM_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension"
    " to be prepended to each input shape. If you want to specify the full shape including"
    " the batch dim in your input dims config, try setting max_batch_size to zero. See the"
    " model configuration docs for more info on max_batch_size."
)


def _spec(tensor: model_config_pb2.ModelInput | model_config_pb2.ModelOutput) -> TensorSpec:
    return TensorSpec(
        name=tensor.name,
        datatype=WIRE_DATATYPES.get(tensor.data_type, "INVALID"),
        dims=tuple(int(d) for d in tensor.dims),
        optional=bool(getattr(tensor, "optional", False)),
    )


def _shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d == -1 or d == s for s, d in zip(shape, dims, strict=True))


def _name_list(names: Iterable[str]) -> str:
    return "[" + ",".join(f"'{n}'" for n in names) + "]"  # no blank, as Triton lists them


def _refused(request: InferRequest, message: str) -> InvalidArgumentError:
    """Triton's request-level validation error: the message after the request-id prefix
    (built only when a request is refused)."""
    return InvalidArgumentError(request_prefix(request.id) + message)
