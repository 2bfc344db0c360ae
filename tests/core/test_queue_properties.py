"""Properties of ``tritonfast._core.RequestQueue`` through its Python API.

The single-threaded properties push a generated workload, close the queue and drain it: with
everything staged, the exact sequence of batches is determined, and is compared with a small
reference model of Triton's batching rules (priority order, FIFO within a level, shape
grouping, batch limits, preferred sizes). The threaded tests check delivery under contention,
wake-ups and the delay bound; every one has a timeout, so a deadlock fails instead of hanging.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._core import QUEUE_FULL_MESSAGE, QueuePolicy, RequestQueue
from tritonfast.errors import InvalidArgumentError, UnavailableError

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONG_US = 10_000_000


@dataclass(frozen=True)
class Entry:
    id: int
    priority: int  # as pushed: 0 (default), 1.., possibly above the levels
    size: int
    shape: int


@dataclass(frozen=True)
class Config:
    max_batch_size: int
    preferred: list[int]
    priority_levels: int
    default_priority_level: int


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Config, list[Entry]]:
    max_batch = draw(st.integers(0, 8))
    preferred = sorted(draw(st.sets(st.integers(1, max_batch), max_size=3))) if max_batch else []
    levels = draw(st.integers(0, 3))
    default = draw(st.integers(1, levels)) if levels else 0
    count = draw(st.integers(0, 40))
    entries = [
        Entry(
            id=i,
            priority=draw(st.integers(0, levels + 1)),
            size=draw(st.integers(1, max_batch)) if max_batch else 1,
            shape=draw(st.integers(0, 2)),
        )
        for i in range(count)
    ]
    return Config(max_batch, preferred, levels, default), entries


def make_queue(config: Config, delay_us: int = LONG_US) -> RequestQueue:
    return RequestQueue(
        config.max_batch_size,
        delay_us,
        config.preferred,
        priority_levels=config.priority_levels,
        default_priority_level=config.default_priority_level,
    )


def level_of(entry: Entry, config: Config) -> int:
    if config.priority_levels == 0:
        return 0
    if entry.priority == 0 or entry.priority > config.priority_levels:
        return config.default_priority_level
    return entry.priority


def reference_batches(config: Config, entries: list[Entry]) -> list[list[int]]:
    """Triton's dynamic batcher on a closed queue holding ``entries`` (delay not exceeded)."""
    order = sorted(entries, key=lambda e: level_of(e, config))  # stable: FIFO per level
    max_batch, preferred = config.max_batch_size, config.preferred
    if max_batch == 0:
        return [[e.id] for e in order]
    max_preferred = max(preferred) if preferred else max_batch
    batches: list[list[int]] = []
    while order:
        total, run, best = 0, 0, None
        for i, entry in enumerate(order):
            if i > 0:
                if total + entry.size > max_preferred and best is None:
                    best = i
                if total + entry.size > max_batch or entry.shape != order[0].shape:
                    break
            total += entry.size
            run = i + 1
            if total in preferred:
                best = i + 1
        cut = best if best is not None else run
        batches.append([e.id for e in order[:cut]])
        order = order[cut:]
    return batches


def push_all(queue: RequestQueue, entries: list[Entry], cancellable: bool = False) -> list:
    push = queue.push_cancellable if cancellable else queue.push
    return [push(e.id, e.size, e.priority, 0, e.shape) for e in entries]


def drain(queue: RequestQueue) -> list[list[int]]:
    """Every batch of a closed queue, in order; checks each is non-empty and never rejected."""
    batches: list[list[int]] = []
    while (batch := queue.pop(0)) is not None:
        assert not batch.rejected
        assert batch.items, "a closed queue never returns an empty batch"
        assert batch.seq == len(batches)
        batches.append(batch.items)
    return batches


@pytest.mark.timeout(60)
@SETTINGS
@given(workloads())
def test_batches_follow_tritons_rules(workload: tuple[Config, list[Entry]]) -> None:
    config, entries = workload
    queue = make_queue(config)
    push_all(queue, entries)
    assert len(queue) == len(entries)
    queue.close()
    got = drain(queue)
    assert got == reference_batches(config, entries)

    # The same facts, stated directly.
    by_id = {e.id: e for e in entries}
    delivered = [i for batch in got for i in batch]
    assert sorted(delivered) == [e.id for e in entries], "lost or duplicated"
    levels = [level_of(by_id[i], config) for i in delivered]
    assert levels == sorted(levels), "a lower priority level went first"
    for level in set(levels):
        ids = [i for i in delivered if level_of(by_id[i], config) == level]
        assert ids == sorted(ids), "not FIFO within a level"
    for batch in got:
        if config.max_batch_size:
            assert sum(by_id[i].size for i in batch) <= config.max_batch_size
            assert len({by_id[i].shape for i in batch}) == 1, "shapes mixed"
        else:
            assert len(batch) == 1


