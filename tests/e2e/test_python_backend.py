"""Triton Python-backend models running unchanged in tritonfast, driven by tritonclient."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.e2e.models_on_disk import write_model


@pytest.fixture
def http(server):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    yield client
    client.close()


def add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_add_sub_example_model(http) -> None:
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    result = http.infer("add_sub", add_sub_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["model_version"] == "1"


def test_string_example_model(http) -> None:
    text = np.array([[b"hello", b"w\x00rld"]], dtype=np.object_)
    tensor = httpclient.InferInput("TEXT", [1, 2], "BYTES")
    tensor.set_data_from_numpy(text)
    result = http.infer("string_upper", [tensor])
    assert result.as_numpy("UPPER").tolist() == [[b"HELLO", b"W\x00RLD"]]


def test_exception_in_execute_is_an_error_and_server_keeps_serving(http) -> None:
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    with pytest.raises(InferenceServerException) as info:
        http.infer("raiser", [tensor])
    # Triton's layout: the instance, the exception, and an "At:" block of the model's frames.
    # A model without instance_group has one instance named after it, "<model>_0"; the
    # "At:" block holds the model's frames only, not the server's around it.
    message = info.value.message()
    assert re.fullmatch(
        r"Failed to process the request\(s\) for model 'raiser_0', message:"
        r" ValueError: raiser always fails\n\nAt:\n  \S+/raiser/1/model\.py\(6\): execute\n",
        message,
    ), message
    assert info.value.status() == "500"
    # Other models, and the failing one, still answer.
    assert http.is_model_ready("raiser")
    a = np.ones(4, dtype=np.float32)
    np.testing.assert_array_equal(
        http.infer("add_sub", add_sub_inputs(a, a)).as_numpy("OUTPUT0"), 2 * a
    )


def test_error_response_from_model(http) -> None:
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    with pytest.raises(InferenceServerException, match="custom error from model"):
        http.infer("err_resp", [tensor])


def test_auto_complete_config_is_served_and_used(server, http) -> None:
    config = http.get_model_config("auto_complete")
    assert config["max_batch_size"] == 4
    assert [i["name"] for i in config["input"]] == ["X"]
    assert [o["name"] for o in config["output"]] == ["Y"]
    assert "dynamic_batching" in config
    metadata = http.get_model_metadata("auto_complete")
    assert metadata["inputs"][0]["shape"] == [-1, 2]
    x = httpclient.InferInput("X", [3, 2], "FP32")
    data = np.arange(6, dtype=np.float32).reshape(3, 2)
    x.set_data_from_numpy(data)
    np.testing.assert_array_equal(http.infer("auto_complete", [x]).as_numpy("Y"), data * 2)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        grpc_config = grpc.get_model_config("auto_complete", as_json=True)["config"]
        assert grpc_config["max_batch_size"] == 4
    finally:
        grpc.close()


def test_request_id_and_parameters_reach_the_model(http) -> None:
    tensor = httpclient.InferInput("INPUT0", [2], "INT32")
    tensor.set_data_from_numpy(np.array([5, 6], dtype=np.int32))
    result = http.infer(
        "params", [tensor], request_id="req-42", parameters={"alpha": 3, "tag": "x"}
    )
    response = result.get_response()
    assert response["id"] == "req-42"
    assert response["parameters"]["alpha"] == 3
    assert response["parameters"]["tag"] == "x"
    assert response["parameters"]["seen_request_id"] == "req-42"


def test_dynamic_batching_groups_concurrent_requests(server) -> None:
    # tritonclient.http is gevent-based: concurrency comes from async_infer, not threads.
    client = httpclient.InferenceServerClient(server.http_url, concurrency=16)
    try:
        pending = []
        for i in range(48):
            tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
            data = np.full((1, 3), i, dtype=np.float32)
            tensor.set_data_from_numpy(data)
            pending.append((data, client.async_infer("batching", [tensor])))
        counts = []
        for data, request in pending:
            result = request.get_result()
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
            counts.append(int(result.as_numpy("BATCH_REQUESTS")[0, 0]))
        assert max(counts) > 1, f"no request shared an execution: {counts}"
        assert max(counts) <= 16
    finally:
        client.close()


def test_initialize_receives_tritons_args(server, tmp_path) -> None:
    # add_sub's initialize reads args["model_config"]; a wrong key would have failed loading.
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        config = client.get_model_config("add_sub")
        assert json.loads(json.dumps(config))["name"] == "add_sub"
        assert client.is_model_ready("add_sub")
    finally:
        client.close()


def test_served_config_has_tritons_normalised_defaults(http) -> None:
    config = http.get_model_config("add_sub")
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["instance_group"][0]["name"] == "add_sub_0"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 1
    assert config["default_model_filename"] == "model.py"
    assert config["optimization"]["input_pinned_memory"] == {"enable": True}
    batching = http.get_model_config("auto_complete")["dynamic_batching"]
    assert batching["preferred_batch_size"] == [4]  # = max_batch_size, as Triton fills it


EXTRA_OUTPUT_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
EXTRA_OUTPUT_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", x), pb_utils.Tensor("UNDECLARED", x * 2)]
            ))
        return responses
"""


