"""The model repository extension and model control modes, against a server of our own.

The server runs with ``--model-control-mode=explicit`` over a temporary repository that the
tests write; a second one polls its repository.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, RunningServer, start_server

# A model whose answer says which generation of its code is running.
GENERATION_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "GENERATION" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { }
"""
GENERATION_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

GENERATION = {generation}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().shape[0]
            out = np.full((rows, 1), GENERATION, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("GENERATION", out)]))
        return responses
"""


def write_generation_model(repository: Path, name: str, generation: int, version: int = 1) -> None:
    model_dir = repository / name
    (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(GENERATION_CONFIG)
    (model_dir / str(version) / "model.py").write_text(
        GENERATION_MODEL.format(generation=generation)
    )


def generation_of(client: Any, module: Any, name: str = "generation") -> int:
    tensor = module.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
    return int(client.infer(name, [tensor]).as_numpy("GENERATION")[0, 0])


def wait_for(check: Callable[[], object], what: str, server: RunningServer | None = None) -> None:
    """Polls ``check`` until it holds; fails after 30 s (with the server's log, if given)."""
    deadline = time.monotonic() + 30
    while not check():
        if time.monotonic() > deadline:
            log = server.log() if server is not None else ""
            raise AssertionError(f"timed out waiting for {what}\n{log}")
        time.sleep(0.05)


def copy_add_sub(repository: Path, name: str) -> Path:
    """The add_sub example under another name, to be broken by the caller."""
    target = repository / name
    shutil.copytree(EXAMPLES / "add_sub", target)
    config = (target / "config.pbtxt").read_text().replace('"add_sub"', f'"{name}"')
    (target / "config.pbtxt").write_text(config)
    return target


def add_sub_inputs(module: Any) -> list[Any]:
    inputs = [module.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones(4, np.float32))
    return inputs


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    repository = tmp_path_factory.mktemp("repository")
    shutil.copytree(EXAMPLES / "add_sub", repository / "add_sub")
    shutil.copytree(EXAMPLES / "string_upper", repository / "string_upper")
    write_generation_model(repository, "generation", 1)
    broken = repository / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('backend: "python"\ninput [ this is not protobuf')
    invalid = repository / "invalid"  # parses; Triton fails its versions for an input's dims
    shutil.copytree(EXAMPLES / "add_sub" / "1", invalid / "1")
    (invalid / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    # Refused as Triton 2.51 refuses them: a backend it cannot find fails the versions, a
    # platform it does not know is refused while polling, no version leaves nothing to load.
    for name, first_line in (
        ("unknown_backend", 'backend: "doesnotexist"'),
        ("unknown_platform", 'platform: "nonsense_platform"'),
        ("no_versions", 'backend: "python"'),
        ("no_backend_found", ""),  # nor a version with a model file to tell it
    ):
        if name not in ("no_versions", "no_backend_found"):
            shutil.copytree(EXAMPLES / "add_sub" / "1", repository / name / "1")
        (repository / name).mkdir(exist_ok=True)
        (repository / name / "config.pbtxt").write_text(
            f"{first_line}\n"
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        )
    two_versions = copy_add_sub(repository, "second_version_fails")  # 2's initialize raises
    with (two_versions / "config.pbtxt").open("a") as config:
        config.write("version_policy: { all { } }\n")
    (two_versions / "2").mkdir()
    (two_versions / "2" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('version two refuses')\n"
        "\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )
    no_execute = copy_add_sub(repository, "no_execute")  # Triton loads it, fails its requests
    (no_execute / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        pass\n"
    )
    import_error = copy_add_sub(repository, "import_error")
    (import_error / "1" / "model.py").write_text("import not_a_module_anywhere\n")
    log_path = tmp_path_factory.mktemp("explicit") / "server.log"
    server = start_server(
        [repository], log_path, "--model-control-mode=explicit", "--load-model=add_sub"
    )
    yield server, repository
    assert server.stop() == 0, server.log()


def index(client: httpclient.InferenceServerClient) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in client.get_model_repository_index()}


def test_explicit_mode_loads_only_the_named_models(explicit: tuple[RunningServer, Path]) -> None:
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        rows = index(client)
        assert rows["add_sub"] == {
            "name": "add_sub",
            "version": "1",
            "state": "READY",
        }
        assert rows["string_upper"] == {"name": "string_upper"}
        assert set(rows) == {
            "add_sub",
            "string_upper",
            "generation",
            "broken",
            "invalid",
            "unknown_backend",
            "unknown_platform",
            "no_versions",
            "no_backend_found",
            "second_version_fails",
            "no_execute",
            "import_error",
        }
        assert not client.is_model_ready("string_upper")
        assert client.is_server_ready()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_and_unload(explicit: tuple[RunningServer, Path], protocol: str) -> None:
    server, _ = explicit
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        client.load_model("string_upper")
        assert client.is_model_ready("string_upper")
        text = module.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"abc"]], dtype=np.object_))
        assert client.infer("string_upper", [text]).as_numpy("UPPER")[0, 0] == b"ABC"
        client.unload_model("string_upper")
        assert not client.is_model_ready("string_upper")
        with pytest.raises(InferenceServerException, match="string_upper"):
            client.infer("string_upper", [text])
        rows = {
            r["name"]: r
            for r in httpclient.InferenceServerClient(server.http_url).get_model_repository_index()
        }
        # As Triton lists it: the version it served goes on being named.
        assert rows["string_upper"] == {
            "name": "string_upper",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        client.unload_model("string_upper")  # unloading again is not an error
    finally:
        client.close()


def test_reload_under_load_loses_nothing(explicit: tuple[RunningServer, Path]) -> None:
    server, repository = explicit
    admin = httpclient.InferenceServerClient(server.http_url)
    admin.load_model("generation")
    stop = threading.Event()
    seen: list[int] = []
    failures: list[str] = []

    def traffic() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            while not stop.is_set():
                try:
                    seen.append(generation_of(client, grpcclient))
                except InferenceServerException as error:
                    failures.append(str(error))
        finally:
            client.close()

    def answered(generation: int) -> Callable[[], bool]:
        """Whether the traffic has had answers from ``generation`` (a few per thread)."""
        return lambda: seen.count(generation) >= 20 or bool(failures)

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for generation in (2, 3, 4):
            wait_for(answered(generation - 1), f"answers from generation {generation - 1}")
            write_generation_model(repository, "generation", generation)
            admin.load_model("generation")  # a reload: the new code serves new requests
            assert generation_of(admin, httpclient) == generation
        wait_for(answered(4), "answers from generation 4")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        admin.close()
    assert failures == []
    assert len(seen) > 20
    assert set(seen) == {1, 2, 3, 4}
    # Generations only move forward for the requests of one client thread as a whole.
    assert seen[-1] == 4


def test_failed_reload_keeps_the_serving_version(explicit: tuple[RunningServer, Path]) -> None:
    server, repository = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        write_generation_model(repository, "generation", 5)
        client.load_model("generation")
        (repository / "generation" / "1" / "model.py").write_text("raise RuntimeError('broken')")
        with pytest.raises(InferenceServerException, match="broken"):
            client.load_model("generation")
        assert generation_of(client, httpclient) == 5
        assert index(client)["generation"]["state"] == "READY"
    finally:
        write_generation_model(repository, "generation", 5)
        client.close()


def test_reload_imports_helper_packages_afresh(explicit: tuple[RunningServer, Path]) -> None:
    """A helper package in a folder beside model.py is re-imported by a reload, as a helper
    module is."""
    server, repository = explicit
    model_dir = repository / "packaged"
    (model_dir / "1" / "packaged_helpers").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(GENERATION_CONFIG)
    model = GENERATION_MODEL.replace(
        "GENERATION = {generation}", "from packaged_helpers.values import GENERATION"
    )
    (model_dir / "1" / "model.py").write_text(model)
    (model_dir / "1" / "packaged_helpers" / "__init__.py").write_text("")
    values = model_dir / "1" / "packaged_helpers" / "values.py"
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        values.write_text("GENERATION = 1\n")
        client.load_model("packaged")
        assert generation_of(client, httpclient, "packaged") == 1
        values.write_text("GENERATION = 2\n")
        client.load_model("packaged")
        assert generation_of(client, httpclient, "packaged") == 2
    finally:
        client.unload_model("packaged")
        client.close()


# The configuration of a model loaded from uploaded files (GENERATION_MODEL's code).
UPLOADED_CONFIG = {
    "name": "uploaded",
    "backend": "python",
    "max_batch_size": 4,
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "GENERATION", "data_type": "TYPE_INT32", "dims": [1]}],
}