@pytest.mark.timeout(60)
@SETTINGS
@given(
    max_batch=st.integers(2, 16),
    preferred=st.sets(st.integers(1, 16), min_size=1, max_size=3),
    waiting=st.integers(1, 40),
)
def test_preferred_sizes_form_when_enough_requests_wait(
    max_batch: int, preferred: set[int], waiting: int
) -> None:
    sizes = sorted(p for p in preferred if p <= max_batch) or [max_batch]
    queue = RequestQueue(max_batch, LONG_US, sizes)
    for i in range(waiting):
        queue.push(i)
    # Not closed: only a batch that may leave now comes out of a poll.
    batch = queue.pop(0)
    assert batch is not None
    reachable = [p for p in sizes if p <= waiting]
    if reachable:
        assert len(batch) == max(reachable)
    else:
        assert len(batch) == 0, "a batch below every preferred size left before its delay"


@pytest.mark.timeout(60)
@SETTINGS
@given(workloads(), st.data())
def test_cancel_removes_exactly_the_cancelled_requests(
    workload: tuple[Config, list[Entry]], data: st.DataObject
) -> None:
    config, entries = workload
    queue = make_queue(config)
    tickets = push_all(queue, entries, cancellable=True)
    doomed = data.draw(st.sets(st.sampled_from(range(len(entries))))) if entries else set()
    for i in doomed:
        assert queue.cancel(tickets[i]) is True
        assert queue.cancel(tickets[i]) is False
        assert tickets[i].status == "CANCELLED"
    assert len(queue) == len(entries) - len(doomed)
    queue.close()
    kept = [e for e in entries if e.id not in doomed]
    assert drain(queue) == reference_batches(config, kept)
    for i, ticket in enumerate(tickets):
        assert ticket.status == ("CANCELLED" if i in doomed else "TAKEN")
        assert queue.cancel(ticket) is False, "cancelled after it was handed out"
    stats = queue.statistics()
    assert stats["failure_reasons"]["CANCELED"] == len(doomed)
    assert stats["inference_stats"]["fail"]["count"] == len(doomed)


@pytest.mark.timeout(30)
def test_a_ticket_of_another_queue_is_refused() -> None:
    ticket = RequestQueue().push_cancellable("x")
    with pytest.raises(InvalidArgumentError):
        RequestQueue().cancel(ticket)


@pytest.mark.timeout(30)
@settings(max_examples=30, deadline=None)
@given(limit=st.integers(1, 5), extra=st.integers(1, 5))
def test_a_full_level_rejects_with_tritons_message(limit: int, extra: int) -> None:
    queue = RequestQueue(
        4,
        LONG_US,
        [4],
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy={1: QueuePolicy(max_queue_size=limit)},
    )
    for i in range(limit):
        queue.push(i, 1, 1)
    for i in range(extra):
        with pytest.raises(UnavailableError) as err:
            queue.push(i, 1, 1)
        assert err.value.message == QUEUE_FULL_MESSAGE == "Exceeds maximum queue size"
        queue.push(i, 1, 2)  # level 2 has no limit
    assert len(queue) == limit + extra
    assert queue.statistics()["failure_reasons"]["REJECTED"] == extra


@pytest.mark.timeout(30)
def test_an_idle_consumer_rejects_timed_out_requests() -> None:
    # The batch would wait 10 s for its delay; the 50 ms queue timeout fires first and the
    # waiting pop returns the request as rejected.
    queue = RequestQueue(
        4, LONG_US, [4], default_queue_policy=QueuePolicy("REJECT", default_timeout_us=50_000)
    )
    pushed = time.monotonic()
    queue.push("late")
    batch = queue.pop(20_000_000)
    waited = time.monotonic() - pushed
    assert batch is not None
    assert batch.rejected == ("late",)
    assert batch.items == []
    assert 0.05 <= waited < 5.0
    stats = queue.statistics()
    assert stats["failure_reasons"]["REJECTED"] == 1
    assert stats["inference_stats"]["fail"]["ns"] >= 50_000_000


