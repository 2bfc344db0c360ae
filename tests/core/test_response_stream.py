"""The response-stream contract over the real schedulers and Rust queues: decoupled requests
answered through their senders from other threads, single-response requests through a
sender, cancellation reaching the producer, senders dropped without a final flag, stopping a
model with streams open, per-instance queues chosen by a scheduler, and the server handle's
refusal to wait on the event loop's own thread."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any, ClassVar

import pytest
from google.protobuf import text_format
from tritonfast._core import RequestQueue
from tritonfast._proto import model_config_pb2
from tritonfast.api.serverhandle import ServerHandle
from tritonfast.backends.base import ModelInstance, PhaseClock, Result
from tritonfast.data.types import InferRequest, InferResponse
from tritonfast.errors import InternalError, UnavailableError
from tritonfast.runtime import looprun
from tritonfast.runtime.instance import running_instance
from tritonfast.runtime.responses import (
    FINAL_FIRST_MESSAGE,
    ONE_RESPONSE_MESSAGE,
    SENDER_CLOSED_MESSAGE,
    STREAM_BUFFER,
    ResponseSender,
    ResponseStream,
    Streamed,
    sender_of,
)
from tritonfast.runtime.scheduler import (
    DefaultScheduler,
    QueueScheduler,
    Scheduler,
    SequenceScheduler,
    create_scheduler,
)

from tests.core.test_scheduler import WAIT_S, model, request
from tests.waiting import wait_for_async

DECOUPLED = "model_transaction_policy { decoupled: true }"


def response(req: InferRequest, tag: str) -> InferResponse:
    return InferResponse(req.model_name, req.model_version, f"{req.id}:{tag}")


class Streamer(ModelInstance):
    """Decoupled: answers each request from a thread of its own with ``count`` responses (the
    request parameter), then a bare final flag; it takes one of ``steps`` before each response
    and records what it saw of cancellation."""

    def __init__(self, steps: int = 1000) -> None:
        self.steps = threading.Semaphore(steps)
        self.saw_cancel = threading.Event()
        self.dropped = False  # drop the sender without a final flag instead

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        for req in requests:
            if self.dropped:
                req.sender = None  # the model lets go of it: nothing else holds it
                continue
            threading.Thread(target=self._answer, args=(req.sender, req), daemon=True).start()
        return None

    def _answer(self, sender: Any, req: InferRequest) -> None:
        try:
            for index in range(int(req.parameters.get("count", 1))):
                if not self.steps.acquire(timeout=WAIT_S):
                    return  # the test never let it go on
                if sender.is_cancelled():
                    self.saw_cancel.set()
                    break
                sender.send(response(req, str(index)))
            sender.send(final=True)
        except InternalError as error:  # the model was stopped: its sender is closed
            assert error.message == SENDER_CLOSED_MESSAGE


def run(
    config_text: str,
    instances: list[ModelInstance],
    scenario: Any,
    kind: type[QueueScheduler] | None = None,
) -> None:
    async def main() -> None:
        config = model(config_text)
        loop = asyncio.get_running_loop()
        scheduler: Scheduler = (
            create_scheduler("m_1", config, instances, loop)
            if kind is None
            else kind("m_1", config, instances, loop)
        )
        try:
            await asyncio.wait_for(scenario(scheduler), WAIT_S * 2)
        finally:
            await asyncio.to_thread(scheduler.stop, WAIT_S)

    asyncio.run(main())


async def collect(stream: Any) -> list[Streamed]:
    return [item async for item in stream]


@pytest.mark.timeout(60)
def test_decoupled_responses_come_in_order_then_a_bare_final() -> None:
    async def scenario(scheduler: Scheduler) -> None:
        streams = [scheduler.open_stream(request(f"r{i}", count=i), 1) for i in range(4)]
        results = await asyncio.gather(*(collect(s) for s in streams))
        for i, items in enumerate(results):
            assert [item.result.id for item in items[:-1]] == [f"r{i}:{n}" for n in range(i)]
            assert items[-1] == Streamed(None, True)
            assert not any(item.final for item in items[:-1])

    run(DECOUPLED, [Streamer()], scenario)


@pytest.mark.timeout(60)
def test_cancelling_a_stream_reaches_the_running_producer() -> None:
    streamer = Streamer(steps=1)

    async def scenario(scheduler: Scheduler) -> None:
        stream = scheduler.open_stream(request("r", count=100), 1)
        first = await anext(stream)
        assert first.result.id == "r:0"
        stream.cancel()
        streamer.steps.release()  # the producer goes on and finds its request cancelled
        assert await asyncio.to_thread(streamer.saw_cancel.wait, WAIT_S)
        assert [item async for item in stream] == []  # what it sends now is dropped

    run(DECOUPLED, [streamer], scenario)


@pytest.mark.timeout(60)
def test_a_sender_dropped_without_final_ends_the_stream_with_an_error() -> None:
    streamer = Streamer()
    streamer.dropped = True

    async def scenario(scheduler: Scheduler) -> None:
        stream = scheduler.open_stream(request("lost"), 1)
        gc.collect()
        (item,) = await collect(stream)
        assert item.final
        assert isinstance(item.result, InternalError)
        assert "'lost'" in item.result.message and "final flag" in item.result.message

    run(DECOUPLED, [streamer], scenario)


@pytest.mark.timeout(60)
def test_stopping_the_model_ends_open_streams() -> None:
    streamer = Streamer(steps=1)

    async def scenario(scheduler: Scheduler) -> None:
        stream = scheduler.open_stream(request("open", count=5), 1)
        assert (await anext(stream)).result.id == "open:0"  # then it waits for a step
        await asyncio.to_thread(scheduler.stop, WAIT_S)
        items = await collect(stream)
        assert items[-1].final and isinstance(items[-1].result, UnavailableError)
        streamer.steps.release(5)

    run(DECOUPLED, [streamer], scenario)


class ThroughSender(ModelInstance):
    """Single-response model answering through its requests' senders after returning None;
    records the errors Triton's rules give for the sends it must not make."""

    def __init__(self) -> None:
        self.refusals: list[str] = []

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        for req in requests:
            sender = sender_of(req)
            try:
                sender.send(final=True)
            except InternalError as error:
                self.refusals.append(error.message)
            sender.send(response(req, "held"))  # held until the final flag
            try:
                sender.send(response(req, "second"))
            except InternalError as error:
                self.refusals.append(error.message)
            threading.Thread(target=sender.send, kwargs={"final": True}).start()
        return None


