"""``backend: "repeat"``: a decoupled test backend that answers each request with one response
per element of its input, sent from a thread of its own after ``execute`` returns.

Inputs: ``IN`` (INT32, ``[-1]``). Each response holds ``OUT`` (the element), ``IDX`` (its
position) and ``CANCELLED`` (how many requests this instance has seen cancelled so far); then
a bare final flag follows. The request parameter ``delay_ms`` spaces the responses out; a
request whose consumer goes away stops early and counts as cancelled.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import Backend, InstancePlacement, ModelInstance, PhaseClock
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import InvalidArgumentError, UnsupportedError
from tritonfast.runtime.responses import Result


class RepeatBackend(Backend):
    name = "repeat"

    def validate(self, config: model_config_pb2.ModelConfig) -> None:
        if not config.model_transaction_policy.decoupled:
            raise UnsupportedError(f"model '{config.name}': the repeat backend is decoupled")

    def create_instance(
        self, config: model_config_pb2.ModelConfig, placement: InstancePlacement
    ) -> ModelInstance:
        return RepeatInstance()


class RepeatInstance(ModelInstance):
    def __init__(self) -> None:
        self._cancelled = 0
        self._lock = threading.Lock()

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        for request in requests:
            threading.Thread(target=self._answer, args=(request,), daemon=True).start()
        return None

    def _answer(self, request: InferRequest) -> None:
        sender = request.sender
        values = next((t.data for t in request.inputs if t.name == "IN"), None)
        if values is None:
            sender.send(InvalidArgumentError("the repeat backend needs an input 'IN'"), final=True)
            return
        delay = float(request.parameters.get("delay_ms", 0)) / 1000
        for index, value in enumerate(values.reshape(-1).tolist()):
            if index and delay:
                time.sleep(delay)  # the pace the test asked for
            if sender.is_cancelled():
                with self._lock:
                    self._cancelled += 1
                sender.send(final=True)
                return
            sender.send(self._response(request, value, index), final=False)
        sender.send(final=True)

    def _response(self, request: InferRequest, value: int, index: int) -> InferResponse:
        with self._lock:
            cancelled = self._cancelled
        outputs = [
            OutputTensor(name, "INT32", (1,), np.array([number], dtype=np.int32))
            for name, number in (("OUT", value), ("IDX", index), ("CANCELLED", cancelled))
        ]
        return InferResponse(request.model_name, request.model_version, request.id, outputs)
