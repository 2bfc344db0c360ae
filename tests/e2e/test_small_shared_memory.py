"""A server whose ``/dev/shm`` is small, as a container's is unless it is given more
(``docker run --shm-size``): a request too large for what is left there is refused with 503
naming shared memory, where writing pages the file system cannot back would kill the server
(SIGBUS), and the server goes on serving the requests that fit. The server runs in a mount
namespace of its own with a 16 MiB ``/dev/shm`` (which needs root and ``unshare``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import TEST_MODELS, RunningServer, start_server

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to give the server a small /dev/shm of its own",
)

# Mounts a 16 MiB /dev/shm in a new mount namespace, then execs the server's command line.
SMALL_SHM = (
    "unshare",
    "-m",
    "sh",
    "-c",
    'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$0" "$@"',
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("small_shm")
    for model in ("identity_fp32", "body_views"):
        shutil.copytree(TEST_MODELS / model, root / "models" / model)
    running = start_server([root / "models"], root / "server.log", launcher=SMALL_SHM)
    yield running
    assert running.stop() == 0, running.log()


def _identity(client: httpclient.InferenceServerClient, count: int) -> None:
    values = np.arange(count, dtype=np.float32).reshape(1, -1)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    result = client.infer("identity_fp32", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_a_request_too_large_for_shared_memory_is_refused_and_the_server_goes_on(
    server: RunningServer,
) -> None:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        _identity(client, 1 << 20)  # 4 MiB: received into shared memory, read there
        for _ in range(2):
            with pytest.raises(InferenceServerException) as refused:
                _identity(client, 10 << 20)  # 40 MiB
            assert refused.value.status() == "503"
            assert "no shared memory left" in refused.value.message()
            _identity(client, 1 << 20)
            _identity(client, 16)
        assert server.proc.poll() is None
    finally:
        client.close()


def _twice(client: httpclient.InferenceServerClient, count: int) -> None:
    a = np.arange(count, dtype=np.float32).reshape(1, -1)
    b = np.arange(4, dtype=np.int16).reshape(1, -1)
    inputs = [httpclient.InferInput("A", list(a.shape), "FP32")]
    inputs.append(httpclient.InferInput("B", list(b.shape), "INT16"))
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("body_views", inputs, outputs=[httpclient.InferRequestedOutput("TWICE")])
    np.testing.assert_array_equal(result.as_numpy("TWICE"), a * 2)


def test_outputs_too_large_for_shared_memory_fail_their_batch_not_the_worker(
    server: RunningServer,
) -> None:
    """The worker writes a computed output into its own segment: one that has no room fails
    its batch with 503, and the worker serves the next one (it did not die)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    try:
        _twice(client, 1 << 16)
        with pytest.raises(InferenceServerException) as refused:
            _twice(client, 3 << 19)  # 6 MiB in, 6 MiB out: an 8 MiB output segment
        assert refused.value.status() == "503"
        assert "no shared memory left for segment" in refused.value.message()
        _twice(client, 1 << 16)
        assert "Traceback" not in server.log()  # (a worker that died would have left one)
    finally:
        client.close()