@pytest.mark.timeout(60)
def test_single_response_requests_answered_through_their_senders() -> None:
    instance = ThroughSender()

    async def scenario(scheduler: Scheduler) -> None:
        assert (await scheduler.infer(request("a"), 1)).id == "a:held"
        (item,) = await collect(scheduler.open_stream(request("b"), 1))
        assert item == Streamed(item.result, True) and item.result.id == "b:held"
        assert instance.refusals == [FINAL_FIRST_MESSAGE, ONE_RESPONSE_MESSAGE] * 2

    run("", [instance], scenario)


@pytest.mark.timeout(60)
def test_a_send_after_the_final_flag_is_refused() -> None:
    async def scenario(scheduler: Scheduler) -> None:
        req = request("x")
        stream = scheduler.open_stream(req, 1)
        (item,) = await collect(stream)
        with pytest.raises(InternalError) as caught:
            req.sender.send(response(req, "late"))
        assert caught.value.message == SENDER_CLOSED_MESSAGE
        assert item.final

    class Once(ModelInstance):
        def execute(self, requests: list[InferRequest], clock: PhaseClock) -> None:
            for req in requests:
                req.sender.send(response(req, "only"), final=True)

    run(DECOUPLED, [Once()], scenario)


class Named(ModelInstance):
    """Answers with the index of the instance that ran the request."""

    def __init__(self, index: int) -> None:
        self.index = index

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        return [response(req, str(self.index)) for req in requests]


class ByParameter(DefaultScheduler):
    """Routes each request to the instance its ``instance`` parameter names."""

    per_instance_queues: ClassVar[bool] = True

    def route(self, request: InferRequest) -> int:
        return int(request.parameters["instance"])


