"""System (and, without a GPU, CUDA) shared memory with tritonclient's own helpers.

Every test drives the real server over HTTP and gRPC with ``tritonclient.utils.shared_memory``
regions: the server maps them by key and reads inputs / writes outputs in place.
"""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor
from tritonfast.memory import cudamemory
from tritonfast.memory.sharedmemory import PLACED_BYTES

from tests.conftest import RunningServer, start_server
from tests.e2e.models_on_disk import Marks, write_model
from tests.waiting import wait_for

PROTOCOLS = ("http", "grpc")


class Regions:
    """Client-side regions made for one test, registered with the server and cleaned up."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.handles: dict[str, Any] = {}
        self.unlinked: set[str] = set()

    def create(self, byte_size: int, *, register: bool = True, offset: int = 0) -> str:
        name = "r" + uuid.uuid4().hex[:10]
        self.handles[name] = shm.create_shared_memory_region(name, f"/{name}", byte_size)
        if register:
            self.client.register_system_shared_memory(name, f"/{name}", byte_size - offset, offset)
        return name

    def set(self, name: str, arrays: list[np.ndarray], offset: int = 0) -> None:
        shm.set_shared_memory_region(self.handles[name], arrays, offset)

    def get(self, name: str, dtype: Any, shape: list[int], offset: int = 0) -> np.ndarray:
        return shm.get_contents_as_numpy(self.handles[name], dtype, shape, offset)

    def unlink(self, name: str) -> None:
        """Remove the object's name, as a client may once the server has mapped it."""
        os.unlink(f"/dev/shm/{name}")
        self.unlinked.add(name)

    def close(self) -> None:
        for name, handle in self.handles.items():
            self.client.unregister_system_shared_memory(name)
            if name in self.unlinked:  # tritonclient unlinks it too: give it a name to remove
                open(f"/dev/shm/{name}", "wb").close()
            shm.destroy_shared_memory_region(handle)


