"""Decorators that adapt a function to the callable contract (a list of requests in, a list
of output dicts out), with PyTriton's names and semantics: ``@batch`` (one call per batch,
inputs concatenated into keyword arguments), ``@sample`` (one request as keyword arguments),
``@group_by_keys``, ``@group_by_values``, ``@first_value``, ``@fill_optionals``,
``@pad_batch`` and ``@triton_context``.

Decorators that need the model's configuration read it from the binding whose instance is
calling (set by the callable backend around each call).

Each decorator works on a plain function, a bound method, a method or ``__call__`` in a class
body, and on another decorator's result (see :class:`_Decorated`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from tritonfast.callables.errors import (
    PyTritonBadParameterError,
    PyTritonRuntimeError,
    PyTritonValidationError,
)
from tritonfast.callables.spec import DynamicBatcher, Tensor

CONTEXT_ARGUMENT = "triton_context"
_current = threading.local()


@dataclasses.dataclass
class TritonModelConfig:
    """What a callable may read about its model (PyTriton's ``TritonModelConfig`` fields)."""

    model_name: str
    batching: bool
    max_batch_size: int
    batcher: DynamicBatcher | None
    inputs: list[Tensor]
    outputs: list[Tensor]
    decoupled: bool = False
    response_cache: bool = False
    model_version: int = 1


class _AnyCallable(Mapping[Any, TritonModelConfig]):
    """``triton_context.model_configs[infer_callable]``: the calling model's configuration,
    whichever callable is asked about."""

    def __init__(self, config: TritonModelConfig) -> None:
        self._config = config

    def __getitem__(self, key: Any) -> TritonModelConfig:
        return self._config

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 1


@dataclasses.dataclass
class TritonContext:
    model_configs: Mapping[Any, TritonModelConfig]


def calling(config: TritonModelConfig | None) -> None:
    """Set (or clear) the configuration of the model whose callable this thread runs."""
    _current.config = config


def get_model_config() -> TritonModelConfig:
    config = getattr(_current, "config", None)
    if config is None:
        raise PyTritonRuntimeError("no model is calling: decorators work inside a bound callable")
    return config


def get_inference_request_batch_size(request: Mapping[str, np.ndarray]) -> int:
    """The batch size of a request: the first dimension of its first input."""
    first = next(iter(request.values()))
    return int(first.shape[0])


def _outputs(returned: Any) -> dict[str, np.ndarray]:
    if isinstance(returned, Mapping):
        return dict(returned)
    if isinstance(returned, list | tuple):  # outputs in the order the model declares them
        names = [str(t.name) for t in get_model_config().outputs]
        return dict(zip(names, returned, strict=False))
    raise ValueError(f"the callable returned {type(returned).__name__}, not a dict of outputs")


def _special(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k == CONTEXT_ARGUMENT}


class _Decorated:
    """What every decorator returns: calling it calls ``around(function, *args, **kwargs)``.

    A nested ``def wrapper`` would break on methods: put in a class body it binds like any
    function, so ``model(requests)`` would call ``wrapper(model, requests)`` and the
    decorator would take the instance for the requests. Here ``__get__`` binds the wrapped
    function instead (for stacked decorators, the next one down binds in turn) and decorates
    the bound method, so ``self`` reaches the user's code and ``around`` sees only the
    arguments after it, as PyTriton's decorators (built on wrapt) do.
    """

    def __init__(self, around: Callable[..., Any], function: Callable[..., Any]) -> None:
        # Name, docstring and ``__wrapped__`` of the function; not its ``__dict__``, which
        # for a decorated function would bring the inner decorator's own fields.
        functools.update_wrapper(self, function, updated=())
        self._around = around
        self._function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._around(self._function, *args, **kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> _Decorated:
        bind = getattr(type(self._function), "__get__", None)
        if bind is None:  # a callable object: a class attribute that is not a method
            return self
        return _Decorated(self._around, bind(self._function, instance, owner))


def sample(function: Callable[..., Any]) -> Callable[..., Any]:
    """The first request's inputs as keyword arguments; the result is its one response."""
    return _Decorated(_sample, function)


def _sample(
    function: Callable[..., Any], requests: list[Any], *args: Any, **kwargs: Any
) -> list[dict[str, np.ndarray]]:
    kwargs.update(requests[0])
    return [_outputs(function(*args, **kwargs))]


def batch(function: Callable[..., Any]) -> Callable[..., Any]:
    """All requests' inputs concatenated along the first axis, as keyword arguments; the
    returned outputs are split back by each request's batch size (a generator's each round)."""
    return _Decorated(_batch, function)


def _batch(function: Callable[..., Any], requests: list[Any], *args: Any, **kwargs: Any) -> Any:
    names = requests[0].keys()
    for request in requests[1:]:
        if request.keys() != names:
            raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
    for name in names:
        kwargs[name] = np.concatenate([request[name] for request in requests])
    sizes = [get_inference_request_batch_size(request) for request in requests]
    returned = function(*args, **kwargs)
    if isinstance(returned, Iterator) and not isinstance(returned, Mapping):
        return (_split(_outputs(r), sizes) for r in returned)
    return _split(_outputs(returned), sizes)


def _split(outputs: dict[str, np.ndarray], sizes: list[int]) -> list[dict[str, np.ndarray]]:
    total = sum(sizes)
    wrong = {name: value.shape for name, value in outputs.items() if value.shape[0] != total}
    if wrong:
        listed = ", ".join(f"{name}: {shape}" for name, shape in wrong.items())
        raise ValueError(
            f"Received output tensors with different batch sizes: {listed}. Expected batch"
            f" size: {total}. "
        )
    results = []
    start = 0
    for size in sizes:
        results.append({name: value[start : start + size] for name, value in outputs.items()})
        start += size
    return results


def group_by_keys(function: Callable[..., Any]) -> Callable[..., Any]:
    """Requests with the same set of input names called together, one call per set; the
    responses come back in request order."""
    return _Decorated(_group_by_keys, function)


def _group_by_keys(
    function: Callable[..., Any], requests: list[Any], *args: Any, **kwargs: Any
) -> list[Any]:
    order = sorted(range(len(requests)), key=lambda i: tuple(sorted(requests[i].keys())))
    results: dict[int, Any] = {}
    for _, group in itertools.groupby(order, key=lambda i: tuple(sorted(requests[i].keys()))):
        indices = list(group)
        answered = function([requests[i] for i in indices], *args, **kwargs)
        results.update(zip(indices, answered, strict=True))
    return [results[i] for i in range(len(requests))]


def _value_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OS":
            return (*(bytes(x) for x in value.ravel().tolist()), value.shape)
        return (value.tobytes(), value.shape, value.dtype.str)
    return value


def group_by_values(
    *keys: str, pad_fn: Callable[[Any], Any] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Under ``@batch``: the batch's rows split into groups with equal values of ``keys``,
    one call per group, the outputs put back in row order (``pad_fn`` may pad the groups'
    outputs to one shape first, e.g. :class:`ConstantPadder`)."""

    def around(function: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        inputs = {k: v for k, v in kwargs.items() if k != CONTEXT_ARGUMENT}
        rows = get_inference_request_batch_size(inputs)
        order = sorted(range(rows), key=lambda i: [_value_key(inputs[k][i]) for k in keys])
        groups = [
            list(group)
            for _, group in itertools.groupby(
                order, key=lambda i: [_value_key(inputs[k][i]) for k in keys]
            )
        ]
        answers = [
            _outputs(function(*args, **{n: v[g] for n, v in inputs.items()}, **_special(kwargs)))
            for g in groups
        ]
        if pad_fn is not None:
            answers = list(pad_fn(answers))
        first = answers[0]
        merged = {
            name: np.zeros((rows, *value.shape[1:]), dtype=value.dtype)
            for name, value in first.items()
        }
        for indices, answer in zip(groups, answers, strict=True):
            for name, value in answer.items():
                merged[name][indices, ...] = value
        return merged

    return functools.partial(_Decorated, around)


class ConstantPadder:
    """Pads the groups' outputs with ``pad_value`` to one shape per output (the largest of
    each dimension), so that they merge into one array."""

    def __init__(self, pad_value: Any = 0) -> None:
        self.pad_value = pad_value

    def __call__(self, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        names = list(dict.fromkeys(name for b in batches for name in b))
        for name in names:
            present = [b[name] for b in batches if name in b]
            kinds = {a.dtype.kind for a in present}
            if len(kinds) > 1:
                raise PyTritonRuntimeError(
                    "All input arrays for given input name must have the same dtype."
                )
            dtype = present[0].dtype
            if dtype.kind in "SU":
                dtype = max((a.dtype for a in present), key=lambda d: d.itemsize)
            elif any(a.dtype != dtype for a in present):
                raise PyTritonRuntimeError(
                    "All input arrays for given input name must have the same dtype."
                )
            shape = tuple(np.max([a.shape[1:] for a in present], axis=0))
            fill = self.pad_value if dtype.kind not in "SUO" else b""
            for b in batches:
                if name in b:
                    a = b[name]
                    widths = [(0, 0)] + [
                        (0, want - have) for have, want in zip(a.shape[1:], shape, strict=True)
                    ]
                    b[name] = np.pad(a, widths, mode="constant", constant_values=fill).astype(dtype)
        return batches


def fill_optionals(**defaults: np.ndarray) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Inputs a request leaves out filled with ``defaults`` (arrays without the batch axis,
    repeated to the request's batch size for a batching model)."""

    def around(function: Callable[..., Any], requests: list[Any], *args: Any, **kwargs: Any) -> Any:
        config = get_model_config()
        _check_defaults(config, defaults)
        for request in requests:
            rows = get_inference_request_batch_size(request) if config.batching else None
            for name, value in defaults.items():
                if name in request:
                    continue
                if rows is not None:
                    value = np.tile(value, (rows,) + (1,) * value.ndim)
                request[name] = value
        return function(requests, *args, **kwargs)

    return functools.partial(_Decorated, around)


def _check_defaults(config: TritonModelConfig, defaults: Mapping[str, Any]) -> None:
    inputs = {t.name: t for t in config.inputs}
    unknown = sorted(set(defaults) - set(inputs))
    if unknown:
        raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")
    not_arrays = {k: v for k, v in defaults.items() if not isinstance(v, np.ndarray)}
    if not_arrays:
        listed = ", ".join(f"{k}={v}" for k, v in not_arrays.items())
        raise PyTritonBadParameterError(
            f"Could not use {listed} defaults as they are not NumPy arrays"
        )
    wrong_dtype = {
        k: (v.dtype, inputs[k].dtype) for k, v in defaults.items() if v.dtype != inputs[k].dtype
    }
    if wrong_dtype:
        listed = ", ".join(
            f"{k}: dtype={h} expected_dtype={e}" for k, (h, e) in wrong_dtype.items()
        )
        raise PyTritonBadParameterError(
            f"Could not use {listed} defaults as they have different than input signature dtypes"
        )

    def fits(have: tuple[int, ...], want: tuple[int, ...]) -> bool:
        return len(have) == len(want) and all(
            w == -1 or h == w for h, w in zip(have, want, strict=True)
        )

    wrong_shape = {
        k: (v.shape, tuple(inputs[k].shape))
        for k, v in defaults.items()
        if not fits(v.shape, tuple(inputs[k].shape))
    }
    if wrong_shape:
        listed = ", ".join(
            f"{k}: shape={h} expected_shape={e}" for k, (h, e) in wrong_shape.items()
        )
        raise PyTritonBadParameterError(
            f"Could not use {listed} defaults as they have different than input signature shapes"
        )


def triton_context(function: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the keyword argument ``triton_context`` (``.model_configs[infer_callable]``)."""
    return _Decorated(_triton_context, function)


def _triton_context(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    kwargs[CONTEXT_ARGUMENT] = TritonContext(_AnyCallable(get_model_config()))
    return function(*args, **kwargs)


def pad_batch(function: Callable[..., Any]) -> Callable[..., Any]:
    """Under ``@batch``: the inputs padded to the next preferred batch size (or
    ``max_batch_size``) by repeating their last row."""
    return _Decorated(_pad_batch, function)


def _pad_batch(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    inputs = {k: v for k, v in kwargs.items() if k != CONTEXT_ARGUMENT}
    rows = next(iter(inputs.values())).shape[0]
    config = get_model_config()
    preferred = []
    if config.batcher is not None and config.batcher.preferred_batch_size:
        preferred = sorted(config.batcher.preferred_batch_size)
    sizes = [*preferred, config.max_batch_size]
    target = sizes[min(bisect.bisect_left(sizes, rows), len(sizes) - 1)]
    for name, value in inputs.items():
        repeats = np.ones(value.shape[0], dtype=np.int64)
        repeats[-1] = target - value.shape[0] + 1
        kwargs[name] = np.repeat(value, repeats, axis=0)
    return function(*args, **kwargs)


def first_value(
    *keys: str, squeeze_single_values: bool = True, strict: bool = True
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Inputs ``keys`` replaced by their first row (a scalar when it holds one value); with
    ``strict``, every row must be equal. Under ``@batch``, or on a list of requests."""
    if CONTEXT_ARGUMENT in keys:
        raise PyTritonBadParameterError(
            f"The keys {CONTEXT_ARGUMENT} are not allowed as keys for @first_value wrapper. The"
            f" set of not allowed keys are {CONTEXT_ARGUMENT}"
        )

    def replace(request: Any) -> None:
        for name in keys:
            if name not in request:
                continue
            values = request[name]
            if strict:
                unique = np.unique(values, axis=None if values.dtype == object else 0)
                if len(unique) > 1:
                    raise PyTritonRuntimeError(
                        f"The values on the {name!r} input are not equal. To proceed, either"
                        " disable strict mode in @first_value wrapper or ensure that the values"
                        f" always are consistent. The current values of {name!r} are"
                        f" {values!r}."
                    )
            first = values[0]
            if (
                squeeze_single_values
                and not np.isscalar(first)
                and all(d == 1 for d in first.shape)
            ):
                first = np.squeeze(first).item() if first.dtype != object else first.ravel()[0]
            request[name] = first

    def around(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not get_model_config().batching:
            raise PyTritonRuntimeError(
                "The @first_value decorator can only be used with models that support batching."
            )
        if args and isinstance(args[0], list):  # on requests
            for request in args[0]:
                replace(request)
        else:  # under @batch: keyword arguments
            replace(kwargs)
        return function(*args, **kwargs)

    return functools.partial(_Decorated, around)