def test_config_override_and_files(explicit: tuple[RunningServer, Path]) -> None:
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    config = dict(UPLOADED_CONFIG)
    code = GENERATION_MODEL.format(generation=42).encode()
    try:
        # A model that is not on disk: configuration and code in the request.
        client.load_model("uploaded", config=json.dumps(config), files={"file:1/model.py": code})
        assert generation_of(client, httpclient, "uploaded") == 42
        assert client.get_model_config("uploaded")["max_batch_size"] == 4
        # Over gRPC too, with a changed configuration and new code (a reload).
        config["max_batch_size"] = 2
        code = GENERATION_MODEL.format(generation=43).encode()
        grpc.load_model("uploaded", config=json.dumps(config), files={"file:1/model.py": code})
        assert generation_of(grpc, grpcclient, "uploaded") == 43
        assert grpc.get_model_config("uploaded").config.max_batch_size == 2
        grpc.unload_model("uploaded")
    finally:
        client.close()
        grpc.close()


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("no_such_model", {}, "failed to poll from model repository: model not found"),
        (
            "broken",
            {},
            r"^\[500\] failed to load 'broken', failed to poll from model repository: failed to"
            " parse model configuration",
        ),
        (
            "invalid",
            {},
            r"^\[400\] load failed for model 'invalid': version 1 is at UNAVAILABLE state:"
            r" Invalid argument: model input 'INPUT0' must specify 'dims' for invalid;\n$",
        ),
        (
            "unknown_backend",
            {},
            r"^\[400\] load failed for model 'unknown_backend': version 1 is at UNAVAILABLE"
            r" state: Invalid argument: unable to find backend library for backend"
            r" 'doesnotexist', try specifying runtime on the model configuration\.;\n$",
        ),
        (
            "unknown_platform",
            {},
            r"^\[500\] failed to load 'unknown_platform', failed to poll from model repository:"
            r" unexpected platform type 'nonsense_platform' for unknown_platform$",
        ),
        (
            "no_versions",
            {},
            r"^\[400\] load failed for model 'no_versions': at least one version must be"
            r" available under the version policy of model 'no_versions'\n$",
        ),
        (
            "no_backend_found",
            {},
            r"^\[500\] failed to load 'no_backend_found', failed to poll from model repository:"
            r" Invalid model name: Could not determine backend for model 'no_backend_found' with"
            r" no backend in model configuration\. Expected model name of the form"
            r" 'model\.<backend_name>'\.$",
        ),
        (
            "import_error",
            {},
            r"^\[400\] load failed for model 'import_error': version 1 is at UNAVAILABLE state:"
            r" Internal: ModuleNotFoundError: No module named 'not_a_module_anywhere'\n\nAt:\n"
            r"  .*/import_error/1/model\.py\(1\): <module>\n",
        ),
        ("add_sub", {"config": "{not json"}, "Invalid config override"),
        ("add_sub", {"files": {"file:1/model.py": b"x"}}, "'config' must be specified"),
    ],
)
def test_load_errors(
    explicit: tuple[RunningServer, Path], name: str, kwargs: dict[str, Any], message: str
) -> None:
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException, match=message):
            client.load_model(name, **kwargs)
        assert client.is_model_ready("add_sub")  # nothing else is disturbed
        if not client.is_server_ready():  # failed versions count until the model is unloaded
            client.unload_model(name)
    finally:
        client.close()


