"""Instances in the server's own process on the core's request path (an ONNX Runtime
session): the model's lane (:mod:`tritonfast.runtime.lane`) decodes, checks and batches their
requests as it does a worker's, and its driver thread hands each batch to the instance by a
call (``LaneWorkerLink.in_process``) instead of over a worker's channel. The batch travels in
the same segments and is read, run and described by the same code as in a worker
(:class:`~tritonfast.backends.python.channelbatch.Batches`): Python runs once per batch, with
the GIL, on the driver thread, and the core answers each request.

A backend opts in by wrapping its instances (:func:`driven`) and giving them to a
:class:`~tritonfast.runtime.lane.LaneScheduler` when :func:`~tritonfast.runtime.lane.
lane_eligible` allows, unless ``--backend-config=<backend>,core-path=off``
(:func:`~tritonfast.runtime.lane.core_path_on`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from typing import Any

from tritonfast._core import LaneWorkerLink
from tritonfast.backends.python.channelbatch import Batches
from tritonfast.data.types import InferRequest
from tritonfast.errors import InternalError, TritonError
from tritonfast.runtime.instance import Caller
from tritonfast.runtime.modelinstance import ModelInstance, PhaseClock
from tritonfast.runtime.responses import Result

_serials = itertools.count()


class InProcessDriven(ModelInstance):
    """An instance of this process whose batches the core hands over by a call."""

    def __init__(self, instance: ModelInstance, model_name: str, instance_name: str) -> None:
        self._instance = instance
        self._model_name = model_name
        self._instance_name = instance_name
        self._tag = f"inproc{next(_serials)}"
        # Made with the first link (its output segment with it).
        self._batches: Batches | None = None
        # Set by the core's scheduler (see runtime.lane.CoreDriven).
        self.core_running: Callable[[], bool] | None = None
        self.core_caller: Caller | None = None
        self.may_run_on_event_loop = instance.may_run_on_event_loop

    def core_link(self, loop: asyncio.AbstractEventLoop) -> LaneWorkerLink:
        if self._batches is None:
            prefix = f"tritonfast-out-{os.getpid()}-{self._tag}"
            self._batches = Batches(self._instance, self._model_name, self._instance_name, prefix)
        return LaneWorkerLink.in_process(self._batches.run, self._tag)

    def core_died(self) -> TritonError:
        # (A call that raises fails its batch: the instance itself never goes away.)
        return InternalError(f"model instance '{self._instance_name}' went away")

    def core_restart(self) -> TritonError | None:
        return None

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        return self._instance.execute(requests, clock)

    def unloading(self) -> None:
        self._instance.unloading()

    def stop_by(self, deadline: float) -> None:
        self._instance.stop_by(deadline)

    def finalize(self) -> None:
        try:
            self._instance.finalize()
        finally:
            if self._batches is not None:
                self._batches.close()

    def __getattr__(self, name: str) -> Any:
        # What else the server asks of an instance (its backend's own attributes).
        return getattr(self._instance, name)


def driven(
    instances: list[ModelInstance], model_name: str, version_name: str
) -> list[ModelInstance]:
    """``instances`` as the core drives them, named ``<version_name>_<index>`` as the
    instance threads of the version's other schedulers are."""
    return [
        InProcessDriven(instance, model_name, f"{version_name}_{index}")
        for index, instance in enumerate(instances)
    ]