@pytest.mark.timeout(60)
def test_a_scheduler_routes_requests_to_chosen_instances() -> None:
    async def scenario(scheduler: Scheduler) -> None:
        chosen = [2, 0, 1, 2, 2, 0]
        answers = await asyncio.gather(
            *(scheduler.infer(request(f"r{i}", instance=c), 1) for i, c in enumerate(chosen))
        )
        assert [a.id for a in answers] == [f"r{i}:{c}" for i, c in enumerate(chosen)]
        stats = scheduler.statistics()  # one set for the model version, all queues counted
        assert stats["inference_stats"]["success"]["count"] == len(chosen)
        assert stats["execution_count"] == len(chosen)

    run("", [Named(i) for i in range(3)], scenario, kind=ByParameter)


def test_queues_sharing_statistics_belong_to_one_model_version() -> None:
    first = RequestQueue()
    second = RequestQueue(share_statistics_with=first)
    second.push(("item", None), 1)
    batch = second.pop(0)
    assert batch is not None
    batch.report([None], 0, 0, 0)
    assert first.statistics()["execution_count"] == 1


# -- the rule for the event loop ----------------------------------------------------------------
class CallsServer(ModelInstance):
    """Short executions that tell the server they waited on it (what the handle does)."""

    may_run_on_event_loop = True

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result]:
        instance = running_instance()
        assert instance is not None
        instance.calls_server()
        self.thread = threading.current_thread()
        return [response(req, "ok") for req in requests]


@pytest.mark.timeout(120)
def test_a_model_that_calls_the_server_never_moves_to_the_loop() -> None:
    instance = CallsServer()

    async def scenario(scheduler: Scheduler) -> None:
        for i in range(looprun.WARM_BATCHES * 2):
            await scheduler.infer(request(f"r{i}"), 1)
        assert not scheduler.runs_on_loop
        assert instance.thread is not threading.main_thread()

    async def main() -> None:
        config = model("")
        scheduler = create_scheduler(
            "m_1", config, [instance], asyncio.get_running_loop(), loop_execution=True
        )
        try:
            await asyncio.wait_for(scenario(scheduler), WAIT_S * 3)
        finally:
            await asyncio.to_thread(scheduler.stop, WAIT_S)

    asyncio.run(main())


def test_the_handle_refuses_to_wait_on_the_loops_own_thread() -> None:
    async def main() -> None:
        handle = ServerHandle(dataplane=None, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
        with pytest.raises(UnavailableError) as caught:
            handle.infer(request("r"))
        assert "cannot wait for the server" in caught.value.message

    asyncio.run(main())


def test_the_config_decides_the_scheduler() -> None:
    config = text_format.Parse("sequence_batching {}", model_config_pb2.ModelConfig(name="seq"))
    loop = asyncio.new_event_loop()
    try:
        scheduler = create_scheduler("seq_1", config, [Streamer()], loop)
        assert isinstance(scheduler, SequenceScheduler)
        scheduler.stop(WAIT_S)
    finally:
        loop.close()


def test_a_slow_consumer_blocks_the_sender_at_the_stream_buffer() -> None:
    """Backpressure: at most STREAM_BUFFER responses wait for the consumer; send() blocks
    until it takes one, and returns at once when it goes away."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stream = ResponseStream(loop)
        sender = ResponseSender(stream, "r", decoupled=True)
        req = request("r")
        sent = 0

        def produce(count: int) -> None:
            nonlocal sent
            for index in range(count):
                sender.send(response(req, str(index)))
                sent += 1

        producer = threading.Thread(target=produce, args=(STREAM_BUFFER + 10,))
        producer.start()
        await wait_for_async(lambda: sent == STREAM_BUFFER, "a full buffer")
        assert producer.is_alive()  # blocked on the eleventh response beyond the buffer
        for _ in range(10):
            await anext(stream)
        await wait_for_async(lambda: sent == STREAM_BUFFER + 10, "the rest sent")
        producer.join(WAIT_S)
        # A consumer that goes away releases a blocked sender.
        producer = threading.Thread(target=produce, args=(20,))
        producer.start()
        await wait_for_async(lambda: sent == STREAM_BUFFER + 10, "still blocked")
        stream.cancel()
        await wait_for_async(lambda: not producer.is_alive(), "the sender released")
        sender.send(final=True)

    asyncio.run(main())
