"""One scheduler per loaded model version: the Rust request queue and its instance loops."""

from __future__ import annotations

import asyncio
from typing import Any

from tritonfast._core import RequestQueue
from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend
from tritonfast.runtime.instance import InstanceLoop
from tritonfast.runtime.types import InferRequest, InferResponse


class Scheduler:
    def __init__(
        self,
        name: str,
        config: model_config_pb2.ModelConfig,
        backends: list[Backend],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        if config.HasField("dynamic_batching") and config.max_batch_size > 0:
            batching = config.dynamic_batching
            self._queue = RequestQueue(
                max_batch_size=config.max_batch_size,
                max_queue_delay_us=batching.max_queue_delay_microseconds,
                preferred_batch_sizes=list(batching.preferred_batch_size),
            )
        else:
            # Triton's default scheduler: one request per execution, FIFO to idle instances.
            self._queue = RequestQueue()
        self._batching = config.HasField("dynamic_batching") and config.max_batch_size > 0
        self._loop = loop
        self._instances = [
            InstanceLoop(f"{name}_{index}", self._queue, backend, loop)
            for index, backend in enumerate(backends)
        ]
        for instance in self._instances:
            instance.start()

    async def submit(self, request: InferRequest, batch_size: int) -> InferResponse:
        future: asyncio.Future[Any] = self._loop.create_future()
        self._queue.push((request, future), batch_size if self._batching else 1)
        return await future

    def stop(self, timeout: float) -> None:
        """Stop taking work, let queued and running requests finish, then finalize."""
        self._queue.close()
        for instance in self._instances:
            instance.join(timeout)
        for instance in self._instances:
            instance.finalize()
