"""PyTriton's decorators on every kind of callable PyTriton accepts them on: a plain function,
a bound method (``obj.infer``), ``__call__`` of instances bound as a list (one per model
instance), each with one decorator and with decorators stacked as PyTriton's examples stack
them. One in-process server (``tritonfast.pytriton.triton.Triton``) holds a model per case and
kind; tritonclient drives it over HTTP.

The methods add their instance's ``offset`` to every answer, so an answer shows that ``self``
reached the method, not the decorator (which used to take the instance for the requests)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype
from tritonfast.pytriton.decorators import (
    batch,
    fill_optionals,
    first_value,
    group_by_keys,
    group_by_values,
    pad_batch,
    sample,
    triton_context,
)
from tritonfast.pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from tritonfast.pytriton.triton import Triton, TritonConfig

from tests.e2e.loopback import loopback_options

F32 = np.float32
X = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], F32)
METHOD_OFFSET = 100.0
KINDS = ["function", "method", "call"]


# -- the models' bodies: ``owner`` is the method's ``self``, or a stand-in for a function ------
def add_offset(owner: Any, x: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x + owner.offset}


def each_request(owner: Any, requests: list[Any]) -> list[dict[str, np.ndarray]]:
    assert len({tuple(sorted(r.keys())) for r in requests}) == 1  # @group_by_keys's promise
    return [{"y": r["x"] + owner.offset} for r in requests]


def by_mode(owner: Any, x: np.ndarray, mode: np.ndarray) -> dict[str, np.ndarray]:
    assert len(np.unique(mode)) == 1  # one call per mode: 0 doubles, 1 negates
    return {"y": (x * 2 if mode[0, 0] == 0 else -x) + owner.offset}


def scaled_requests(owner: Any, requests: list[Any]) -> list[dict[str, np.ndarray]]:
    assert all(np.isscalar(r["scale"]) for r in requests)  # @first_value replaced the arrays
    return [{"y": r["x"] * r["scale"] + owner.offset} for r in requests]


def scaled(owner: Any, x: np.ndarray, scale: Any) -> dict[str, np.ndarray]:
    assert np.isscalar(scale)
    return {"y": x * scale + owner.offset}


def biased_requests(owner: Any, requests: list[Any]) -> list[dict[str, np.ndarray]]:
    return [{"y": r["x"] + r["bias"] + owner.offset} for r in requests]


def biased(owner: Any, x: np.ndarray, bias: np.ndarray) -> dict[str, np.ndarray]:
    return {"y": x + bias + owner.offset}


def padded_sum(owner: Any, x: np.ndarray) -> dict[str, np.ndarray]:
    # One request of one row: the sum shows how many rows the padding made, and of what.
    return {"y": x.sum(axis=0, keepdims=True) + owner.offset}


def configs_in_requests(
    owner: Any, requests: list[Any], triton_context: Any
) -> list[dict[str, np.ndarray]]:
    size = triton_context.model_configs[owner].max_batch_size
    return [{"y": r["x"] + size + owner.offset} for r in requests]


def config_in_batch(owner: Any, x: np.ndarray, triton_context: Any) -> dict[str, np.ndarray]:
    return {"y": x + triton_context.model_configs[owner].max_batch_size + owner.offset}


# -- the cases -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    decorators: tuple[Callable[..., Any], ...]  # outermost first, as written above a `def`
    body: Callable[..., Any]
    inputs: dict[str, np.ndarray]  # what the client sends
    expected: np.ndarray  # the answer of a function (a method adds METHOD_OFFSET)
    config: ModelConfig = dataclasses.field(default_factory=lambda: ModelConfig(max_batch_size=8))
    tensors: tuple[Tensor, ...] = (Tensor(name="x", shape=(-1,), dtype=F32),)


BIAS = fill_optionals(bias=np.array([100.0], F32))
ONE_COLUMN = Tensor(name="x", shape=(1,), dtype=F32)
OPTIONAL_BIAS = Tensor(name="bias", shape=(1,), dtype=F32, optional=True)
SCALE = Tensor(name="scale", shape=(1,), dtype=F32)
HALF = np.full((3, 1), 0.5, F32)

CASES = [
    Case("batch", (batch,), add_offset, {"x": X}, X),
    Case(
        "sample",
        (sample,),
        add_offset,
        {"x": X[0]},
        X[0],
        config=ModelConfig(batching=False),
    ),
    Case("group_by_keys", (group_by_keys,), each_request, {"x": X}, X),
    Case("group_by_keys_batch", (group_by_keys, batch), add_offset, {"x": X}, X),
    Case(
        "batch_group_by_values",
        (batch, group_by_values("mode")),
        by_mode,
        {"x": X, "mode": np.array([[0], [1], [0]], np.int32)},
        np.array([[2, 4], [-3, -4], [10, 12]], F32),
        tensors=(
            Tensor(name="x", shape=(-1,), dtype=F32),
            Tensor(name="mode", shape=(1,), dtype=np.int32),
        ),
    ),
    Case(
        "first_value",
        (first_value("scale"),),
        scaled_requests,
        {"x": X, "scale": HALF},
        X * 0.5,
        tensors=(Tensor(name="x", shape=(-1,), dtype=F32), SCALE),
    ),
    Case(
        "batch_first_value",
        (batch, first_value("scale")),
        scaled,
        {"x": X, "scale": HALF},
        X * 0.5,
        tensors=(Tensor(name="x", shape=(-1,), dtype=F32), SCALE),
    ),
    Case(
        "fill_optionals",
        (BIAS,),
        biased_requests,
        {"x": X[:, :1]},
        X[:, :1] + 100,
        tensors=(ONE_COLUMN, OPTIONAL_BIAS),
    ),
    Case(
        "fill_optionals_batch",
        (BIAS, batch),
        biased,
        {"x": X[:, :1]},
        X[:, :1] + 100,
        tensors=(ONE_COLUMN, OPTIONAL_BIAS),
    ),
    Case(
        "batch_pad_batch",
        (batch, pad_batch),
        padded_sum,
        {"x": np.array([[7.0]], F32)},
        np.array([[28.0]], F32),  # padded to the preferred size 4 with copies of the last row
        config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(preferred_batch_size=[4])),
        tensors=(ONE_COLUMN,),
    ),
    Case(
        "triton_context",
        (triton_context,),
        configs_in_requests,
        {"x": X},
        X + 7,
        config=ModelConfig(max_batch_size=7),
    ),
    Case(
        "triton_context_batch",
        (triton_context, batch),
        config_in_batch,
        {"x": X},
        X + 7,
        config=ModelConfig(max_batch_size=7),
    ),
]


def decorate(case: Case, function: Callable[..., Any]) -> Callable[..., Any]:
    for decorator in reversed(case.decorators):
        function = decorator(function)
    return function


class Plain:
    """What a plain function's body gets for ``owner``."""

    offset = 0.0


