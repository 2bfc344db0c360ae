"""instance_group count N: N instances of a model execute at the same time."""

from __future__ import annotations

import time

import numpy as np
import tritonclient.grpc as grpcclient


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
