"""Short executions move to the event loop (``tritonfast.runtime.looprun``), and back.

Real Scheduler, real Rust queue and handoff, real threads; the backends record the thread
each batch ran on. Run times are steered with sleeps: a sleep well past the thresholds makes a
batch slow, no sleep makes it fast.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
from tritonfast.backends.base import ModelInstance, PhaseClock, Result
from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import InternalError
from tritonfast.runtime import looprun
from tritonfast.runtime.scheduler import Scheduler, create_scheduler

from tests.core.test_scheduler import WAIT_S, model, request


class Timed(ModelInstance):
    """Answers every request; sleeps ``delay_s`` per batch; records (thread, batch size) and
    whether two batches ever ran at once."""

    may_run_on_event_loop = True

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.spin_s = 0.0  # computing, not sleeping
        self.collect = False  # run a garbage collection inside the batch
        self.runs: list[tuple[threading.Thread, int]] = []
        self.running = 0
        self.overlapped = False

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        self.running += 1
        self.overlapped |= self.running > 1
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            if self.spin_s:
                spin(self.spin_s)
            if self.collect:
                gc.collect()
            self.runs.append((threading.current_thread(), len(requests)))
            return [InferResponse(r.model_name, r.model_version, r.id) for r in requests]
        finally:
            self.running -= 1

    def on_loop_since(self, start: int) -> list[bool]:
        main = threading.main_thread()
        return [thread is main for thread, _ in self.runs[start:]]


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def run_with(
    config_text: str,
    backends: list[ModelInstance],
    scenario: Callable[[Scheduler], Awaitable[None]],
    *,
    loop_execution: bool = True,
) -> None:
    async def main() -> None:
        scheduler = create_scheduler(
            "m_1",
            model(config_text),
            backends,
            asyncio.get_running_loop(),
            loop_execution=loop_execution,
        )
        try:
            await asyncio.wait_for(scenario(scheduler), WAIT_S * 3)
        finally:
            await asyncio.to_thread(scheduler.stop, WAIT_S)

    asyncio.run(main())


async def one_by_one(scheduler: Scheduler, count: int, prefix: str = "r") -> None:
    for i in range(count):
        await scheduler.infer(request(f"{prefix}{i}"), 1)


@pytest.mark.timeout(120)
def test_short_executions_move_to_the_loop_after_warming_up() -> None:
    backend = Timed()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert not any(backend.on_loop_since(0)), "warm-up batches run on the instance thread"
        assert scheduler.runs_on_loop
        before = len(backend.runs)
        await one_by_one(scheduler, 50, "late")
        assert all(backend.on_loop_since(before))
        stats = scheduler.statistics()
        total = looprun.WARM_BATCHES + 50
        assert stats["execution_count"] == total
        assert stats["inference_stats"]["success"]["count"] == total

    run_with("", [backend], scenario)


@pytest.mark.timeout(120)
def test_batches_still_form_when_they_run_on_the_loop() -> None:
    backend = Timed()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        before = len(backend.runs)
        executions = scheduler.statistics()["execution_count"]
        # 32 requests at once: they reach the queue before the loop runs the first batch.
        await asyncio.gather(*(scheduler.infer(request(f"c{i}"), 1) for i in range(32)))
        sizes = [size for _, size in backend.runs[before:]]
        assert sum(sizes) == 32
        assert max(sizes) > 1, sizes
        assert all(backend.on_loop_since(before))
        assert scheduler.statistics()["execution_count"] - executions == len(sizes)

    config = "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 2000 }"
    run_with(config, [backend], scenario)


@pytest.mark.timeout(120)
def test_slow_executions_stay_on_instance_threads() -> None:
    backend = Timed(delay_s=0.002)

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES + 20)
        assert not scheduler.runs_on_loop
        assert not any(backend.on_loop_since(0))

    run_with("", [backend], scenario)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["computes", "sleeps"])
def test_a_batch_that_holds_the_loop_sends_the_model_back_for_twice_the_warm_up(how: str) -> None:
    backend = Timed()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        if how == "computes":
            backend.spin_s = looprun.BLOCK_LIMIT_NS / 1e9 * 2
        else:
            backend.delay_s = looprun.STALL_LIMIT_NS / 1e9 * 1.5
        before = len(backend.runs)
        await scheduler.infer(request("slow"), 1)
        assert backend.on_loop_since(before) == [True]
        assert not scheduler.runs_on_loop
        backend.spin_s = backend.delay_s = 0.0
        await one_by_one(scheduler, looprun.WARM_BATCHES * 2 - 1, "after")
        assert not scheduler.runs_on_loop
        assert not any(backend.on_loop_since(before + 1))
        await one_by_one(scheduler, 2, "back")
        assert scheduler.runs_on_loop, "fast again after the longer wait"
        assert backend.on_loop_since(len(backend.runs) - 1) == [True]

    run_with("", [backend], scenario)


@pytest.mark.timeout(120)
def test_a_batch_held_up_but_not_by_its_model_stays_on_the_loop() -> None:
    """Past BLOCK_LIMIT_NS but short of STALL_LIMIT_NS without computing: what a batch looks
    like when the loop's thread waited for a core or for the GIL."""
    backend = Timed()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        backend.delay_s = (looprun.BLOCK_LIMIT_NS + looprun.STALL_LIMIT_NS) / 2e9
        await scheduler.infer(request("held up"), 1)
        backend.delay_s = 0.0
        assert scheduler.runs_on_loop

    run_with("", [backend], scenario)


