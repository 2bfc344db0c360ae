"""Two in-process servers in one program, with models of the same names: each one's ensembles
and BLS calls reach its own models, never the other's (no state shared between them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonfast import Server

from tests.e2e.loopback import loopback_options
from tests.e2e.models_on_disk import bls_caller, write_model

IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

# Adds its repository's OFFSET.
STEP = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.offset = float(parameters["OFFSET"]["string_value"])

    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + self.offset)]))
        return answers
"""

ENSEMBLE = (
    """
platform: "ensemble"
"""
    + IO
    + """
ensemble_scheduling { step [ {
  model_name: "step" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" }
} ] }
"""
)

MODES = ("process", "thread")


def _repository(root: Path, offset: int) -> Path:
    repository = root / f"models_{offset}"
    step_config = 'backend: "python"\n' + IO
    step_config += f'parameters {{ key: "OFFSET" value: {{ string_value: "{offset}" }} }}\n'
    write_model(repository, "step", step_config, STEP)
    for mode in MODES:
        config = 'backend: "python"\n' + IO
        config += (
            'parameters { key: "TRITONFAST_INSTANCE_MODE"'
            f' value: {{ string_value: "{mode}" }} }}\n'
        )
        write_model(repository, f"caller_{mode}", config, bls_caller("step"))
    (repository / "ensemble" / "1").mkdir(parents=True)
    (repository / "ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    return repository


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, str]]:
    """Two servers, one whose step adds 1 and one whose step adds 100: offset -> HTTP url."""
    root = tmp_path_factory.mktemp("two_servers")
    running: list[Server] = []
    urls = {}
    try:
        for offset in (1, 100):
            options = loopback_options()
            server = Server(_repository(root, offset), **options)
            server.run()
            running.append(server)
            urls[offset] = f"127.0.0.1:{options['http_port']}"
        yield urls
    finally:
        for server in running:
            server.stop()


@pytest.mark.parametrize("model", ["step", "ensemble", *(f"caller_{mode}" for mode in MODES)])
def test_each_server_reaches_its_own_models(servers, model) -> None:
    for offset, url in servers.items():
        client = httpclient.InferenceServerClient(url)
        try:
            x = httpclient.InferInput("X", [1], "FP32")
            x.set_data_from_numpy(np.array([5.0], dtype=np.float32))
            answer = client.infer(model, [x]).as_numpy("Y").tolist()
        finally:
            client.close()
        assert answer == [5.0 + offset], (model, offset, answer)
