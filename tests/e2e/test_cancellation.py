"""A client that goes away: its running request sees is_cancelled(); the server keeps serving."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def mode_input(mode: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("MODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return tensor


def seen(client: grpcclient.InferenceServerClient, model: str = "cancel_watch") -> int:
    return int(client.infer(model, [mode_input(1)]).as_numpy("SEEN")[0])


def test_running_request_sees_grpc_cancellation(server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = seen(client)
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer("cancel_watch", [mode_input(0)], client_timeout=0.3)
        deadline = time.monotonic() + 10
        while seen(client) == before:  # the model notices within ~10 ms of the cancel
            assert time.monotonic() < deadline, "the running request never saw is_cancelled()"
            time.sleep(0.02)
        assert seen(client) == before + 1
    finally:
        client.close()


def test_running_request_in_a_worker_process_sees_cancellation(server) -> None:
    # One worker process: the query below queues behind the waiter, so it comes back quickly
    # and counts one more cancellation only if the waiter saw is_cancelled() (else: 10 s).
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = seen(client, "cancel_watch_proc")
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer("cancel_watch_proc", [mode_input(0)], client_timeout=0.3)
        started = time.monotonic()
        assert seen(client, "cancel_watch_proc") == before + 1
        assert time.monotonic() - started < 5
    finally:
        client.close()
