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


def seen(client: grpcclient.InferenceServerClient) -> int:
    return int(client.infer("cancel_watch", [mode_input(1)]).as_numpy("SEEN")[0])


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