@pytest.mark.timeout(30)
def test_a_request_may_only_shorten_its_timeout() -> None:
    policy = QueuePolicy("REJECT", default_timeout_us=20_000_000, allow_timeout_override=True)
    queue = RequestQueue(4, LONG_US, [4], default_queue_policy=policy)
    queue.push("short", 1, 0, 30_000)
    batch = queue.pop(20_000_000)
    assert batch is not None and batch.rejected == ("short",)
    # Without a default timeout there is nothing to shorten: the request waits for its batch.
    lenient = QueuePolicy(allow_timeout_override=True)
    queue = RequestQueue(4, 50_000, [4], default_queue_policy=lenient)
    queue.push("kept", 1, 0, 1)
    batch = queue.pop(20_000_000)
    assert batch is not None and batch.items == ["kept"] and batch.rejected == ()


@pytest.mark.timeout(30)
def test_delay_moves_an_expired_request_behind_its_level() -> None:
    # Level 2 delays expired requests; level 1 rejects them. "a" (level 2) and the sentinel
    # (level 1) share a 50 ms timeout, "a" pushed first: when the sentinel comes back rejected,
    # "a" has expired too and moved behind level 2's fresh requests.
    queue = RequestQueue(
        8,
        LONG_US,
        [8],
        priority_levels=2,
        default_priority_level=2,
        default_queue_policy=QueuePolicy("DELAY", default_timeout_us=50_000),
        priority_queue_policy={1: QueuePolicy("REJECT", default_timeout_us=50_000)},
    )
    queue.push("a", 1, 2)
    queue.push("sentinel", 1, 1)
    batch = queue.pop(20_000_000)
    assert batch is not None and batch.rejected == ("sentinel",)
    queue.push("b", 1, 2)
    queue.push("c", 1, 1)
    queue.close()
    assert drain(queue) == [["c", "b", "a"]]
    assert queue.statistics()["failure_reasons"]["REJECTED"] == 1


@pytest.mark.timeout(60)
def test_no_request_waits_much_past_its_delay_when_a_consumer_is_idle() -> None:
    delay_us = 20_000
    queue = RequestQueue(16, delay_us, [16])
    waits: list[float] = []
    received = threading.Event()

    def consume() -> None:
        while (batch := queue.pop(LONG_US)) is not None:
            for pushed_at in batch.items:
                waits.append(time.monotonic() - pushed_at)
            received.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        for _ in range(10):
            received.clear()
            for _ in range(3):  # below the preferred size: the batch waits for its delay
                queue.push(time.monotonic())
            assert received.wait(10), "the batch never left"
    finally:
        queue.close()
        consumer.join(10)
    assert not consumer.is_alive()
    assert len(waits) == 30
    # Never early (the first push of each batch waited the full delay; later ones a bit less);
    # never late beyond generous slack for a noisy machine.
    assert max(waits) >= delay_us / 1e6
    assert max(waits) < delay_us / 1e6 + 2.0


@pytest.mark.timeout(60)
def test_threads_lose_nothing_and_keep_per_producer_order() -> None:
    producers, per_producer, consumers = 3, 3_000, 2
    queue = RequestQueue(8, 100, [4, 8], priority_levels=2, default_priority_level=2)
    results: list[list[list[tuple[int, int, int]]]] = [[] for _ in range(consumers)]
    cancelled: list[set[tuple[int, int]]] = [set() for _ in range(producers)]

    def consume(out: list[list[tuple[int, int, int]]]) -> None:
        while (batch := queue.pop(1_000)) is not None:
            assert not batch.rejected
            if batch.items:
                out.append(batch.items)

    def produce(p: int) -> None:
        for seq in range(per_producer):
            priority = 1 + (seq * 7 + p) % 2
            ticket = queue.push_cancellable((p, seq, priority), 1 + seq % 3, priority)
            if seq % 11 == 0 and queue.cancel(ticket):
                cancelled[p].add((p, seq))

    threads = [threading.Thread(target=consume, args=(out,)) for out in results]
    threads += [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads[consumers:]:
        thread.join(50)
    queue.close()
    for thread in threads[:consumers]:
        thread.join(50)
    assert not any(thread.is_alive() for thread in threads), "deadlock"

    seen: set[tuple[int, int]] = set()
    for out in results:
        last: dict[tuple[int, int], int] = {}
        for batch in out:
            assert sum(1 + seq % 3 for _, seq, _ in batch) <= 8
            for p, seq, priority in batch:
                assert (p, seq) not in seen, "delivered twice"
                seen.add((p, seq))
                prev = last.get((p, priority), -1)
                assert prev < seq, "one producer's requests of a level out of order"
                last[(p, priority)] = seq
    expected = {(p, s) for p in range(producers) for s in range(per_producer)}
    gone = set().union(*cancelled)
    assert seen | gone == expected and not (seen & gone), "lost, or cancelled yet delivered"