def make_client(protocol: str, server: Any) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, concurrency=16)
    return grpcclient.InferenceServerClient(server.grpc_url)


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(protocol: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A client of the session's server, or of the ``watch`` model's server in the tests that
    take ``watch``."""
    if "watch" in request.fixturenames:
        serving = request.getfixturevalue("watch").server
    else:
        serving = request.getfixturevalue("server")
    client = make_client(protocol, serving)
    yield client
    client.close()


@pytest.fixture
def regions(client: Any) -> Iterator[Regions]:
    made = Regions(client)
    yield made
    made.close()


def lib(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def shm_input(
    protocol: str,
    name: str,
    shape: list[int],
    datatype: str,
    region: str,
    byte_size: int,
    offset: int = 0,
) -> Any:
    tensor = lib(protocol).InferInput(name, shape, datatype)
    tensor.set_shared_memory(region, byte_size, offset)
    return tensor


def np_input(protocol: str, name: str, array: np.ndarray, datatype: str) -> Any:
    tensor = lib(protocol).InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def shm_output(protocol: str, name: str, region: str, byte_size: int, offset: int = 0) -> Any:
    output = lib(protocol).InferRequestedOutput(name)
    output.set_shared_memory(region, byte_size, offset)
    return output


def status_names(client: Any, protocol: str) -> set[str]:
    status = client.get_system_shared_memory_status()
    if protocol == "http":
        return {entry["name"] for entry in status}
    return set(status.regions)


# add_sub takes two [4] vectors; identity_fp32 takes a batch of them ([1, 4] here).
A = np.arange(4, dtype=np.float32)
B = np.full(4, 10, dtype=np.float32)


# -- the data path ------------------------------------------------------------------------------
def test_inputs_and_outputs_in_shared_memory(protocol: str, client: Any, regions: Regions) -> None:
    inputs_region = regions.create(32)
    outputs_region = regions.create(32)
    regions.set(inputs_region, [A, B])  # INPUT0 at 0, INPUT1 at 16
    result = client.infer(
        "add_sub",
        [
            shm_input(protocol, "INPUT0", [4], "FP32", inputs_region, 16),
            shm_input(protocol, "INPUT1", [4], "FP32", inputs_region, 16, offset=16),
        ],
        outputs=[
            shm_output(protocol, "OUTPUT0", outputs_region, 16),
            shm_output(protocol, "OUTPUT1", outputs_region, 16, offset=16),
        ],
    )
    np.testing.assert_array_equal(regions.get(outputs_region, np.float32, [4]), A + B)
    np.testing.assert_array_equal(regions.get(outputs_region, np.float32, [4], 16), A - B)
    # The response carries the outputs' metadata and no data.
    output = result.get_output("OUTPUT0")
    shape = output["shape"] if protocol == "http" else list(output.shape)
    assert [int(d) for d in shape] == [4]


def test_large_output_lands_exactly_in_its_window(
    protocol: str, client: Any, regions: Regions
) -> None:
    # Past the core's parallel-copy size (8 MiB), at an offset that leaves the destination
    # unaligned, so the copy's chunks, streaming stores, head and tail all run; the bytes
    # around the window must stay as they were.
    data = np.random.default_rng(7).random((1, (9 << 18) + 13), dtype=np.float32)
    inputs = regions.create(data.nbytes)
    regions.set(inputs, [data])
    guard = 68
    outputs = regions.create(data.nbytes + 2 * guard)
    regions.set(outputs, [np.full(data.nbytes + 2 * guard, 0x5A, np.uint8)])
    client.infer(
        "identity_fp32",
        [shm_input(protocol, "INPUT0", list(data.shape), "FP32", inputs, data.nbytes)],
        outputs=[shm_output(protocol, "OUTPUT0", outputs, data.nbytes, offset=guard)],
    )
    np.testing.assert_array_equal(regions.get(outputs, np.float32, list(data.shape), guard), data)
    around = regions.get(outputs, np.uint8, [data.nbytes + 2 * guard])
    assert (around[:guard] == 0x5A).all() and (around[guard + data.nbytes :] == 0x5A).all()


def test_outputs_over_their_own_inputs(protocol: str, client: Any, regions: Regions) -> None:
    # One region holds the input and receives the output: at the same offset (in place,
    # nothing to move) and shifted by 16 bytes (the ranges overlap: moved as by memmove).
    data = np.arange(64, dtype=np.float32).reshape(1, 64)
    region = regions.create(data.nbytes + 16)
    for shift in (0, 16):
        regions.set(region, [data])
        client.infer(
            "identity_fp32",
            [shm_input(protocol, "INPUT0", [1, 64], "FP32", region, data.nbytes)],
            outputs=[shm_output(protocol, "OUTPUT0", region, data.nbytes, offset=shift)],
        )
        np.testing.assert_array_equal(regions.get(region, np.float32, [1, 64], shift), data)


def test_inputs_only(protocol: str, client: Any, regions: Regions) -> None:
    region = regions.create(32)
    regions.set(region, [A, B])
    result = client.infer(
        "add_sub",
        [
            shm_input(protocol, "INPUT0", [4], "FP32", region, 16),
            shm_input(protocol, "INPUT1", [4], "FP32", region, 16, offset=16),
        ],
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_outputs_only_beside_a_normal_output(protocol: str, client: Any, regions: Regions) -> None:
    region = regions.create(16)
    outputs = [
        shm_output(protocol, "OUTPUT0", region, 16),
        lib(protocol).InferRequestedOutput("OUTPUT1"),
    ]
    result = client.infer(
        "add_sub",
        [np_input(protocol, "INPUT0", A, "FP32"), np_input(protocol, "INPUT1", B, "FP32")],
        outputs=outputs,
    )
    np.testing.assert_array_equal(regions.get(region, np.float32, [4]), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_bytes_tensors(protocol: str, client: Any, regions: Regions) -> None:
    words = np.array([[b"shared", b"", b"memory \xff"]], dtype=np.object_)
    serialized = serialize_byte_tensor(words)
    size = len(serialized.item())
    inputs_region = regions.create(size)
    outputs_region = regions.create(size)
    regions.set(inputs_region, [serialized])
    client.infer(
        "identity_bytes",
        [shm_input(protocol, "INPUT0", [1, 3], "BYTES", inputs_region, size)],
        outputs=[shm_output(protocol, "OUTPUT0", outputs_region, size)],
    )
    got = regions.get(outputs_region, np.object_, [1, 3])
    assert got.tolist() == words.tolist()


def test_registered_offset_inside_the_object(protocol: str, client: Any, regions: Regions) -> None:
    # Register only the window that starts 100 bytes into the object (not page-aligned).
    region = regions.create(100 + 32, offset=100)
    regions.set(region, [A, B], offset=100)
    result = client.infer(
        "add_sub",
        [
            shm_input(protocol, "INPUT0", [4], "FP32", region, 16),
            shm_input(protocol, "INPUT1", [4], "FP32", region, 16, offset=16),
        ],
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    entry = client.get_system_shared_memory_status(region)
    if protocol == "http":
        assert entry == [{"name": region, "key": f"/{region}", "offset": 100, "byte_size": 32}]
    else:
        assert entry.regions[region].offset == 100
        assert entry.regions[region].byte_size == 32


def test_many_regions(protocol: str, client: Any, regions: Regions) -> None:
    names = [regions.create(16) for _ in range(24)]
    for index, name in enumerate(names):
        regions.set(name, [np.full((1, 4), index, dtype=np.float32)])
    assert set(names) <= status_names(client, protocol)
    for name in names[::5]:
        result = client.infer(
            "identity_fp32", [shm_input(protocol, "INPUT0", [1, 4], "FP32", name, 16)]
        )
        assert result.as_numpy("OUTPUT0")[0, 0] == names.index(name)


def test_a_region_truncated_by_its_owner_is_refused_not_a_crash(
    protocol: str, client: Any, regions: Regions
) -> None:
    """Triton dies of SIGBUS when a request touches a region whose object its client shrank;
    here the request gets an error and the server goes on."""
    name = regions.create(8192)
    regions.set(name, [np.ones((1, 4), dtype=np.float32)], offset=8000)
    os.truncate(f"/dev/shm/{name}", 4096)
    with pytest.raises(InferenceServerException) as error:
        client.infer(
            "identity_fp32",
            [shm_input(protocol, "INPUT0", [1, 4], "FP32", name, 16, offset=8000)],
        )
    assert f"shared memory region '{name}' was truncated by its owner to 4096 bytes" in str(
        error.value
    )
    assert client.is_server_live()


def test_one_region_shared_by_concurrent_requests(
    protocol: str, server: Any, client: Any, regions: Regions
) -> None:
    count = 32
    inputs_region = regions.create(16)
    outputs_region = regions.create(16 * count)
    regions.set(inputs_region, [A[None]])

    def one(index: int) -> None:
        local = make_client(protocol, server)
        try:
            local.infer(
                "identity_fp32",
                [shm_input(protocol, "INPUT0", [1, 4], "FP32", inputs_region, 16)],
                outputs=[shm_output(protocol, "OUTPUT0", outputs_region, 16, offset=16 * index)],
            )
        finally:
            local.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))
    got = regions.get(outputs_region, np.float32, [count, 4])
    np.testing.assert_array_equal(got, np.repeat(A[None], count, axis=0))


# Watches its input while it runs: waits up to WAIT_MS for INPUT0[0] to change, then answers
# with INPUT0 as it is then (a change made by the client shows only if the model reads the
# client's shared memory in place). It marks in a file when it has read INPUT0[0] and starts
# to wait, so the test knows that a write of its own is a change. Served in-process ("watch")
# and in worker processes ("watch_proc"), where inputs of PLACED_BYTES and more are read in
# place too (smaller ones are copied to the worker).
WATCH_CONFIG = """
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "WAIT_MS" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "%s" } }
"""
# (model, INPUT0's element count) for each instance mode.
WATCHED = [("watch", 4), ("watch_proc", PLACED_BYTES // 4)]
WATCH_MODEL = """
import time