def test_an_output_the_config_does_not_declare_is_dropped(tmp_path) -> None:
    write_model(tmp_path / "repo", "extra_output", EXTRA_OUTPUT_CONFIG, EXTRA_OUTPUT_MODEL)
    server = start_server([tmp_path / "repo"], tmp_path / "server.log")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("X", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
        result = client.infer("extra_output", [tensor])
        assert [o["name"] for o in result.get_response()["outputs"]] == ["Y"]
        client.close()
    finally:
        assert server.stop() == 0


EXITER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "CALLS" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "MODE" } }
"""
EXITER_MODEL = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        self.calls += 1
        if pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0] == 7:
            sys.exit(3)
        calls = np.array([self.calls], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("CALLS", calls)]) for _ in requests]
"""

# Two requests in one batch: the one with X == 1 is answered through its response sender and
# left None in the returned list, the other by the list.
HALF_SENDER_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 10000000 }
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "MODE" } }
"""
HALF_SENDER_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        returned = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)])
            if x[0, 0] == 1:
                request.get_response_sender().send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
                returned.append(None)
            else:
                returned.append(response)
        return returned
"""

# Sends its response, then a second one, which raises (a default model sends one): the error
# escapes execute, and the client gets the first response, as from Triton.
TWICE_SENDER_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("CALLS", x)]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("CALLS", x * 2)]))
        return None