@pytest.mark.timeout(120)
def test_a_garbage_collection_during_a_batch_is_not_charged_to_the_model() -> None:
    """A full collection in a big server computes for tens of ms inside whichever batch
    triggers it; here one that computes past STALL_LIMIT_NS leaves the model on the loop."""
    backend = Timed()

    def slow_collection(phase: str, info: dict) -> None:
        if phase == "start":
            spin(2 * looprun.STALL_LIMIT_NS / 1e9)

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        before = len(backend.runs)
        backend.collect = True
        gc.callbacks.append(slow_collection)
        try:
            await scheduler.infer(request("collects"), 1)
        finally:
            gc.callbacks.remove(slow_collection)
            backend.collect = False
        assert backend.on_loop_since(before) == [True]
        assert scheduler.runs_on_loop

    run_with("", [backend], scenario)


@pytest.mark.timeout(120)
def test_a_model_slow_on_the_loop_goes_back_to_its_threads() -> None:
    backend = Timed()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        # Slower than SLOW_NS, faster than BLOCK_LIMIT_NS: it takes a full window to tell.
        backend.delay_s = (looprun.SLOW_NS + looprun.BLOCK_LIMIT_NS) / 2e9
        before = len(backend.runs)
        await one_by_one(scheduler, looprun.WINDOW, "slow")
        assert backend.on_loop_since(before) == [True] * looprun.WINDOW
        assert not scheduler.runs_on_loop

    run_with("", [backend], scenario)


@pytest.mark.timeout(120)
def test_every_instance_hands_off_and_none_runs_two_batches_at_once() -> None:
    backends = [Timed(), Timed(), Timed()]

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        starts = [len(b.runs) for b in backends]
        await asyncio.gather(*(scheduler.infer(request(f"c{i}"), 1) for i in range(300)))
        late = [b.on_loop_since(s) for b, s in zip(backends, starts, strict=True)]
        assert sum(len(runs) for runs in late) == 300
        assert all(all(runs) for runs in late)
        assert sum(1 for runs in late if runs) >= 2, "batches came from several instances"
        assert not any(b.overlapped for b in backends)

    run_with("", backends, scenario)


@pytest.mark.timeout(120)
def test_thread_mode_never_uses_the_loop() -> None:
    backend = Timed()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES * 2)
        assert not scheduler.runs_on_loop
        assert not any(backend.on_loop_since(0))

    run_with("", [backend], scenario, loop_execution=False)


@pytest.mark.timeout(120)
def test_stopping_with_batches_in_flight_on_the_loop_answers_them_all() -> None:
    backend = Timed()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        pending = [asyncio.create_task(scheduler.infer(request(f"p{i}"), 1)) for i in range(100)]
        await asyncio.sleep(0)  # every request reaches the queue
        started = time.monotonic()
        await asyncio.to_thread(scheduler.stop, WAIT_S)
        assert time.monotonic() - started < WAIT_S / 2, "stop waited for a timeout"
        answers = await asyncio.gather(*pending)
        assert [a.id for a in answers] == [f"p{i}" for i in range(100)]

    run_with("", [backend], scenario)


class Failing(Timed):
    """Like Timed, until ``fail`` is set: then it answers with an error, or raises ``raises``."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False
        self.raises: BaseException | None = None

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        if self.raises is not None:
            raise self.raises
        if self.fail:
            self.runs.append((threading.current_thread(), len(requests)))
            return [InternalError("cannot run here") for _ in requests]
        return super().execute(requests, clock)


@pytest.mark.timeout(120)
def test_a_batch_that_fails_on_the_loop_sends_the_model_back_for_good() -> None:
    backend = Failing()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        backend.fail = True
        with pytest.raises(InternalError, match="cannot run here"):
            await scheduler.infer(request("failing"), 1)
        assert not scheduler.runs_on_loop
        backend.fail = False
        before = len(backend.runs)
        await one_by_one(scheduler, looprun.WARM_BATCHES * 2, "after")
        assert not scheduler.runs_on_loop
        assert not any(backend.on_loop_since(before))

    run_with("", [backend], scenario)


@pytest.mark.timeout(120)
def test_a_model_raising_system_exit_on_the_loop_fails_its_batch_not_the_server() -> None:
    backend = Failing()

    async def scenario(scheduler: Scheduler) -> None:
        await one_by_one(scheduler, looprun.WARM_BATCHES)
        assert scheduler.runs_on_loop
        backend.raises = SystemExit(3)
        with pytest.raises(InternalError, match="SystemExit"):
            await scheduler.infer(request("exits"), 1)
        assert not scheduler.runs_on_loop
        backend.raises = None
        answer = await scheduler.infer(request("next"), 1)
        assert answer.id == "next"

    run_with("", [backend], scenario)
