"""instance_group count N: N instances of a model execute at the same time."""

from __future__ import annotations

import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonfast.runtime import looprun


def test_four_instances_execute_concurrently(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        results: list[int] = []
        errors: list[object] = []

        def done(result, error) -> None:
            if error is not None:
                errors.append(error)
            else:
                results.append(int(result.as_numpy("SEEN_PARALLEL")[0]))

        for _ in range(4):
            tensor = grpcclient.InferInput("X", [1], "INT32")
            tensor.set_data_from_numpy(np.zeros(1, dtype=np.int32))
            client.async_infer("sleeper", [tensor], done)
        # Each execution sleeps 0.5 s; all four were sent at once.
        for _ in range(200):
            if len(results) + len(errors) == 4:
                break
            time.sleep(0.05)
        assert not errors, errors
        assert len(results) == 4
        assert max(results) == 4, f"peak overlapping executions {max(results)}, expected 4"
    finally:
        client.close()


def _probe(client: grpcclient.InferenceServerClient, model: str) -> int:
    tensor = grpcclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
    return int(client.infer(model, [tensor]).as_numpy("ON_LOOP")[0, 0])


def _executions(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0))


def test_short_executions_move_to_the_event_loop_and_keep_batching(server) -> None:
    """Default instance mode: after its warm-up a fast model's batches run on the event loop
    (runtime.looprun), every request is still answered and counted, and batches still form."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        seen = [_probe(client, "thread_probe") for _ in range(looprun.WARM_BATCHES + 40)]
        assert seen[0] == 0, "the first batches run on instance threads"
        assert seen[-20:] == [1] * 20, seen
        executions, inferences = _executions(client, "thread_probe")
        assert inferences == len(seen)

        answers: list[int] = []
        errors: list[object] = []

        def done(result, error) -> None:
            if error is not None:
                errors.append(error)
            else:
                answers.append(int(result.as_numpy("ON_LOOP")[0, 0]))

        for _ in range(200):
            tensor = grpcclient.InferInput("X", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
            client.async_infer("thread_probe", [tensor], done)
        deadline = time.monotonic() + 30
        while len(answers) + len(errors) < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not errors, errors
        assert answers == [1] * 200
        after, inferences_after = _executions(client, "thread_probe")
        assert inferences_after - inferences == 200
        assert after - executions < 200, "concurrent requests were batched"
    finally:
        client.close()


def test_thread_instance_mode_keeps_every_batch_on_instance_threads(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        seen = [_probe(client, "thread_probe_threads") for _ in range(looprun.WARM_BATCHES * 2)]
        assert seen == [0] * len(seen)
    finally:
        client.close()
