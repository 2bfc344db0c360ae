"""BLS calls a worker makes over the core's channel (``rust/src/lane/call.rs``): a call the
model makes while a batch from the channel runs (``exec()`` or ``async_exec()`` in
``execute``, from any of its threads) goes to the driver thread that waits for the batch's
reply, which queues it in the target model's lane and has its answer sent back, with no Python
of the server's on the way. Such calls go one at a time, and the batch's reply waits for the
one in flight. Anything else goes over the pipe as before (:mod:`.workerbls`): calls between
batches (nobody reads the channel then), traced calls (their traces are the server's), calls
with sequence controls, and calls the core sends back (``reroute``: the target is not on a
lane, or not loaded), whose model is then left to the pipe for a while.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tritonfast._core import LaneWorkerChannel
from tritonfast.data import rawtensor
from tritonfast.data.types import InferRequest, InferResponse, OutputTensor
from tritonfast.errors import Code, error_for
from tritonfast.runtime.handle import NotRun

# Parameters that make a call a sequence's: the core does not take those.
_SEQUENCE_KEYS = ("sequence_id", "sequence_start", "sequence_end")
# How long calls to a model the core sent back go over the pipe before the channel is tried
# again (it may have been loaded since, or moved onto a lane).
_REROUTED_S = 5.0
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


class ChannelCalls:
    """Makes a worker's calls over its channel when it can (see the module docstring)."""

    def __init__(self, channel: LaneWorkerChannel) -> None:
        self._channel = channel
        # Held by a call on the channel; True while a batch from the channel runs (its driver
        # reads the channel only then).
        self._lock = threading.Lock()
        self._open = False
        # Models whose calls went back to the pipe, and until when.
        self._rerouted: dict[str, float] = {}

    def open(self) -> None:
        """A batch from the channel starts: calls may take the channel."""
        self._open = True

    def close(self) -> None:
        """The batch's ``execute`` returned: once a call still in flight is answered, calls
        go over the pipe again."""
        with self._lock:
            self._open = False

    def __call__(self, request: InferRequest) -> InferResponse | None:
        """The call's response (its error raised, ``NotRun`` for a refusal); None when it
        must go over the pipe."""
        if not self._open or request.parent_trace is not None:
            return None
        params = request.parameters
        if params and any(key in params for key in _SEQUENCE_KEYS):
            return None
        name = request.model_name
        until = self._rerouted.get(name)
        if until is not None:
            if time.monotonic() < until:
                return None
            self._rerouted.pop(name, None)
        with self._lock:
            if not self._open:  # the batch ended meanwhile
                return None
            answer = self._call(name, request)
        kind = answer[0]
        if kind == "reroute":
            self._rerouted[name] = time.monotonic() + _REROUTED_S
            return None
        if kind == "ok":
            return _response(answer)
        error = error_for(Code(answer[1]), answer[2])
        if kind == "not_run":
            raise NotRun(error)
        raise error

    def _call(self, name: str, request: InferRequest) -> tuple[Any, ...]:
        params = request.parameters
        return self._channel.call(
            name,
            request.model_version,
            request.id,
            json.dumps(params, default=str) if params else "",
            _unsigned(params.get("priority"), _U32),
            _unsigned(params.get("timeout"), _U64),
            None if request.outputs is None else [o.name for o in request.outputs],
            [
                (t.name, t.datatype, list(t.shape), _wire(t.datatype, t.data))
                for t in request.inputs
            ],
        )


def _unsigned(value: object, limit: int) -> int:
    """A ``priority`` or ``timeout`` parameter as the lane takes it (anything else: 0)."""
    if not isinstance(value, int) or value <= 0:
        return 0
    return min(value, limit)


def _wire(datatype: str, data: Any) -> Any:
    raw = rawtensor.to_raw(datatype, data)
    return raw if isinstance(raw, bytes) else raw.reshape(-1)


def _response(answer: tuple[Any, ...]) -> InferResponse:
    _, model_name, model_version, response_id, parameters, outputs = answer
    return InferResponse(
        model_name,
        model_version,
        response_id,
        [
            OutputTensor(
                name, datatype, shape, rawtensor.from_raw(datatype, shape, raw, name, model_name)
            )
            for name, datatype, shape, raw in outputs
        ],
        json.loads(parameters) if parameters else {},
    )
