"""Calls models make (BLS ``exec()``) that the core takes over the worker's channel
(``rust/src/lane/call.rs``) against the same calls made through the server's Python: a model
that makes whatever call its request describes (target, version, inputs of every kind, outputs
asked for; targets that refuse the call, that do not exist, that are not on a lane) runs on a
server whose core takes its calls and on one with ``--backend-config=python,core-path=off``;
what each call came to must be the same, to the byte."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TEST_MODELS, RunningServer
from tests.e2e.corepair import server_pair

PROBE = textwrap.dedent(
    """
    import json

    import numpy as np
    import triton_python_backend_utils as pb_utils


    def _described(tensor):
        array = tensor.as_numpy()
        values = array.reshape(-1).tolist()
        if array.dtype == np.object_:
            values = [v.decode("latin-1") for v in values]
        return [tensor.name(), array.dtype.str, list(array.shape), values]


    def _call(request):
        plan = json.loads(pb_utils.get_input_tensor_by_name(request, "PLAN").as_numpy()[0])
        inputs = []
        for name, dtype, shape, values in plan["inputs"]:
            if dtype == "object":
                values = [v.encode("latin-1") for v in values]
            array = np.array(values, dtype=dtype).reshape(shape)
            inputs.append(pb_utils.Tensor(name, array))
        return pb_utils.InferenceRequest(
            model_name=plan["model"],
            model_version=plan["version"],
            inputs=inputs,
            requested_output_names=plan["outputs"],
            request_id=plan["id"],
        )


    def _response(answer):
        if answer.has_error():
            text = "error " + answer.error().message()
        else:
            text = json.dumps(sorted(_described(t) for t in answer.output_tensors()))
        result = np.array([text.encode()], dtype=np.object_)
        return pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", result)])


    class TritonPythonModel:
        def execute(self, requests):
            return [_response(_call(request).exec()) for request in requests]
    """
)
# The same with `async_exec()`, the batch's calls made at once.
ASYNC_EXECUTE = """
    class TritonPythonModel:
        async def execute(self, requests):
            calls = [_call(request).async_exec() for request in requests]
            return [_response(answer) for answer in await asyncio.gather(*calls)]
"""
CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "PLAN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
# Call targets: identity models of several datatypes, a model that fails every request, and
# names no model has.
TARGETS = {
    "raiser": "float32",
    "identity_fp32": "float32",
    "identity_int64": "int64",
    "identity_bool": "bool",
    "identity_bytes": "object",
    "identity_uint8": "uint8",
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    root = tmp_path_factory.mktemp("core_calls")
    head, _, _ = PROBE.partition("class TritonPythonModel")
    for name, code in [
        ("bls_probe", PROBE),
        ("bls_probe_async", "import asyncio\n" + head + textwrap.dedent(ASYNC_EXECUTE)),
    ]:
        model = root / "models" / name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(CONFIG)
        (model / "1" / "model.py").write_text(code)
    repositories = [TEST_MODELS, root / "models"]
    yield from server_pair(repositories, root)


@pytest.fixture(scope="module")
def clients(servers: tuple[RunningServer, ...]) -> Iterator[tuple[Any, Any]]:
    pair = tuple(httpclient.InferenceServerClient(s.http_url) for s in servers)
    yield pair
    for client in pair:
        client.close()


@st.composite
def plans(draw: Any) -> dict[str, Any]:
    model = draw(st.sampled_from([*TARGETS, "no_such_model"]))
    dtype = TARGETS.get(model, "float32")
    shape = [draw(st.integers(1, 2)), draw(st.integers(0, 3))]
    if draw(st.integers(0, 8)) == 0:
        shape = shape[1:]  # no batch dimension: the target refuses it
    if model == "raiser":  # (no batching: [1] it takes, and fails)
        shape = [1]
    count = int(np.prod(shape))
    if dtype == "object":
        values: list[Any] = draw(st.lists(st.text(max_size=4), min_size=count, max_size=count))
        values = [v.encode("utf-8").decode("latin-1") for v in values]
    elif dtype == "bool":
        values = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    else:
        values = draw(st.lists(st.integers(0, 200), min_size=count, max_size=count))
    name = "INPUT0" if draw(st.integers(0, 10)) else "WRONG"
    return {
        "model": model,
        "version": draw(st.sampled_from([-1, -1, 1, 7])),
        "inputs": [[name, dtype, shape, values]],
        "outputs": draw(st.sampled_from([["OUTPUT0"], [], ["NOPE"]])),
        "id": draw(st.sampled_from(["", "call-1"])),
    }


def _result(client: Any, plan: dict[str, Any], probe: str = "bls_probe") -> str:
    tensor = httpclient.InferInput("PLAN", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(plan).encode()], dtype=np.object_))
    answer = client.infer(probe, [tensor])
    return bytes(answer.as_numpy("RESULT")[0]).decode()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(plans(), st.sampled_from(["bls_probe", "bls_probe_async"]))
def test_calls_the_core_takes_come_to_what_they_come_to_through_python(
    clients: tuple[Any, Any], plan: dict[str, Any], probe: str
) -> None:
    core, reference = clients
    assert _result(core, plan, probe) == _result(reference, plan, probe)


def test_a_call_answered_by_the_core_carries_its_tensors(clients: tuple[Any, Any]) -> None:
    plan = {
        "model": "identity_bytes",
        "version": -1,
        "inputs": [["INPUT0", "object", [1, 2], ["a", "bé"]]],
        "outputs": ["OUTPUT0"],
        "id": "x",
    }
    assert json.loads(_result(clients[0], plan)) == [["OUTPUT0", "|O", [1, 2], ["a", "bé"]]]
