"""The queue schedulers (``tritonfast.runtime.scheduler``) over the Rust queue, with real backends.

The backends here are small ``ModelInstance`` implementations that answer every request and record
which requests shared each execution; a gate (a ``threading.Event``) holds an execution so
requests pile up in the queue. Each test runs its own event loop and stops its scheduler.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import ModelInstance, PhaseClock, Result
from tritonfast.data.types import InferRequest, InferResponse, InputTensor
from tritonfast.errors import Code, InvalidArgumentError, UnavailableError
from tritonfast.runtime.scheduler import Scheduler, create_scheduler

WAIT_S = 10.0


class Recorder(ModelInstance):
    """Answers each request with an empty response (an error for ids starting with "bad"),
    records the request ids of every execution, and holds executions while ``gate`` is shut."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.batches: list[list[str]] = []
        self.started = threading.Event()

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        self.started.set()
        if self.gate is not None and not self.gate.wait(WAIT_S):
            raise RuntimeError("the test never opened the gate")
        self.batches.append([r.id for r in requests])
        return [
            InvalidArgumentError(f"refused {r.id}")
            if r.id.startswith("bad")
            else InferResponse(r.model_name, r.model_version, r.id)
            for r in requests
        ]


def model(text: str) -> model_config_pb2.ModelConfig:
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    config.name = "m"
    config.input.add(name="INPUT0", data_type=model_config_pb2.TYPE_FP32, dims=[-1])
    return config


def request(rid: str, rows: int = 1, cols: int = 1, **parameters: Any) -> InferRequest:
    data = np.zeros((rows, cols), dtype=np.float32)
    return InferRequest(
        model_name="m",
        id=rid,
        inputs=[InputTensor("INPUT0", "FP32", data.shape, data)],
        parameters=parameters,
    )


def run(
    config: model_config_pb2.ModelConfig,
    backends: list[ModelInstance],
    scenario: Callable[[Scheduler], Awaitable[None]],
) -> None:
    async def main() -> None:
        scheduler = create_scheduler("m_1", config, backends, asyncio.get_running_loop())
        try:
            await asyncio.wait_for(scenario(scheduler), WAIT_S * 2)
        finally:
            scheduler.stop(WAIT_S)

    asyncio.run(main())


async def started(backend: Recorder) -> None:
    assert await asyncio.to_thread(backend.started.wait, WAIT_S), "the backend never ran"


@pytest.mark.timeout(60)
def test_a_cancelled_queued_request_never_runs() -> None:
    gate = threading.Event()
    backend = Recorder(gate)

    async def scenario(scheduler: Scheduler) -> None:
        first = asyncio.create_task(scheduler.infer(request("r1"), 1))
        await started(backend)  # r1 runs (held); r2 will wait in the queue
        second = asyncio.create_task(scheduler.infer(request("r2"), 1))
        await asyncio.sleep(0)  # let r2 reach the queue
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        gate.set()
        await first
        await scheduler.infer(request("r3"), 1)
        assert backend.batches == [["r1"], ["r3"]]
        stats = scheduler.statistics()
        assert stats["failure_reasons"]["CANCELED"] == 1
        assert stats["inference_stats"]["success"]["count"] == 2

    run(model(""), [backend], scenario)


@pytest.mark.timeout(60)
def test_a_cancelled_running_request_completes_without_harm() -> None:
    gate = threading.Event()
    backend = Recorder(gate)

    async def scenario(scheduler: Scheduler) -> None:
        task = asyncio.create_task(scheduler.infer(request("r1"), 1))
        await started(backend)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        await scheduler.infer(request("r2"), 1)
        assert backend.batches == [["r1"], ["r2"]]
        assert scheduler.statistics()["failure_reasons"]["CANCELED"] == 0

    run(model(""), [backend], scenario)


@pytest.mark.timeout(60)
def test_queue_timeout_rejects_with_tritons_message() -> None:
    # The batch would wait 10 s; the 50 ms queue timeout fires first.
    config = model(
        "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 10000000"
        " preferred_batch_size: 8"
        " default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 50000 } }"
    )

    async def scenario(scheduler: Scheduler) -> None:
        with pytest.raises(UnavailableError) as err:
            await scheduler.infer(request("r1"), 1)
        assert err.value.message == "Request timeout expired"
        assert err.value.code == Code.UNAVAILABLE
        assert scheduler.statistics()["failure_reasons"]["REJECTED"] == 1

    run(config, [Recorder()], scenario)


@pytest.mark.timeout(60)
def test_a_request_timeout_parameter_shortens_the_default() -> None:
    config = model(
        "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 10000000"
        " preferred_batch_size: 8 default_queue_policy { default_timeout_microseconds: 60000000"
        " allow_timeout_override: true } }"
    )

    async def scenario(scheduler: Scheduler) -> None:
        with pytest.raises(UnavailableError, match=r"^Request timeout expired$"):
            await scheduler.infer(request("r1", timeout=50_000), 1)

    run(config, [Recorder()], scenario)


@pytest.mark.timeout(60)
def test_a_full_queue_rejects_with_tritons_message() -> None:
    gate = threading.Event()
    backend = Recorder(gate)
    config = model(
        "max_batch_size: 1 dynamic_batching { default_queue_policy { max_queue_size: 1 } }"
    )

    async def scenario(scheduler: Scheduler) -> None:
        running = asyncio.create_task(scheduler.infer(request("r1"), 1))
        await started(backend)
        queued = asyncio.create_task(scheduler.infer(request("r2"), 1))
        await asyncio.sleep(0)
        with pytest.raises(UnavailableError) as err:
            await scheduler.infer(request("r3"), 1)
        assert err.value.message == "[request id: r3] Exceeds maximum queue size"
        with pytest.raises(UnavailableError) as err:
            await scheduler.infer(request(""), 1)
        assert err.value.message == "[request id: <id_unknown>] Exceeds maximum queue size"
        gate.set()
        await asyncio.gather(running, queued)
        assert scheduler.statistics()["failure_reasons"]["REJECTED"] == 2

    run(config, [backend], scenario)


