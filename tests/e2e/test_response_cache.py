"""The response cache end to end: hits answered without running the model, statistics and
metrics, eviction under the size bound, and the models it refuses."""

from __future__ import annotations

import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ROOT, RunningServer, start_server

CACHE_BYTES = 4096


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repository = tmp_path_factory.mktemp("cache_repository")
    shutil.copytree(ROOT / "tests" / "models" / "identity_fp32", repository / "cached")
    with (repository / "cached" / "config.pbtxt").open("a") as config:
        config.write("response_cache { enable: true }\n")
    shutil.copytree(ROOT / "tests" / "models" / "identity_fp32", repository / "uncached")
    shutil.copytree(ROOT / "tests" / "models_sequence" / "short_idle", repository / "cached_seq")
    text = (repository / "cached_seq" / "config.pbtxt").read_text()
    text = text.replace('name: "short_idle"', 'name: "cached_seq"')
    (repository / "cached_seq" / "config.pbtxt").write_text(
        text + "response_cache { enable: true }\n"
    )
    server = start_server(
        [repository],
        tmp_path_factory.mktemp("cache") / "server.log",
        f"--cache-config=local,size={CACHE_BYTES}",
        "--exit-on-error=false",
    )
    yield server
    assert server.stop() == 0, server.log()


def infer(client: httpclient.InferenceServerClient, model: str, values: np.ndarray) -> Any:
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


def stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    return client.get_inference_statistics(model)["model_stats"][0]


def test_identical_requests_are_answered_from_the_cache(cache_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(cache_server.http_url)
    try:
        values = np.arange(8, dtype=np.float32).reshape(1, 8)
        before = stats(client, "cached")
        for _ in range(3):
            np.testing.assert_array_equal(infer(client, "cached", values), values)
        other = values + 1
        np.testing.assert_array_equal(infer(client, "cached", other), other)
        after = stats(client, "cached")
        uncached = stats(client, "uncached")
    finally:
        client.close()

    def delta(*path: str) -> int:
        new, old = after, before
        for key in path:
            new, old = new[key], old[key]
        return int(new) - int(old)

    assert delta("inference_stats", "cache_hit", "count") == 2
    assert delta("inference_stats", "cache_miss", "count") == 2
    assert delta("inference_stats", "success", "count") == 4  # hits count as successes
    assert delta("execution_count") == 2  # the model ran for the misses only
    assert delta("inference_count") == 2
    assert int(uncached["inference_stats"]["cache_hit"]["count"]) == 0
    with urllib.request.urlopen(f"http://{cache_server.metrics_url}/metrics") as reply:
        text = reply.read().decode()
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"}' in text
    assert 'nv_cache_num_misses_per_model{model="cached",version="1"}' in text
    assert 'model="uncached"' not in "\n".join(
        line for line in text.splitlines() if line.startswith("nv_cache_")
    )


def test_the_cache_evicts_the_least_recently_used_responses(cache_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(cache_server.http_url)
    try:
        # Each answer holds 3000 bytes: the 4096-byte cache keeps one at a time.
        first = np.full((1, 750), 1.0, dtype=np.float32)
        second = np.full((1, 750), 2.0, dtype=np.float32)
        start = stats(client, "cached")["inference_stats"]
        infer(client, "cached", first)
        infer(client, "cached", second)  # evicts the first
        np.testing.assert_array_equal(infer(client, "cached", first), first)  # a miss again
        np.testing.assert_array_equal(infer(client, "cached", first), first)  # a hit
        end = stats(client, "cached")["inference_stats"]
    finally:
        client.close()
    assert int(end["cache_miss"]["count"]) - int(start["cache_miss"]["count"]) == 3
    assert int(end["cache_hit"]["count"]) - int(start["cache_hit"]["count"]) == 1


def test_a_sequence_model_may_not_use_the_cache(cache_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(cache_server.http_url)
    try:
        assert not client.is_model_ready("cached_seq")
        row = {r["name"]: r for r in client.get_model_repository_index()}["cached_seq"]
        assert row["reason"] == (
            "Response Cache does not currently support model cached_seq with sequence batching"
            " scheduler. Please disable the response cache."
        )
    finally:
        client.close()


def test_outputs_bound_for_shared_memory_are_cached_with_their_bytes(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # A worker writes large shared-memory outputs itself, leaving the server nothing to
    # cache: for a cached model the server writes them, so hits carry the bytes.
    import tritonclient.utils.shared_memory as shm

    repository = tmp_path_factory.mktemp("cache_shm_repository")
    shutil.copytree(ROOT / "tests" / "models" / "identity_fp32", repository / "cached")
    with (repository / "cached" / "config.pbtxt").open("a") as config:
        config.write("response_cache { enable: true }\n")
    server = start_server(
        [repository],
        tmp_path_factory.mktemp("cache_shm") / "server.log",
        "--cache-config=local,size=16777216",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    values = np.arange(1 << 17, dtype=np.float32).reshape(1, -1)  # 512 KiB
    name = f"cacheshm{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", values.nbytes)
    try:
        client.register_system_shared_memory(name, f"/{name}", values.nbytes)
        for _ in range(2):  # a miss, then a hit
            shm.set_shared_memory_region(handle, [np.zeros_like(values)])
            tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
            tensor.set_data_from_numpy(values)
            output = httpclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory(name, values.nbytes)
            client.infer("cached", [tensor], outputs=[output])
            got = shm.get_contents_as_numpy(handle, np.float32, list(values.shape))
            np.testing.assert_array_equal(got, values)
        # A hit without shared memory: the same outputs asked for, so the same entry.
        tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values)
        result = client.infer(
            "cached", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")]
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
        assert int(stats(client, "cached")["inference_stats"]["cache_hit"]["count"]) == 2
    finally:
        client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)
        client.close()
        assert server.stop() == 0, server.log()