import triton_python_backend_utils as pb_utils

STARTED = {started!r}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            wait_ms = int(pb_utils.get_input_tensor_by_name(request, "WAIT_MS").as_numpy()[0])
            first = data[0]
            with open(STARTED, "a") as marks:
                marks.write("watching\\n")
            deadline = time.monotonic() + wait_ms / 1000
            while data[0] == first and time.monotonic() < deadline:
                time.sleep(0.005)
            out = pb_utils.Tensor("OUTPUT0", data.copy())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


@dataclass
class Watch:
    """A server of the ``watch`` model alone, and the file where the model marks its runs."""

    server: RunningServer
    marks: Marks

    def wait_for_runs(self, count: int) -> None:
        wait_for(lambda: self.marks.count() >= count, "the model to start watching")


@pytest.fixture(scope="module")
def watch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    """The ``watch`` model's server; the ``client`` and ``regions`` of a test that takes it are
    on that server."""
    root = tmp_path_factory.mktemp("watch")
    marks = Marks(root / "marks")
    model = WATCH_MODEL.format(started=str(marks.path))
    write_model(root / "repository", "watch", WATCH_CONFIG % "thread", model)
    write_model(root / "repository", "watch_proc", WATCH_CONFIG % "process", model)
    server = start_server([root / "repository"], root / "server.log")
    yield Watch(server, marks)
    assert server.stop() == 0, server.log()