@pytest.mark.timeout(60)
def test_priority_parameters_order_the_queue() -> None:
    gate = threading.Event()
    backend = Recorder(gate)
    config = model(
        "max_batch_size: 1 dynamic_batching { priority_levels: 3 default_priority_level: 2 }"
    )

    async def scenario(scheduler: Scheduler) -> None:
        tasks = [asyncio.create_task(scheduler.infer(request("first"), 1))]
        await started(backend)
        for rid, params in [
            ("low", {"priority": 3}),
            ("default", {}),
            ("high", {"priority": 1}),
            ("out-of-range", {"priority": 9}),
            ("high-2", {"priority": 1}),
        ]:
            tasks.append(asyncio.create_task(scheduler.infer(request(rid, **params), 1)))
            await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)
        order = [batch[0] for batch in backend.batches]
        assert order == ["first", "high", "high-2", "default", "out-of-range", "low"]

    run(config, [backend], scenario)


@pytest.mark.timeout(60)
def test_requests_batch_only_with_matching_shapes() -> None:
    backend = Recorder()
    config = model(
        "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 5000000"
        " preferred_batch_size: 3 }"
    )

    async def scenario(scheduler: Scheduler) -> None:
        # Batch dimensions differ (1 and 2 rows) but non-batch dimensions match per pair. The
        # "b" pair cannot join the "a" batch (which leaves as soon as it meets "b1", or at its
        # preferred size 3); each pair forms its own batch without waiting for the 5 s delay.
        await asyncio.gather(
            scheduler.infer(request("a1", rows=1, cols=3), 1),
            scheduler.infer(request("a2", rows=2, cols=3), 2),
            scheduler.infer(request("b1", rows=1, cols=5), 1),
            scheduler.infer(request("b2", rows=2, cols=5), 2),
        )
        assert backend.batches == [["a1", "a2"], ["b1", "b2"]]

    run(config, [backend], scenario)


@pytest.mark.timeout(60)
def test_statistics_count_requests_executions_and_batch_sizes() -> None:
    backend = Recorder()
    config = model(
        "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 5000000"
        " preferred_batch_size: 8 }"
    )

    async def scenario(scheduler: Scheduler) -> None:
        assert scheduler.statistics()["last_inference"] == 0
        results = await asyncio.gather(
            *(scheduler.infer(request(rid, rows=2), 2) for rid in ("a", "b", "c", "bad")),
            return_exceptions=True,
        )
        assert [type(r).__name__ for r in results] == [
            "InferResponse",
            "InferResponse",
            "InferResponse",
            "InvalidArgumentError",
        ]
        stats = scheduler.statistics()
        inference = stats["inference_stats"]
        assert stats["execution_count"] == 1
        assert stats["inference_count"] == 6  # 3 successful requests of batch size 2
        assert stats["last_inference"] > 1_600_000_000_000
        assert inference["success"]["count"] == 3
        assert inference["fail"]["count"] == 1
        assert stats["failure_reasons"] == {
            "REJECTED": 0,
            "CANCELED": 0,
            "BACKEND": 1,
            "OTHER": 0,
        }
        for key in ("queue", "compute_input", "compute_infer", "compute_output"):
            assert inference[key]["count"] == 3, key
        assert inference["compute_infer"]["ns"] > 0
        assert inference["success"]["ns"] >= inference["queue"]["ns"]
        assert inference["cache_hit"] == {"count": 0, "ns": 0}
        [batch] = stats["batch_stats"]
        assert batch["batch_size"] == 8
        assert batch["compute_infer"]["count"] == 1

    run(config, [backend], scenario)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("preserve", [False, True])
def test_preserve_ordering_holds_later_batches_until_earlier_ones_settle(
    preserve: bool,
) -> None:
    gate, first_running = threading.Event(), threading.Event()

    class HoldsFirst(Recorder):
        def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
            if requests[0].id == "first":
                first_running.set()  # either instance may take it
                assert gate.wait(WAIT_S)
            return [InferResponse(r.model_name, r.model_version, r.id) for r in requests]

    one, two = HoldsFirst(), HoldsFirst()
    flag = "true" if preserve else "false"
    config = model(f"max_batch_size: 1 dynamic_batching {{ preserve_ordering: {flag} }}")

    async def scenario(scheduler: Scheduler) -> None:
        done: list[str] = []
        first = asyncio.create_task(scheduler.infer(request("first"), 1))
        first.add_done_callback(lambda _: done.append("first"))
        assert await asyncio.to_thread(first_running.wait, WAIT_S)
        second = asyncio.create_task(scheduler.infer(request("second"), 1))
        second.add_done_callback(lambda _: done.append("second"))
        if preserve:
            finished, _ = await asyncio.wait({second}, timeout=0.3)
            assert not finished, "a later batch settled before an earlier one"
        else:
            await second  # the other instance answers while "first" is held
        gate.set()
        await asyncio.gather(first, second)
        assert done == (["first", "second"] if preserve else ["second", "first"])

    run(config, [one, two], scenario)
