"""instance_group count N: N instances of a model execute at the same time."""

from __future__ import annotations

import time

import numpy as np
import tritonclient.grpc as grpcclient
from tritonfast.runtime import looprun


def _infer_all_at_once(
    client: grpcclient.InferenceServerClient, model: str, shape: list[int], output: str, count: int
) -> list[np.ndarray]:
    """Send ``count`` requests of zeros at once; every answer's ``output``, once all are in."""
    answers: list[np.ndarray] = []
    errors: list[object] = []

    def done(result, error) -> None:
        if error is not None:
            errors.append(error)
        else:
            answers.append(result.as_numpy(output))

    for _ in range(count):
        tensor = grpcclient.InferInput("X", shape, "INT32")
        tensor.set_data_from_numpy(np.zeros(shape, dtype=np.int32))
        client.async_infer(model, [tensor], done)
    deadline = time.monotonic() + 30
    while len(answers) + len(errors) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not errors, errors
    assert len(answers) == count
    return answers


def test_four_instances_execute_concurrently(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        # Each execution sleeps 0.5 s; all four are sent at once.
        results = [
            int(a[0]) for a in _infer_all_at_once(client, "sleeper", [1], "SEEN_PARALLEL", 4)
        ]
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
    """Instance mode "auto": after its warm-up a fast model's batches run on the event loop
    (runtime.looprun), every request is still answered and counted, and batches still form."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        seen = [_probe(client, "thread_probe") for _ in range(looprun.WARM_BATCHES + 40)]
        assert seen[0] == 0, "the first batches run on instance threads"
        # A stall of the whole machine (another tenant taking the CPU) can send the model back
        # to its threads for a while (looprun's retreat); it must come back.
        for _ in range(looprun.WARM_BATCHES * 4):
            if seen[-20:] == [1] * 20:
                break
            seen.append(_probe(client, "thread_probe"))
        assert seen[-20:] == [1] * 20, seen
        executions, inferences = _executions(client, "thread_probe")
        assert inferences == len(seen)

        # (The same stall during the burst sends some of its batches to the threads: the
        # burst is sent again, a few times at most.)
        for _ in range(3):
            answers = _infer_all_at_once(client, "thread_probe", [1, 1], "ON_LOOP", 200)
            after, inferences_after = _executions(client, "thread_probe")
            assert inferences_after - inferences == 200
            if [int(a[0, 0]) for a in answers] == [1] * 200:
                break
            executions, inferences = after, inferences_after
        assert [int(a[0, 0]) for a in answers] == [1] * 200
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