@pytest.mark.parametrize(("model", "count"), WATCHED)
def test_inputs_are_read_in_place(
    protocol: str, watch: Watch, client: Any, regions: Regions, model: str, count: int
) -> None:
    # The model waits for INPUT0[0] to change once it has read it; only a zero-copy input sees
    # the client's write, made after that.
    size = count * 4
    region = regions.create(size)
    regions.set(region, [np.ones(count, dtype=np.float32)])
    wait = np_input(protocol, "WAIT_MS", np.array([10_000], dtype=np.int32), "INT32")
    answer: dict[str, Any] = {}

    def run() -> None:
        local = make_client(protocol, watch.server)  # tritonclient.http clients stay on one thread
        try:
            answer["result"] = local.infer(
                model, [shm_input(protocol, "INPUT0", [count], "FP32", region, size), wait]
            )
        finally:
            local.close()

    runs = watch.marks.count()
    thread = threading.Thread(target=run)
    thread.start()
    watch.wait_for_runs(runs + 1)
    written = time.monotonic()
    regions.set(region, [np.full(count, 7, dtype=np.float32)])
    thread.join(30)
    assert time.monotonic() - written < 8, "the model never saw the client's write"
    np.testing.assert_array_equal(answer["result"].as_numpy("OUTPUT0"), np.full(count, 7))


@pytest.mark.parametrize(("model", "count"), WATCHED)
def test_unregister_while_a_request_runs(
    protocol: str, watch: Watch, client: Any, regions: Regions, model: str, count: int
) -> None:
    size = count * 4
    inputs_region = regions.create(size)
    outputs_region = regions.create(size)
    regions.set(inputs_region, [np.full(count, 3, dtype=np.float32)])
    wait = np_input(protocol, "WAIT_MS", np.array([10_000], dtype=np.int32), "INT32")
    answer: dict[str, Any] = {}

    def run() -> None:
        local = make_client(protocol, watch.server)
        try:
            answer["result"] = local.infer(
                model,
                [shm_input(protocol, "INPUT0", [count], "FP32", inputs_region, size), wait],
                outputs=[shm_output(protocol, "OUTPUT0", outputs_region, size)],
            )
        finally:
            local.close()

    runs = watch.marks.count()
    thread = threading.Thread(target=run)
    thread.start()
    watch.wait_for_runs(runs + 1)
    client.unregister_system_shared_memory()  # every region, while the request runs
    assert not status_names(client, protocol)
    # The running request still reads the input in place, and ends on this change.
    regions.set(inputs_region, [np.full(count, 5, dtype=np.float32)])
    thread.join(30)
    assert "result" in answer
    got = regions.get(outputs_region, np.float32, [count])
    np.testing.assert_array_equal(got, np.full(count, 5))
    # Unregistered means unknown to new requests.
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
        client.infer(
            model, [shm_input(protocol, "INPUT0", [count], "FP32", inputs_region, size), wait]
        )