def infer_func(case: Case, kind: str) -> Any:
    """The case's body as ``kind`` of callable, decorated as a user would decorate it."""
    if kind == "function":

        def function(*args: Any, **kwargs: Any) -> Any:
            return case.body(Plain(), *args, **kwargs)

        return decorate(case, function)

    class Model:
        offset = METHOD_OFFSET

        # In a class body, as `@batch` etc. above `def infer` and `def __call__`.
        def infer(self, *args: Any, **kwargs: Any) -> Any:
            return case.body(self, *args, **kwargs)

        __call__ = decorate(case, infer)
        infer = decorate(case, infer)

    if kind == "method":
        return Model().infer
    return [Model(), Model()]  # one instance each


# -- the server ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client() -> Iterator[httpclient.InferenceServerClient]:
    config = TritonConfig(**loopback_options())
    http = config.http_port
    triton = Triton(config=config)
    for case in CASES:
        for kind in KINDS:
            triton.bind(
                f"{case.name}_{kind}",
                infer_func(case, kind),
                inputs=list(case.tensors),
                outputs=[Tensor(name="y", shape=(-1,), dtype=F32)],
                config=case.config,
            )
    triton.run()
    http_client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
    yield http_client
    http_client.close()
    triton.stop()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_decorators_work_on_functions_methods_and_call(
    client: httpclient.InferenceServerClient, case: Case, kind: str
) -> None:
    model = f"{case.name}_{kind}"
    tensors = []
    for name, value in case.inputs.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    answer = client.infer(model, tensors).as_numpy("y")
    offset = 0.0 if kind == "function" else METHOD_OFFSET
    np.testing.assert_allclose(answer, case.expected + offset)
    if kind == "call":
        assert client.get_model_config(model)["instance_group"][0]["count"] == 2
