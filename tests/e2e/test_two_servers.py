"""Two in-process servers in one program, with models of the same names: each one's ensembles
and BLS calls reach its own models, never the other's; each has its own bound callables,
custom metrics and request-body budget (no state shared between them)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from tritonfast import Server, Tensor, batch

from tests.e2e.loopback import loopback_options
from tests.e2e.models_on_disk import bls_caller, write_model
from tests.e2e.test_metrics import scrape

IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

# Adds its repository's OFFSET.
STEP = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.offset = float(parameters["OFFSET"]["string_value"])
        # Each request adds the offset to a custom counter, labelled with the model's name.
        self.family = pb_utils.MetricFamily(
            "two_servers_offsets", "offsets added", pb_utils.MetricFamily.COUNTER
        )
        self.added = self.family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + self.offset)]))
            self.added.increment(self.offset)
        return answers
"""

ENSEMBLE = (
    """
platform: "ensemble"
"""
    + IO
    + """
ensemble_scheduling { step [ {
  model_name: "step_process" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" }
} ] }
"""
)

MODES = ("process", "thread")
# The request-body budget of the server whose offset is 1 (the other keeps the default).
SMALL_BUDGET = 1 << 20


def _repository(root: Path, offset: int) -> Path:
    repository = root / f"models_{offset}"
    for mode in MODES:
        mode_parameter = (
            'parameters { key: "TRITONFAST_INSTANCE_MODE"'
            f' value: {{ string_value: "{mode}" }} }}\n'
        )
        step_config = 'backend: "python"\n' + IO + mode_parameter
        step_config += f'parameters {{ key: "OFFSET" value: {{ string_value: "{offset}" }} }}\n'
        write_model(repository, f"step_{mode}", step_config, STEP)
        config = 'backend: "python"\n' + IO + mode_parameter
        write_model(repository, f"caller_{mode}", config, bls_caller("step_process"))
    (repository / "ensemble" / "1").mkdir(parents=True)
    (repository / "ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    return repository


@dataclass
class Running:
    http_url: str
    metrics_url: str


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Running]]:
    """Two servers, one whose models add 1 (and whose body budget is 1 MiB) and one whose
    models add 100, each with a bound callable ``scale`` that multiplies by its offset."""
    root = tmp_path_factory.mktemp("two_servers")
    running: list[Server] = []
    found = {}
    try:
        for offset in (1, 100):
            options = loopback_options()
            if offset == 1:
                options["request_body_budget_bytes"] = SMALL_BUDGET
            server = Server(_repository(root, offset), **options)
            server.bind("scale", _scaling(offset), [_vector("X")], [_vector("Y")])
            server.run()
            running.append(server)
            found[offset] = Running(
                f"127.0.0.1:{options['http_port']}", f"127.0.0.1:{options['metrics_port']}"
            )
        yield found
    finally:
        for server in running:
            server.stop()


def _vector(name: str) -> Tensor:
    return Tensor(name=name, shape=(-1,), dtype=np.float32)


def _scaling(factor: int) -> Any:
    @batch
    def scale(X: np.ndarray) -> dict[str, np.ndarray]:
        return {"Y": X * factor}

    return scale


def _infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url)
    try:
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer(model, [tensor]).as_numpy("Y")
    finally:
        client.close()


@pytest.mark.parametrize(
    "model", ["ensemble", *(f"{kind}_{mode}" for kind in ("step", "caller") for mode in MODES)]
)
def test_each_server_reaches_its_own_models(servers, model) -> None:
    for offset, server in servers.items():
        answer = _infer(server.http_url, model, np.array([5.0], np.float32)).tolist()
        assert answer == [5.0 + offset], (model, offset, answer)


def test_each_server_runs_its_own_bound_callables(servers) -> None:
    for offset, server in servers.items():
        answer = _infer(server.http_url, "scale", np.array([[2.0]], np.float32)).tolist()
        assert answer == [[2.0 * offset]], (offset, answer)


def test_each_server_shows_its_own_models_metrics(servers) -> None:
    """A model's custom counter (in a worker process, or in the server's own) counts on its
    server's /metrics only: each request adds the server's offset."""
    before = {offset: _offsets_added(server) for offset, server in servers.items()}
    for server in servers.values():
        for mode in MODES:
            for _ in range(3):
                _infer(server.http_url, f"step_{mode}", np.array([0.0], np.float32))
    for offset, server in servers.items():
        after = _offsets_added(server)
        for mode in MODES:
            model = f"step_{mode}"
            assert after[model] - before[offset].get(model, 0.0) == 3 * offset, (offset, after)


def _offsets_added(server: Running) -> dict[str, float]:
    """The two_servers_offsets counter of each model on the server's /metrics."""
    _, samples = scrape(server)
    return {
        dict(labels)["model"]: value
        for (name, labels), value in samples.items()
        if name == "two_servers_offsets"
    }


def test_each_server_has_its_own_body_budget(servers) -> None:
    """A 2 MiB body is past the 1 MiB budget of one server, and within the other's."""
    x = np.zeros(1 << 19, np.float32)  # 2 MiB
    with pytest.raises(InferenceServerException) as refused:
        _infer(servers[1].http_url, "step_thread", x)
    assert refused.value.status() == "503"
    assert f"past its budget of {SMALL_BUDGET} bytes" in refused.value.message()
    assert (_infer(servers[100].http_url, "step_thread", x) == x + 100).all()