# -- registration errors ------------------------------------------------------------------------
def test_duplicate_name_is_rejected(protocol: str, client: Any, regions: Regions) -> None:
    name = regions.create(64)
    with pytest.raises(InferenceServerException, match="already in manager") as info:
        client.register_system_shared_memory(name, f"/{name}", 64)
    assert info.value.status() == ("400" if protocol == "http" else "StatusCode.ALREADY_EXISTS")


@pytest.mark.parametrize(
    ("key", "offset", "byte_size", "message", "http_status", "grpc_status"),
    [
        (
            "/tf-no-such-object",
            0,
            8,
            "Unable to open shared memory region",
            "500",
            "INTERNAL",
        ),
        (
            "/../../etc/passwd",
            0,
            8,
            "is not a POSIX shared memory object name",
            "400",
            "INVALID_ARGUMENT",
        ),
        ("/triton_python_backend_shm_region_7", 0, 8, "reserved prefix", "400", "INVALID_ARGUMENT"),
        (None, 0, 65, "invalid args", "400", "INVALID_ARGUMENT"),
        (None, 60, 8, "invalid args", "400", "INVALID_ARGUMENT"),
    ],
)
def test_bad_registrations(
    protocol: str,
    client: Any,
    regions: Regions,
    key: str | None,
    offset: int,
    byte_size: int,
    message: str,
    http_status: str,
    grpc_status: str,
) -> None:
    name = regions.create(64, register=False)
    with pytest.raises(InferenceServerException, match=message) as info:
        client.register_system_shared_memory("bad" + name, key or f"/{name}", byte_size, offset)
    expected = http_status if protocol == "http" else f"StatusCode.{grpc_status}"
    assert info.value.status() == expected
    assert "bad" + name not in status_names(client, protocol)


def test_the_servers_own_segments_cannot_be_registered(protocol: str, client: Any) -> None:
    # They hold other requests' tensors on their way to and from workers.
    own = sorted(Path("/dev/shm").glob("tritonfast-*"))
    assert own, "the server's worker models have segments"
    with pytest.raises(InferenceServerException, match="reserved prefix 'tritonfast-'") as info:
        client.register_system_shared_memory("own", f"/{own[0].name}", 1)
    assert info.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


def test_status_and_unregister_of_unknown_regions(protocol: str, client: Any) -> None:
    with pytest.raises(
        InferenceServerException, match="Unable to find system shared memory region: 'nope'"
    ):
        client.get_system_shared_memory_status("nope")
    client.unregister_system_shared_memory("nope")  # not an error, as in Triton


# -- inference errors ---------------------------------------------------------------------------
def test_unknown_region_in_a_request(protocol: str, client: Any) -> None:
    with pytest.raises(
        InferenceServerException, match="Unable to find shared memory region: 'ghost'"
    ):
        client.infer("identity_fp32", [shm_input(protocol, "INPUT0", [1, 4], "FP32", "ghost", 16)])


@pytest.mark.parametrize(
    ("offset", "byte_size", "message"),
    [
        (64, 16, "Invalid offset for shared memory region"),
        (56, 16, "Invalid offset \\+ byte size for shared memory region"),
        (0, 32, "unexpected total byte size|byte size"),
    ],
)
def test_bad_input_placements(
    protocol: str, client: Any, regions: Regions, offset: int, byte_size: int, message: str
) -> None:
    region = regions.create(64)
    with pytest.raises(InferenceServerException, match=message):
        client.infer(
            "identity_fp32",
            [shm_input(protocol, "INPUT0", [1, 4], "FP32", region, byte_size, offset)],
        )


def test_output_region_too_small(protocol: str, client: Any, regions: Regions) -> None:
    region = regions.create(64)
    with pytest.raises(InferenceServerException, match="should be at least 16 bytes") as info:
        client.infer(
            "identity_fp32",
            [np_input(protocol, "INPUT0", A[None], "FP32")],
            outputs=[shm_output(protocol, "OUTPUT0", region, 8)],
        )
    assert info.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
    assert not regions.get(region, np.uint8, [64]).any()  # nothing written