def test_load_is_refused_without_explicit_mode(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        message = "explicit model load / unload is not allowed if polling is enabled"
        with pytest.raises(InferenceServerException, match=message) as info:
            client.load_model("add_sub")
        assert info.value.status() == "503"
        with pytest.raises(InferenceServerException, match=message):
            client.unload_model("add_sub")
        assert client.is_model_ready("add_sub")
        names = {row["name"] for row in client.get_model_repository_index()}
        assert {"add_sub", "string_upper"} <= names
    finally:
        client.close()


def test_poll_mode_follows_the_repository(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    write_generation_model(repository, "generation", 1)
    server = start_server(
        [repository],
        tmp_path / "server.log",
        "--model-control-mode=poll",
        "--repository-poll-secs=0.2",
    )
    client = httpclient.InferenceServerClient(server.http_url)

    try:
        assert generation_of(client, httpclient) == 1
        # A changed model reloads.
        write_generation_model(repository, "generation", 2)
        wait_for(lambda: generation_of(client, httpclient) == 2, "the reload", server)
        # A new version appears: the default policy (latest 1) serves it instead.
        write_generation_model(repository, "generation", 3, version=2)
        wait_for(
            lambda: client.get_model_metadata("generation")["versions"] == ["2"],
            "version 2",
            server,
        )
        assert generation_of(client, httpclient) == 3
        shutil.rmtree(repository / "generation" / "2")
        wait_for(
            lambda: client.get_model_metadata("generation")["versions"] == ["1"],
            "version 1 alone",
            server,
        )
        # A new model appears.
        shutil.copytree(EXAMPLES / "add_sub", repository / "add_sub")
        wait_for(lambda: client.is_model_ready("add_sub"), "add_sub to load", server)
        # A broken change leaves the serving version in place.
        (repository / "generation" / "1" / "model.py").write_text("raise RuntimeError('x')")
        wait_for(lambda: "RuntimeError: x" in server.log(), "a try of the broken model", server)
        assert generation_of(client, httpclient) == 2
        # A removed model unloads.
        shutil.rmtree(repository / "add_sub")
        wait_for(lambda: not client.is_model_ready("add_sub"), "add_sub to unload", server)
        with pytest.raises(InferenceServerException, match="not allowed"):
            client.load_model("generation")
    finally:
        client.close()
        assert server.stop() == 0, server.log()


def test_file_paths_must_stay_in_the_model_directory(explicit: tuple[RunningServer, Path]) -> None:
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    config = json.dumps({"name": "escape", "backend": "python"})
    try:
        with pytest.raises(InferenceServerException, match="inside the model directory"):
            client.load_model("escape", config=config, files={"file:../../evil.py": b"x"})
    finally:
        client.close()


def test_file_paths_that_cannot_be_written_are_the_callers_error(
    explicit: tuple[RunningServer, Path],
) -> None:
    server, _ = explicit
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    config = json.dumps({"name": "paths", "backend": "python"})
    too_long = {"file:" + "A" * 256: b"a"}  # a name longer than any filesystem takes
    file_then_dir = {"file:1/model.py": b"x = 1", "file:1/model.py/more": b"y"}
    try:
        for files in (too_long, file_then_dir):
            with pytest.raises(InferenceServerException, match="Invalid file path") as raised:
                http.load_model("paths", config=config, files=files)
            assert raised.value.status() == "400"
            with pytest.raises(InferenceServerException, match="Invalid file path") as raised:
                grpc.load_model("paths", config=config, files=files)
            assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert http.is_server_live()
    finally:
        http.close()
        grpc.close()


def test_a_failed_model_can_be_unloaded(explicit: tuple[RunningServer, Path]) -> None:
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException, match="load failed for model 'invalid'"):
            client.load_model("invalid")
        assert not client.is_server_ready()  # strict readiness: a model failed
        client.unload_model("invalid")
        assert index(client)["invalid"]["reason"] == "unloaded"
        assert client.is_server_ready()
    finally:
        client.close()


def test_a_model_refused_while_polling_is_listed_by_name_and_leaves_readiness(
    explicit: tuple[RunningServer, Path],
) -> None:
    # As Triton 2.51 does with a configuration that does not parse (or breaks a model-wide
    # rule): the load fails with INTERNAL, the index names the model and nothing else, the
    # server stays ready; a configuration whose inputs are wrong fails its versions instead.
    server, _ = explicit
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as raised:
            grpc.load_model("broken")
        assert raised.value.status() == "StatusCode.INTERNAL"
        assert index(http)["broken"] == {"name": "broken"}
        assert http.is_server_ready()
        with pytest.raises(InferenceServerException) as raised:
            grpc.load_model("invalid")
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert index(http)["invalid"] == {
            "name": "invalid",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "Invalid argument: model input 'INPUT0' must specify 'dims' for invalid",
        }
        assert not http.is_server_ready()
        http.unload_model("invalid")
        assert http.is_server_ready()
    finally:
        http.close()
        grpc.close()


def test_models_without_a_backend_or_a_version_are_listed_as_triton_lists_them(
    explicit: tuple[RunningServer, Path],
) -> None:
    # Observed on Triton 2.51 after each load failed: a missing backend library fails version 1,
    # an unknown platform leaves the name only, a model with no version is left out.
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        for name in ("unknown_backend", "unknown_platform", "no_versions"):
            with pytest.raises(InferenceServerException):
                client.load_model(name)
        rows = index(client)
        assert rows["unknown_backend"] == {
            "name": "unknown_backend",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "Invalid argument: unable to find backend library for backend"
            " 'doesnotexist', try specifying runtime on the model configuration.",
        }
        assert rows["unknown_platform"] == {"name": "unknown_platform"}
        assert "no_versions" not in rows
        assert client.is_model_ready("add_sub")
        client.unload_model("unknown_backend")
    finally:
        client.close()


def test_a_version_that_fails_stops_the_others_which_are_listed_unloaded(
    explicit: tuple[RunningServer, Path],
) -> None:
    # As Triton 2.51 answers it: the load fails with version 2's error, version 1 (which
    # loaded) is listed "unloaded", and requests name each version's state.
    server, _ = explicit
    client = httpclient.InferenceServerClient(server.http_url)
    name = "second_version_fails"
    inputs = add_sub_inputs(httpclient)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.load_model(name)
        assert raised.value.status() == "400"
        assert raised.value.message().startswith(
            f"load failed for model '{name}': version 2 is at UNAVAILABLE state: Internal:"
            " RuntimeError: version two refuses"
        )
        rows = [row for row in client.get_model_repository_index() if row["name"] == name]
        assert [(r["version"], r["state"]) for r in rows] == [
            ("1", "UNAVAILABLE"),
            ("2", "UNAVAILABLE"),
        ]
        assert rows[0]["reason"] == "unloaded"
        assert rows[1]["reason"].startswith("Internal: RuntimeError: version two refuses")
        for version, status, answer in (
            ("1", "503", "version 1 is not at ready state"),
            ("2", "503", "version 2 is not at ready state"),
            ("7", "404", "version 7 is not found"),
            ("", "404", "has no available versions"),
        ):
            with pytest.raises(InferenceServerException) as raised:
                client.infer(name, inputs, model_version=version)
            assert raised.value.message() == f"Request for unknown model: '{name}' {answer}"
            assert raised.value.status() == status
        client.unload_model(name)
        assert client.is_server_ready()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_without_execute_loads_and_fails_each_request(
    explicit: tuple[RunningServer, Path], protocol: str
) -> None:
    server, repository = explicit
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    inputs = add_sub_inputs(module)
    try:
        client.load_model("no_execute")
        with pytest.raises(InferenceServerException) as raised:
            client.infer("no_execute", inputs)
        model_file = repository / "no_execute" / "1" / "model.py"
        assert raised.value.message() == (
            "Failed to process the request(s) for model 'no_execute_0_0', message: Python model"
            f" {model_file} does not implement `execute` method."
        )
        assert client.is_model_ready("no_execute")
    finally:
        client.close()


def test_model_names_cannot_leave_the_repository(explicit: tuple[RunningServer, Path]) -> None:
    server, _ = explicit
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = json.dumps({"name": "x", "backend": "python"})
    try:
        for name in ("../escape", ".", "a/b"):
            with pytest.raises(InferenceServerException, match="invalid model name"):
                client.load_model(name, config=config, files={"file:1/model.py": b"x = 1"})
    finally:
        client.close()


def _left_by(pid: int) -> list[Path]:
    """The segments and temporary directories process ``pid`` made."""
    temp = Path(tempfile.gettempdir())
    return [
        *temp.glob(f"tritonfast-model-{pid}-*"),
        *(path for path in Path("/dev/shm").glob("tritonfast-*") if f"-{pid}-" in path.name),
    ]


def test_what_a_killed_server_left_is_swept_by_the_next_and_a_clean_stop_leaves_nothing(
    tmp_path: Path,
) -> None:
    config = {
        **UPLOADED_CONFIG,
        "parameters": {"TRITONFAST_INSTANCE_MODE": {"string_value": "process"}},
    }
    code = GENERATION_MODEL.format(generation=7).encode()
    for kill in (True, False):
        server = start_server(
            [EXAMPLES], tmp_path / f"server-{kill}.log", "--model-control-mode=explicit"
        )
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            client.load_model(
                "uploaded", config=json.dumps(config), files={"file:1/model.py": code}
            )
            assert generation_of(client, httpclient, "uploaded") == 7
            # A large body is received into a shared-memory object of the server's (this one
            # is refused: the model takes one value per row).
            many = httpclient.InferInput("X", [1, 1 << 18], "INT32")
            many.set_data_from_numpy(np.zeros((1, 1 << 18), dtype=np.int32))
            with pytest.raises(InferenceServerException, match="unexpected shape"):
                client.infer("uploaded", [many])
            left = _left_by(server.proc.pid)
            assert any(path.is_dir() for path in left) and any(path.is_file() for path in left)
            assert any(path.name.startswith("tritonfast-body-") for path in left)
        finally:
            client.close()
        if kill:
            server.proc.kill()
            server.wait_exit(30)
            # Its workers remove their own segments when it goes; nobody removes the rest.
            left = [path for path in left if path.exists()]
            assert any(path.is_dir() for path in left) and any(path.is_file() for path in left)
            start_server([EXAMPLES], tmp_path / "sweeper.log").stop()
            assert not any(path.exists() for path in left)
        else:
            assert server.stop() == 0
            assert _left_by(server.proc.pid) == []
