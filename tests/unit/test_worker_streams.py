"""The worker's end of a decoupled model's responses (``WorkerStreams``) over a real pipe."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

from tritonfast.backends.python.workerstream import WorkerStreams
from tritonfast.data.types import InferRequest


class _DropsOnPickling:
    """Pickled inside a message: drops the last reference to ``held`` right then, as the
    collector may finalize any object in the middle of a send."""

    def __init__(self, held: list[Any]) -> None:
        self.held = held

    def __reduce__(self) -> tuple[Any, ...]:
        self.held.clear()
        return (str, ("dropped",))


def test_a_sender_finalized_while_a_response_is_sent_does_not_deadlock() -> None:
    # A model's sender left open (an iterative sequence's previous execution) is finalized
    # while the worker holds its send lock; its finalizer ends its stream through the same
    # lock, from the same thread.
    server, worker = multiprocessing.Pipe()
    streams = WorkerStreams(worker)
    held = [streams.sender(1, InferRequest("m"))]
    sent = threading.Event()

    def send() -> None:
        streams.send(("message", _DropsOnPickling(held)))
        sent.set()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    assert sent.wait(10), "the worker's send deadlocked on its own lock"
    received = [server.recv() for _ in range(2)]
    kinds = sorted(message[0] for message in received)
    assert kinds == ["message", "responses"]  # the finalized sender's final error went too
    (responses,) = [m for m in received if m[0] == "responses"]
    ((token, _, final),) = responses[1]
    assert (token, final) == (1, True)