def test_large_output_too_big_for_its_region_in_a_worker(
    protocol: str, client: Any, regions: Regions
) -> None:
    # Large enough to be written by the worker itself (identity_fp32 runs in one): the same
    # error as in-process, and nothing written.
    data = np.ones((1, PLACED_BYTES // 4 + 8), np.float32)
    region = regions.create(PLACED_BYTES)
    with pytest.raises(InferenceServerException, match=f"at least {data.nbytes} bytes") as info:
        client.infer(
            "identity_fp32",
            [np_input(protocol, "INPUT0", data, "FP32")],
            outputs=[shm_output(protocol, "OUTPUT0", region, PLACED_BYTES)],
        )
    assert info.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")
    assert not regions.get(region, np.uint8, [PLACED_BYTES]).any()


def test_an_unlinked_object_still_serves_through_a_worker(
    protocol: str, client: Any, regions: Regions
) -> None:
    # A client may unlink its object once registered (the server mapped it): a worker can no
    # longer open it by name, so it gets copies from the server's mapping instead.
    data = np.arange(PLACED_BYTES // 2, dtype=np.float32).reshape(1, -1)
    inputs = regions.create(data.nbytes)
    outputs = regions.create(data.nbytes)
    regions.set(inputs, [data])
    for name in (inputs, outputs):
        regions.unlink(name)
    for _ in range(2):
        client.infer(
            "identity_fp32",
            [shm_input(protocol, "INPUT0", list(data.shape), "FP32", inputs, data.nbytes)],
            outputs=[shm_output(protocol, "OUTPUT0", outputs, data.nbytes)],
        )
        np.testing.assert_array_equal(regions.get(outputs, np.float32, list(data.shape)), data)
        regions.set(outputs, [np.zeros_like(data)])


def test_the_server_keeps_serving_after_errors(protocol: str, client: Any) -> None:
    result = client.infer("identity_fp32", [np_input(protocol, "INPUT0", A[None], "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A[None])


# -- CUDA shared memory -------------------------------------------------------------------------
GPU = cudamemory.cuda_runtime() is not None


@pytest.mark.skipif(GPU, reason="this machine has a GPU: the no-GPU answers do not apply")
def test_cuda_endpoints_answer_without_a_gpu(protocol: str, client: Any) -> None:
    status = client.get_cuda_shared_memory_status()
    assert (status == []) if protocol == "http" else (len(status.regions) == 0)
    with pytest.raises(InferenceServerException, match="GPUs not supported"):
        client.register_cuda_shared_memory("gpu0", base64.b64encode(bytes(64)), 0, 1024)
    with pytest.raises(
        InferenceServerException, match="Unable to find cuda shared memory region: 'gpu0'"
    ):
        client.get_cuda_shared_memory_status("gpu0")
    client.unregister_cuda_shared_memory()


class CudaRegions:
    """Device memory on GPU 0 made for one test with tritonclient's CUDA helpers, registered
    with the server (which opens it through CUDA IPC) and freed afterwards."""

    def __init__(self, client: Any) -> None:
        import tritonclient.utils.cuda_shared_memory as cudashm

        self.cudashm = cudashm
        self.client = client
        self.handles: dict[str, Any] = {}

    def create(self, byte_size: int) -> str:
        name = "c" + uuid.uuid4().hex[:10]
        handle = self.cudashm.create_shared_memory_region(name, byte_size, 0)
        self.handles[name] = handle
        self.client.register_cuda_shared_memory(
            name, self.cudashm.get_raw_handle(handle), 0, byte_size
        )
        return name

    def set(self, name: str, arrays: list[np.ndarray]) -> None:
        """Writes ``arrays`` back to back from the region's start."""
        self.cudashm.set_shared_memory_region(self.handles[name], arrays)

    def get(self, name: str, shape: list[int]) -> np.ndarray:
        """FP32 ``shape`` from the region's start."""
        return self.cudashm.get_contents_as_numpy(self.handles[name], np.float32, shape)

    def close(self) -> None:
        self.client.unregister_cuda_shared_memory()
        for handle in self.handles.values():
            self.cudashm.destroy_shared_memory_region(handle)


@pytest.fixture
def cuda_regions(client: Any) -> Iterator[CudaRegions]:
    made = CudaRegions(client)
    yield made
    made.close()


def cuda_status(client: Any, protocol: str) -> dict[str, tuple[int, int]]:
    """{name: (device_id, byte_size)} of the server's CUDA regions."""
    status = client.get_cuda_shared_memory_status()
    if protocol == "http":
        return {e["name"]: (int(e["device_id"]), int(e["byte_size"])) for e in status}
    return {n: (int(r.device_id), int(r.byte_size)) for n, r in status.regions.items()}


gpu_only = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU and cuda-python")
DATA = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.mark.gpu
@gpu_only
def test_cuda_inputs_and_outputs(protocol: str, client: Any, cuda_regions: CudaRegions) -> None:
    inputs, outputs = cuda_regions.create(DATA.nbytes), cuda_regions.create(DATA.nbytes)
    assert cuda_status(client, protocol) == {inputs: (0, 64), outputs: (0, 64)}
    cuda_regions.set(inputs, [DATA])
    result = client.infer(
        "identity_fp32",
        [shm_input(protocol, "INPUT0", [1, 16], "FP32", inputs, DATA.nbytes)],
        outputs=[shm_output(protocol, "OUTPUT0", outputs, DATA.nbytes)],
    )
    np.testing.assert_array_equal(cuda_regions.get(outputs, [1, 16]), DATA)
    output = result.get_output("OUTPUT0")  # metadata only: the data is in the region
    shape = output["shape"] if protocol == "http" else list(output.shape)
    assert [int(d) for d in shape] == [1, 16]


@pytest.mark.gpu
@gpu_only
def test_cuda_input_only_and_output_only(
    protocol: str, client: Any, regions: Regions, cuda_regions: CudaRegions
) -> None:
    device = cuda_regions.create(2 * DATA.nbytes)
    cuda_regions.set(device, [np.zeros_like(DATA), DATA])  # DATA in the second half
    answer = client.infer(
        "identity_fp32",
        [shm_input(protocol, "INPUT0", [1, 16], "FP32", device, DATA.nbytes, DATA.nbytes)],
    )
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), DATA)
    # A host input, the output into the first half of the device region.
    client.infer(
        "identity_fp32",
        [np_input(protocol, "INPUT0", DATA * 2, "FP32")],
        outputs=[shm_output(protocol, "OUTPUT0", device, DATA.nbytes)],
    )
    np.testing.assert_array_equal(cuda_regions.get(device, [2, 16]), [DATA[0] * 2, DATA[0]])
    # A system region in and a CUDA region out, in one request.
    host = regions.create(DATA.nbytes)
    regions.set(host, [DATA * 3])
    client.infer(
        "identity_fp32",
        [shm_input(protocol, "INPUT0", [1, 16], "FP32", host, DATA.nbytes)],
        outputs=[shm_output(protocol, "OUTPUT0", device, DATA.nbytes)],
    )
    np.testing.assert_array_equal(cuda_regions.get(device, [2, 16]), [DATA[0] * 3, DATA[0]])


@pytest.mark.gpu
@gpu_only
def test_cuda_registration_errors(protocol: str, client: Any, cuda_regions: CudaRegions) -> None:
    name = cuda_regions.create(64)
    handle = cuda_regions.cudashm.get_raw_handle(cuda_regions.handles[name])
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_cuda_shared_memory(name, handle, 0, 64)
    with pytest.raises(InferenceServerException, match="failed to register CUDA shared memory"):
        client.register_cuda_shared_memory("junk", base64.b64encode(bytes(64)), 0, 64)
    with pytest.raises(InferenceServerException, match="Invalid offset"):
        client.infer(
            "identity_fp32",
            [shm_input(protocol, "INPUT0", [1, 16], "FP32", name, 64, offset=64)],
        )
    assert set(cuda_status(client, protocol)) == {name}