"""

DECOUPLED_RETURNER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "MODE" } }
"""
DECOUPLED_RETURNER_MODEL = """
class TritonPythonModel:
    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_what_a_model_returns_or_raises_is_taken_as_tritons_stub_takes_it(tmp_path, mode) -> None:
    repo = tmp_path / "repo"
    for name, config, model in (
        ("exiter", EXITER_CONFIG, EXITER_MODEL),
        ("half_sender", HALF_SENDER_CONFIG, HALF_SENDER_MODEL),
        ("decoupled_returner", DECOUPLED_RETURNER_CONFIG, DECOUPLED_RETURNER_MODEL),
        ("twice_sender", EXITER_CONFIG, TWICE_SENDER_MODEL),
    ):
        write_model(repo, name, config.replace("MODE", mode), model)
    server = start_server([repo], tmp_path / "server.log")
    client = httpclient.InferenceServerClient(server.http_url, concurrency=2)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def x_input(module, value: int, shape: list[int]):
        tensor = module.InferInput("X", shape, "INT32")
        tensor.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
        return [tensor]

    try:
        # sys.exit() in execute fails that call, as any exception does; the model lives on.
        assert client.infer("exiter", x_input(httpclient, 1, [1])).as_numpy("CALLS")[0] == 1
        with pytest.raises(InferenceServerException) as info:
            client.infer("exiter", x_input(httpclient, 7, [1]))
        assert info.value.message().startswith(
            "Failed to process the request(s) for model 'exiter_0', message: SystemExit: 3"
        )
        assert client.infer("exiter", x_input(httpclient, 1, [1])).as_numpy("CALLS")[0] == 3

        # None in the returned list: that request's response went through its sender.
        pending = [
            client.async_infer("half_sender", x_input(httpclient, value, [1, 1]))
            for value in (1, 2)
        ]
        assert [p.get_result().as_numpy("Y").tolist() for p in pending] == [[[10]], [[20]]]

        # A response sent before execute failed is the one the client gets.
        assert client.infer("twice_sender", x_input(httpclient, 4, [1])).as_numpy("CALLS") == [4]

        # A decoupled model that returns something gets Triton's error on its stream.
        answers: list = []
        grpc.start_stream(callback=lambda result, error: answers.append(error))
        grpc.async_stream_infer("decoupled_returner", x_input(grpcclient, 1, [1]))
        grpc.stop_stream()
        assert [str(error) for error in answers] == [
            "Failed to process the request(s) for model 'decoupled_returner_0', message:"
            " Python model 'decoupled_returner_0' is using the decoupled mode and the"
            " execute function must return None."
        ]
    finally:
        client.close()
        grpc.close()
        assert server.stop() == 0


LOADER_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "MODE" } }
"""
LOADER_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

UPLOADED_CONFIG = json.dumps({
    "backend": "python",
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}],
})
UPLOADED_MODEL = b"""
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y",
            pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 100)]) for r in requests]
"""


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            asked = json.loads(request.parameters())
            action, target = asked["action"], asked["target"]
            if action == "ready":
                result = pb_utils.is_model_ready(target, asked.get("version", ""))
            elif action == "load":
                result = pb_utils.load_model(target)
            elif action == "upload":
                result = pb_utils.load_model(
                    target, UPLOADED_CONFIG, {"file:1/model.py": UPLOADED_MODEL}
                )
            else:
                result = pb_utils.unload_model(target)
            text = np.array([str(result).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", text)]))
        return responses
'''


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_model_loads_and_unloads_models_with_tritons_model_loading_api(tmp_path, mode) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "loader", LOADER_CONFIG.replace("MODE", mode), LOADER_MODEL)
    write_model(repo, "extra_output", EXTRA_OUTPUT_CONFIG, EXTRA_OUTPUT_MODEL)
    server = start_server(
        [repo], tmp_path / "server.log", "--model-control-mode=explicit", "--load-model=loader"
    )
    client = httpclient.InferenceServerClient(server.http_url)

    def ask(action: str, target: str, **more: str) -> str:
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        parameters = {"action": action, "target": target, **more}
        result = client.infer("loader", [tensor], parameters=parameters)
        return result.as_numpy("RESULT")[0].decode()

    try:
        assert ask("ready", "extra_output") == "False"
        assert ask("load", "extra_output") == "None"
        assert client.is_model_ready("extra_output")
        assert ask("ready", "extra_output") == "True"
        assert ask("ready", "extra_output", version="1") == "True"
        assert ask("unload", "extra_output") == "None"
        assert not client.is_model_ready("extra_output")

        assert ask("upload", "uploaded") == "None"  # a config and files, not on disk
        tensor = httpclient.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([5], dtype=np.int32))
        assert client.infer("uploaded", [tensor]).as_numpy("Y").tolist() == [105]

        with pytest.raises(InferenceServerException) as info:
            ask("load", "no_such_model")
        assert "TritonModelException: Failed to load model: " in info.value.message()
        assert "no_such_model" in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            ask("ready", "extra_output", version="abc")
        assert (
            "Failed to check model readiness: failed to get model version from specified"
            " version string 'abc', version should be an integral value > 0"
        ) in info.value.message()
    finally:
        client.close()
        assert server.stop() == 0
