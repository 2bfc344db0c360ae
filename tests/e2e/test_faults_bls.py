"""Fault injection: BLS calls that would wait for the calling instance itself. Every form of
self-call and cycle (blocking ``exec``, ``async_exec`` from ``async def execute``,
``exec(decoupled=True)``, two models calling each other, a call to an ensemble whose step is
the caller), in every instance mode, is refused at once or completes; none leaves a model
stuck."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import RunningServer, start_server
from tests.e2e.models_on_disk import write_model

MODES = ["process", "thread", "auto"]
ANSWER_WITHIN_S = 20  # a stuck call would wait for the client's deadline
REFUSAL = "cannot take this call"

# A model that calls TARGET with the request's input (and its depth one higher), by HOW, and
# answers with the callee's answer or its error; at depth LAST it answers the input itself.
CALLER = """
import json

import triton_python_backend_utils as pb_utils

TARGET, HOW, LAST = "{target}", "{how}", {last}


def _depth(request):
    return json.loads(request.parameters() or "{{}}").get("depth", 0)


def _call(request):
    x = pb_utils.get_input_tensor_by_name(request, "X")
    return pb_utils.InferenceRequest(
        model_name=TARGET,
        requested_output_names=["Y"],
        inputs=[x],
        parameters={{"depth": _depth(request) + 1}},
    )


def _answer(request, called):
    if called is None:
        y = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
        return pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)])
    if called.has_error():
        error = pb_utils.TritonError("inner: " + called.error().message())
        return pb_utils.InferenceResponse(error=error)
    return pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(called, "Y")])


class TritonPythonModel:
{execute}
"""

BLOCKING = """
    def execute(self, requests):
        return [
            _answer(r, None if _depth(r) >= LAST else _call(r).exec()) for r in requests
        ]
"""

ASYNC = """
    async def execute(self, requests):
        answers = []
        for r in requests:
            answers.append(_answer(r, None if _depth(r) >= LAST else await _call(r).async_exec()))
        return answers
"""

STREAMED = """
    def execute(self, requests):
        for r in requests:
            called = None
            if _depth(r) < LAST:
                try:
                    for called in _call(r).exec(decoupled=True):
                        pass
                except pb_utils.TritonModelException as refused:
                    error = pb_utils.TritonError("inner: " + str(refused))
                    called = pb_utils.InferenceResponse(error=error)
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            r.get_response_sender().send(_answer(r, called), flags=final)
        return None
"""

CONFIG = """
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters {{ key: "TRITONFAST_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }}
{policy}
"""

ENSEMBLE = """
platform: "ensemble"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "{step}" model_version: -1
  input_map {{ key: "X" value: "X" }} output_map {{ key: "Y" value: "Y" }}
}} ] }}
"""

# (form, the model a client calls, whether the call is refused or completes)
FORMS = [
    ("self-exec", "self_exec", True),
    ("self-exec-two-instances", "self_exec2", False),
    ("self-async", "self_async", True),
    ("self-stream", "self_stream", True),
    ("cycle", "cycle_a", True),
    ("through-ensemble", "via_ensemble", True),
]


def _caller(repository: Path, name: str, mode: str, **options: object) -> None:
    how = str(options.get("how", "exec"))
    execute = {"exec": BLOCKING, "async": ASYNC, "stream": STREAMED}[how]
    policy = "model_transaction_policy { decoupled: true }" if how == "stream" else ""
    write_model(
        repository,
        f"{name}_{mode}",
        CONFIG.format(count=options.get("count", 1), mode=mode, policy=policy),
        CALLER.format(
            target=f"{options['target']}_{mode}",
            how=how,
            last=options.get("last", 1),
            execute=execute,
        ),
    )


def _repository(root: Path) -> Path:
    repository = root / "models"
    for mode in MODES:
        _caller(repository, "self_exec", mode, target="self_exec")
        _caller(repository, "self_exec2", mode, target="self_exec2", count=2)
        _caller(repository, "self_async", mode, target="self_async", how="async")
        _caller(repository, "self_stream", mode, target="self_stream", how="stream")
        _caller(repository, "cycle_a", mode, target="cycle_b", last=2)
        _caller(repository, "cycle_b", mode, target="cycle_a", last=2)
        _caller(repository, "via_ensemble", mode, target="ensemble", last=2)
        (repository / f"ensemble_{mode}" / "1").mkdir(parents=True)
        (repository / f"ensemble_{mode}" / "config.pbtxt").write_text(
            ENSEMBLE.format(step=f"via_ensemble_{mode}")
        )
    return repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("bls_cycles")
    running = start_server([_repository(root)], root / "server.log")
    yield running
    assert running.stop() == 0, running.log()


_values = itertools.count(1)


def _ask(client: grpcclient.InferenceServerClient, model: str, depth: int = 0) -> str | float:
    """The model's answer to one request on a stream (any model takes those): its Y, or the
    text of its error."""
    import queue

    answers: queue.Queue = queue.Queue()
    value = float(next(_values))
    x = grpcclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([value], dtype=np.float32))
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, [x], parameters={"depth": depth})
        result, error = answers.get(timeout=ANSWER_WITHIN_S)
    finally:
        client.stop_stream()
    if error is not None:
        return str(error)
    y = float(result.as_numpy("Y")[0])
    assert y == value
    return y


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("form", "model", "refused"), FORMS, ids=[f[0] for f in FORMS])
def test_a_call_that_would_wait_for_its_caller_is_refused_or_completes(
    server, mode, form, model, refused
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        answer = _ask(client, f"{model}_{mode}")
        if refused:
            assert isinstance(answer, str) and REFUSAL in answer, answer
        else:
            assert isinstance(answer, float), answer
        # Nothing is left stuck: the model answers its next request (one it runs itself).
        assert isinstance(_ask(client, f"{model}_{mode}", depth=2), float)
    finally:
        client.close()
