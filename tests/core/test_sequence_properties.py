"""Properties of ``tritonfast._core.SequenceBatcher`` through its Python API.

The threaded properties push random sets of sequences (int and str correlation IDs, random
lengths) in random interleavings while one consumer thread per instance takes batches and
"executes" them: every request runs exactly once, in order within its sequence, never two of
one sequence at a time, never two of one sequence in a batch, each sequence on one instance
slot for its life, and the backlog always drains. The staged properties push first and pop
after, where the batches are determined, and compare them with a small model of Triton's
rules (slot placement, direct batch positions and null entries, FIFO backlog). Plain tests
cover idle release, errors with Triton's texts, cancellation and statistics. Every test has a
timeout, so a deadlock fails instead of hanging.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonfast._core import Batch, SequenceBatcher
from tritonfast.errors import InvalidArgumentError, UnavailableError

from tests.waiting import wait_for

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LONG_IDLE_US = 60_000_000  # no sequence goes idle during a property test
POP_SLICE_US = 100_000
JOIN_S = 30.0

correlation_ids = st.one_of(
    st.integers(1, 2**64 - 1),
    st.text(min_size=1, max_size=8),
)


def start_text(model: str, corrid: object) -> str:
    return (
        f"inference request for sequence {corrid} to model '{model}' must specify the START"
        " flag on the first request of the sequence"
    )


# -- random workloads, consumed by threads --------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    instances: int
    max_batch_size: int
    strategy: str
    max_candidate_sequences: int
    preferred: list[int]
    max_queue_delay_us: int
    minimum_slot_utilization: float
    ids: list[int | str]
    lengths: list[int]
    order: list[int]  # sequence indices in push order (each appears lengths[i] times)

    def slots_per_instance(self) -> int:
        if self.strategy == "oldest" and self.max_candidate_sequences > 0:
            return self.max_candidate_sequences
        return max(self.max_batch_size, 1)

    def batcher(self) -> SequenceBatcher:
        return SequenceBatcher(
            "seq_model",
            self.instances,
            self.max_batch_size,
            strategy=self.strategy,  # type: ignore[arg-type]
            max_queue_delay_us=self.max_queue_delay_us,
            minimum_slot_utilization=self.minimum_slot_utilization,
            max_candidate_sequences=self.max_candidate_sequences,
            preferred_batch_sizes=self.preferred,
            max_sequence_idle_us=LONG_IDLE_US,
        )


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    instances = draw(st.integers(1, 3))
    max_batch_size = draw(st.integers(0, 4))
    strategy = draw(st.sampled_from(["direct", "oldest"]))
    candidates = draw(st.integers(0, 4)) if strategy == "oldest" else 0
    limit = max(max_batch_size, 1)
    preferred = (
        sorted(draw(st.sets(st.integers(1, limit), max_size=2))) if strategy == "oldest" else []
    )
    delay = draw(st.sampled_from([0, 0, 500, 2_000]))
    utilization = draw(st.sampled_from([0.0, 0.5, 1.0])) if strategy == "direct" else 0.0
    count = draw(st.integers(1, 10))
    ids = draw(st.lists(correlation_ids, min_size=count, max_size=count, unique=True))
    lengths = draw(st.lists(st.integers(1, 6), min_size=count, max_size=count))
    pushes = [index for index, length in enumerate(lengths) for _ in range(length)]
    order = draw(st.permutations(pushes))
    return Workload(
        instances,
        max_batch_size,
        strategy,
        candidates,
        preferred,
        delay,
        utilization,
        ids,
        lengths,
        list(order),
    )


class Executions:
    """What the consumer threads saw, checked as they see it (failures are collected)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.lock = threading.Lock()
        self.in_flight: set[int] = set()
        self.ran: dict[int, list[int]] = {i: [] for i in range(len(workload.ids))}
        self.placed: dict[int, tuple[int, int]] = {}
        self.batches = 0
        self.requests = 0
        self.errors: list[str] = []

    def check(self, condition: bool, message: str) -> None:
        if not condition:
            with self.lock:
                self.errors.append(message)

    def consume(self, batcher: SequenceBatcher, instance: int) -> None:
        workload = self.workload
        direct = workload.strategy == "direct"
        next_seq = 0
        try:
            while (batch := batcher.pop(instance, POP_SLICE_US)) is not None:
                items = batch.items
                if not items:
                    continue  # the wait timed out
                slots = batch.slots
                self.check(slots is not None and len(slots) == len(items), "slots per item")
                assert slots is not None
                self.check(batch.seq == next_seq, f"batch seq {batch.seq}, expected {next_seq}")
                next_seq += 1
                if direct:
                    self.check(list(slots) == list(range(len(items))), f"direct slots {slots}")
                    self.check(items[-1] is not None, "a direct batch ends with a null entry")
                    self.check(len(items) <= workload.slots_per_instance(), "batch too large")
                else:
                    self.check(None not in items, "an oldest batch holds a null entry")
                    self.check(len(set(slots)) == len(slots), "two entries of one slot")
                    self.check(len(items) <= max(workload.max_batch_size, 1), "batch too large")
                real = [
                    (slot, item)
                    for slot, item in zip(slots, items, strict=True)
                    if item is not None
                ]
                sequences = [item[0] for _, item in real]
                self.check(len(set(sequences)) == len(sequences), f"one sequence twice {items}")
                with self.lock:
                    for slot, (sequence, _) in real:
                        if sequence in self.in_flight:
                            self.errors.append(f"sequence {sequence} ran twice at once")
                        self.in_flight.add(sequence)
                        place = self.placed.setdefault(sequence, (instance, slot))
                        if place != (instance, slot):
                            self.errors.append(f"sequence {sequence} moved {place}->{slot}")
                time.sleep(0.0002)  # the execution
                with self.lock:
                    for _, (sequence, position) in real:
                        self.in_flight.discard(sequence)
                        self.ran[sequence].append(position)
                    self.batches += 1
                    self.requests += len(real)
                batch.report([None] * len(items), 1_000, 2_000, 3_000)
        except Exception as error:  # reported by the test thread
            self.check(False, f"consumer {instance} raised {error!r}")


def push_workload(batcher: SequenceBatcher, workload: Workload) -> list[Any]:
    """Pushes every request (``(sequence index, position)``) in the workload's order."""
    pushed = [0] * len(workload.ids)
    tickets = []
    for sequence in workload.order:
        position = pushed[sequence]
        pushed[sequence] += 1
        tickets.append(
            batcher.push(
                (sequence, position),
                workload.ids[sequence],
                start=position == 0,
                end=position == workload.lengths[sequence] - 1,
            )
        )
    return tickets


@pytest.mark.timeout(120)
@SETTINGS
@given(workloads(), st.booleans())
def test_every_request_runs_once_in_order_one_at_a_time(
    workload: Workload, consumers_first: bool
) -> None:
    batcher = workload.batcher()
    seen = Executions(workload)
    threads = [
        threading.Thread(target=seen.consume, args=(batcher, instance), daemon=True)
        for instance in range(workload.instances)
    ]
    if consumers_first:  # push while the instances run, or stage everything first
        for thread in threads:
            thread.start()
    tickets = push_workload(batcher, workload)
    batcher.close()
    if not consumers_first:
        for thread in threads:
            thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(thread.is_alive() for thread in threads), "an instance never finished"
    assert not seen.errors, seen.errors

    total = sum(workload.lengths)
    assert seen.requests == total
    for sequence, length in enumerate(workload.lengths):
        assert seen.ran[sequence] == list(range(length)), "lost, repeated or reordered"
    assert all(ticket.status == "TAKEN" for ticket in tickets)
    assert len(batcher) == 0
    assert batcher.live_sequences == 0
    stats = batcher.statistics()
    assert stats["inference_count"] == total
    assert stats["execution_count"] == seen.batches
    assert stats["inference_stats"]["success"]["count"] == total
    assert stats["inference_stats"]["fail"]["count"] == 0


# -- staged: the direct strategy's placement, positions and backlog -------------------------------
class DirectModel:
    """Triton's direct placement: the lowest free slot index, then the lowest instance; a
    FIFO backlog that takes slots as they free up."""

    def __init__(self, instances: int, slots: int) -> None:
        self.instances = instances
        self.held: dict[tuple[int, int], int] = {}
        self.backlog: deque[int] = deque()
        self.slots = slots

    def start(self, sequence: int) -> None:
        for slot in range(self.slots):
            for instance in range(self.instances):
                if (instance, slot) not in self.held:
                    self.held[(instance, slot)] = sequence
                    return
        self.backlog.append(sequence)

    def end(self, place: tuple[int, int]) -> int | None:
        """Frees ``place``; returns the backlog sequence that takes it, if any."""
        del self.held[place]
        if self.backlog:
            self.held[place] = self.backlog.popleft()
            return self.held[place]
        return None


@pytest.mark.timeout(120)
@SETTINGS
@given(
    instances=st.integers(1, 3),
    max_batch_size=st.integers(0, 4),
    extra=st.integers(0, 4),
    data=st.data(),
)
def test_direct_batches_put_each_slot_at_its_position(
    instances: int, max_batch_size: int, extra: int, data: st.DataObject
) -> None:
    slots = max(max_batch_size, 1)
    batcher = SequenceBatcher("seq_model", instances, max_batch_size)
    model = DirectModel(instances, slots)
    count = data.draw(st.integers(1, instances * slots + extra), label="sequences")
    ids = data.draw(
        st.lists(correlation_ids, min_size=count, max_size=count, unique=True), label="ids"
    )
    positions = [0] * count
    expected_inferences = 0
    executions = 0

    def push(sequence: int, end: bool = False) -> None:
        nonlocal expected_inferences
        start = positions[sequence] == 0
        batcher.push((sequence, positions[sequence]), ids[sequence], start=start, end=end)
        positions[sequence] += 1
        expected_inferences += 1

    def pop_all(expected: dict[tuple[int, int], tuple[int, int]]) -> None:
        """Each instance's batch holds exactly ``expected[(instance, slot)]`` (a request)
        at position ``slot``, and nulls at the other positions below the highest one."""
        nonlocal executions
        for instance in range(instances):
            want = {slot: item for (inst, slot), item in expected.items() if inst == instance}
            batch = batcher.pop(instance, 0)
            assert batch is not None
            if not want:
                assert batch.items == []
                continue
            top = max(want)
            assert batch.slots == tuple(range(top + 1))
            assert batch.items == [want.get(slot) for slot in range(top + 1)]
            batch.report([None] * len(batch), 0, 0, 0)
            executions += 1

    # Every sequence starts; those beyond the slots wait in the backlog.
    for sequence in range(count):
        model.start(sequence)
        push(sequence)
    assert batcher.live_sequences == count
    assert len(batcher) == count
    pop_all({place: (sequence, 0) for place, sequence in model.held.items()})
    assert len(batcher) == count - len(model.held)

    for _ in range(3):
        # Some sequences with a slot send a request, some of them their last.
        held = sorted(model.held.items())
        chosen = data.draw(st.sets(st.sampled_from(held)) if held else st.just(set()))
        ending = data.draw(st.sets(st.sampled_from(sorted(chosen))) if chosen else st.just(set()))
        expected = {}
        for place, sequence in sorted(chosen):
            expected[place] = (sequence, positions[sequence])
            push(sequence, end=(place, sequence) in ending)
        pop_all(expected)
        # The ended sequences' slots went to the oldest backlog sequences, in the order the
        # instances took their batches (instance 0 first) and slot order within one.
        taken = {}
        for place, _ in sorted(ending):
            newcomer = model.end(place)
            if newcomer is not None:
                taken[place] = (newcomer, 0)
        pop_all(taken)  # their START requests, queued since the start
        for _, sequence in sorted(ending):
            with pytest.raises(InvalidArgumentError) as error:
                batcher.push("late", ids[sequence])
            assert error.value.message == start_text("seq_model", ids[sequence])
    assert batcher.live_sequences == len(model.held) + len(model.backlog)
    stats = batcher.statistics()
    assert stats["inference_count"] == expected_inferences - len(model.backlog)
    assert stats["execution_count"] == executions


@pytest.mark.timeout(30)
@settings(max_examples=40, deadline=None)
@given(
    max_batch_size=st.integers(1, 4),
    candidates=st.integers(1, 6),
    count=st.integers(1, 8),
)
def test_oldest_batches_take_the_oldest_sequences_first(
    max_batch_size: int, candidates: int, count: int
) -> None:
    batcher = SequenceBatcher(
        "seq_model",
        1,
        max_batch_size,
        strategy="oldest",
        max_candidate_sequences=candidates,
    )
    for sequence in range(count):
        batcher.push(sequence, f"s{sequence}", start=True, end=True)
    batcher.close()
    # Sequences beyond the candidates wait in the backlog, in order, and get a slot as one ends.
    got = []
    while (batch := batcher.pop(0, 1_000_000)) is not None:
        assert batch.items, "a closed batcher's pop does not time out while work is left"
        assert None not in batch.items
        assert len(batch) <= max_batch_size
        got.append(batch.items)
    flat = [sequence for batch in got for sequence in batch]
    assert flat == list(range(count))
    assert got[0] == list(range(min(count, candidates, max_batch_size)))


# -- idle sequences -------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_an_idle_sequence_frees_its_slot_and_needs_start_again() -> None:
    batcher = SequenceBatcher("idle_model", 1, 0, max_sequence_idle_us=50_000)
    batcher.push("a0", 7, start=True)
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["a0"]
    assert batcher.live_sequences == 1
    # Polled through pop: an idle sequence is released by the batcher's own clock.
    wait_for(
        lambda: not batcher.pop(0, 20_000).items and batcher.live_sequences == 0,
        "the idle sequence to be released",
        timeout=10,
    )
    with pytest.raises(InvalidArgumentError) as error:
        batcher.push("a1", 7)
    assert error.value.message == start_text("idle_model", 7)
    assert "CorrelationId" not in error.value.message
    # A new START with the same ID is a new sequence.
    batcher.push("a0 again", 7, start=True)
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["a0 again"]


@pytest.mark.timeout(30)
def test_an_idle_sequence_hands_its_slot_to_the_backlog() -> None:
    batcher = SequenceBatcher("idle_model", 1, 0, max_sequence_idle_us=50_000)
    batcher.push("a0", "seq-a", start=True)
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["a0"]
    pushed = time.monotonic()
    batcher.push("b0", "seq-b", start=True)  # one slot: b waits in the backlog
    assert batcher.live_sequences == 2
    batcher.push("b1", "seq-b", end=True)  # a backlog sequence takes requests too
    batch = batcher.pop(0, 5_000_000)  # returns once seq-a idles out and seq-b moves in
    waited = time.monotonic() - pushed
    assert batch is not None and batch.items == ["b0"]
    assert waited >= 0.04, "the slot was handed over before the sequence was idle"
    with pytest.raises(InvalidArgumentError) as error:
        batcher.push("a1", "seq-a")
    assert error.value.message == start_text("idle_model", "seq-a")
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["b1"]
    assert batcher.live_sequences == 0


@pytest.mark.timeout(30)
def test_closing_releases_a_sequence_that_never_ends_by_the_idle_rule() -> None:
    batcher = SequenceBatcher("idle_model", 2, 2, max_sequence_idle_us=50_000)
    batcher.push("a0", 1, start=True)
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["a0"]
    batcher.close()
    assert batcher.closed
    assert batcher.pop(1, 1_000_000) is None  # instance 1 holds nothing
    assert batcher.pop(0, 5_000_000) is None  # once sequence 1 idled out
    assert batcher.live_sequences == 0


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize("corrid", [0, ""])
def test_no_correlation_id_is_refused(corrid: int | str) -> None:
    batcher = SequenceBatcher("m", 1, 4)
    for start in (True, False):
        with pytest.raises(InvalidArgumentError) as error:
            batcher.push("x", corrid, start=start, end=True)
        assert error.value.message == (
            "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
        )
    assert len(batcher) == 0 and batcher.live_sequences == 0


@pytest.mark.timeout(30)
def test_a_batch_of_two_is_refused() -> None:
    batcher = SequenceBatcher("m", 1, 4)
    with pytest.raises(InvalidArgumentError) as error:
        batcher.push("x", 5, start=True, batch_size=2)
    assert error.value.message == (
        "inference request to model 'm' must specify batch-size 1 due to requirements of"
        " sequence batcher"
    )
    assert batcher.live_sequences == 0
    # The refused START did not start the sequence.
    with pytest.raises(InvalidArgumentError) as error:
        batcher.push("x", 5)
    assert error.value.message == start_text("m", 5)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("corrid", [3, 2**64 - 1, "3", "ünïcode id"])
def test_a_request_of_an_unknown_or_ended_sequence_is_refused(corrid: int | str) -> None:
    batcher = SequenceBatcher("m", 1, 1)
    for end in (False, True):  # END without START too
        with pytest.raises(InvalidArgumentError) as error:
            batcher.push("x", corrid, end=end)
        assert error.value.message == start_text("m", corrid)
    batcher.push("first", corrid, start=True)
    batcher.push("last", corrid, end=True)
    with pytest.raises(InvalidArgumentError) as error:
        batcher.push("after the end", corrid)
    assert error.value.message == start_text("m", corrid)
    # Numbers and strings are different IDs.
    other = str(corrid) if isinstance(corrid, int) else None
    if other is not None:
        batcher.push("a", corrid, start=True)
        with pytest.raises(InvalidArgumentError):
            batcher.push("b", other)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("corrid", "error"), [(-1, OverflowError), (2**64, OverflowError)])
def test_correlation_ids_out_of_range_are_refused(corrid: int, error: type[Exception]) -> None:
    with pytest.raises(error):
        SequenceBatcher("m", 1).push("x", corrid, start=True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("corrid", [1.5, None, b"bytes"])
def test_correlation_ids_of_other_types_are_refused(corrid: Any) -> None:
    with pytest.raises(TypeError):
        SequenceBatcher("m", 1).push("x", corrid, start=True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "options",
    [
        {"instances": 0},
        {"strategy": "newest"},
        {"minimum_slot_utilization": 1.5},
        {"minimum_slot_utilization": -0.1},
        {"strategy": "oldest", "max_batch_size": 2, "preferred_batch_sizes": [3]},
        {"strategy": "oldest", "max_batch_size": 2, "preferred_batch_sizes": [0]},
    ],
)
def test_bad_settings_are_refused(options: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"instances": 1, "max_batch_size": 2, **options}
    instances = arguments.pop("instances")
    max_batch_size = arguments.pop("max_batch_size")
    with pytest.raises(InvalidArgumentError):
        SequenceBatcher("m", instances, max_batch_size, **arguments)


@pytest.mark.timeout(30)
def test_pop_of_an_unknown_instance_is_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        SequenceBatcher("m", 2).pop(2, 0)


@pytest.mark.timeout(30)
def test_after_close_live_sequences_go_on_and_new_ones_are_refused() -> None:
    batcher = SequenceBatcher("m", 1, 2)
    batcher.push("a0", 10, start=True)
    batcher.push("b0", "b", start=True)
    batcher.push("c0", 30, start=True)  # in the backlog (two slots)
    batcher.close()
    with pytest.raises(UnavailableError):
        batcher.push("d0", 40, start=True)
    with pytest.raises(UnavailableError):  # a START for a live sequence too
        batcher.push("a again", 10, start=True)
    batcher.push("a1", 10, end=True)  # live sequences are still served
    batcher.push("b1", "b")
    batcher.push("c1", 30, end=True)  # a backlog sequence is live too
    with pytest.raises(InvalidArgumentError):
        batcher.push("d1", 40)
    got = []
    while (batch := batcher.pop(0, 2_000_000)) is not None:
        assert batch.items, "pop timed out with work left"
        got.append(batch.items)
        if batch.items == ["a1", "b1"]:
            batcher.push("b2", "b", end=True)
    assert got == [["a0", "b0"], ["a1", "b1"], ["c0", "b2"], ["c1"]]
    assert batcher.live_sequences == 0


@pytest.mark.timeout(30)
def test_a_new_start_of_a_live_sequence_queues_behind_it() -> None:
    # Not an error, as in Triton: the restart joins the same slot, after what waits there.
    batcher = SequenceBatcher("m", 2, 2)
    batcher.push(("s", 0), 9, start=True)
    batcher.push(("s", 1), 9)
    batcher.push(("s", "restart"), 9, start=True)
    batcher.push(("s", "end"), 9, end=True)
    assert batcher.live_sequences == 0
    got = []
    while (batch := batcher.pop(0, 0)).items:
        assert batch.slots == (0,)
        got.extend(batch.items)
    assert got == [("s", 0), ("s", 1), ("s", "restart"), ("s", "end")]
    assert not batcher.pop(1, 0).items


# -- cancellation ---------------------------------------------------------------------------------
@pytest.mark.timeout(30)
@settings(max_examples=50, deadline=None)
@given(length=st.integers(2, 8), data=st.data())
def test_cancelled_requests_are_never_handed_out(length: int, data: st.DataObject) -> None:
    batcher = SequenceBatcher("m", 1, 2)
    tickets = [batcher.push(n, "seq", start=n == 0, end=n == length - 1) for n in range(length)]
    # Keep the last request: a cancelled END ends the sequence early (tested below).
    doomed = data.draw(st.sets(st.integers(0, length - 2)))
    for n in sorted(doomed):
        assert batcher.cancel(tickets[n]) is True
        assert batcher.cancel(tickets[n]) is False
        assert tickets[n].status == "CANCELLED"
    assert len(batcher) == length - len(doomed)
    # As in Triton, the first cancelled request to reach the head cancels the rest of the
    # sequence: those behind it come back as rejected, to be answered CANCELLED.
    first = min(doomed, default=length)
    got: list[int] = []
    rejected: list[int] = []
    while True:
        batch = batcher.pop(0, 0)
        if batch.rejected:
            rejected.extend(batch.rejected)
            continue
        if not batch.items:
            break
        assert batch.items != [None]
        got.extend(batch.items)
        batch.report([None] * len(batch), 0, 0, 0)
    assert got == list(range(first))
    assert rejected == [n for n in range(first, length) if n not in doomed]
    for n, ticket in enumerate(tickets):
        assert ticket.status == ("CANCELLED" if n >= first else "TAKEN")
        assert batcher.cancel(ticket) is False
    stats = batcher.statistics()
    assert stats["failure_reasons"]["CANCELED"] == length - first
    assert stats["inference_stats"]["fail"]["count"] == length - first
    assert stats["inference_count"] == first


@pytest.mark.timeout(30)
def test_a_cancelled_end_frees_the_slot_for_the_backlog() -> None:
    batcher = SequenceBatcher("m", 1, 0)
    batcher.push("a0", 1, start=True)
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["a0"]
    end = batcher.push("a1", 1, end=True)
    batcher.push("b0", 2, start=True)  # backlog
    assert batcher.cancel(end) is True
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["b0"]
    with pytest.raises(InvalidArgumentError):
        batcher.push("a2", 1)
    assert batcher.statistics()["failure_reasons"]["CANCELED"] == 1


@pytest.mark.timeout(30)
def test_a_cancelled_start_frees_its_slot_and_leaves_a_null_entry() -> None:
    batcher = SequenceBatcher("m", 1, 4)
    batcher.push("a0", 1, start=True)
    middle = batcher.push("b0", 2, start=True)
    batcher.push("c0", 3, start=True)
    last = batcher.push("d0", 4, start=True)
    assert batcher.cancel(middle) and batcher.cancel(last)
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None
    # The cancelled sequences gave up slots 1 and 3: a null entry for slot 1, slot 3 unpadded.
    assert batch.items == ["a0", None, "c0"]
    assert batch.slots == (0, 1, 2)
    assert batcher.live_sequences == 2
    with pytest.raises(InvalidArgumentError) as error:
        batcher.push("b1", 2, end=True)
    assert error.value.message == start_text("m", 2)


@pytest.mark.timeout(30)
def test_a_cancelled_request_cancels_the_rest_of_its_sequence() -> None:
    batcher = SequenceBatcher("m", 1, 0)
    batcher.push("a0", 1, start=True)
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == ["a0"]
    doomed = batcher.push("a1", 1)
    behind = batcher.push("a2", 1)
    batcher.push("b0", 2, start=True)  # one slot: b waits in the backlog
    assert batcher.cancel(doomed)
    # The requests behind the cancelled one come back to be answered CANCELLED.
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None and batch.items == [] and batch.rejected == ("a2",)
    assert behind.status == "CANCELLED"
    batch = batcher.pop(0, 1_000_000)
    assert batch is not None
    assert batch.items == ["b0"], "the cancelled sequence kept its slot"
    with pytest.raises(InvalidArgumentError) as error:
        batcher.push("a3", 1)
    assert error.value.message == start_text("m", 1)


# -- statistics -----------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_report_counts_only_the_real_requests_of_a_batch() -> None:
    batcher = SequenceBatcher("m", 1, 4)
    for sequence in range(3):
        batcher.push((sequence, 0), sequence + 1, start=True)
    first = batcher.pop(0, 0)
    first.report([None, None, None], 0, 0, 0)
    batcher.push((2, 1), 3)
    batch = batcher.pop(0, 0)
    assert isinstance(batch, Batch)
    assert batch.items == [None, None, (2, 1)]
    assert batch.slots == (0, 1, 2)
    with pytest.raises(ValueError, match="report"):
        batch.report([None], 0, 0, 0)  # one result per position, nulls included
    # Whatever a null position's result is, it is not counted.
    batch.report([RuntimeError("null"), None, None], 10, 20, 30)
    with pytest.raises(ValueError, match="already reported"):
        batch.report([None, None, None], 0, 0, 0)
    # A failure at a real position is (not as an inference: Triton counts successes there).
    batcher.push((2, 2), 3)
    batch = batcher.pop(0, 0)
    assert batch.items == [None, None, (2, 2)]
    batch.report([None, None, RuntimeError("real")], 10, 20, 30)
    stats = batcher.statistics()
    assert stats["inference_count"] == 4
    assert stats["execution_count"] == 3
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["inference_stats"]["queue"]["count"] == 4
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["failure_reasons"]["BACKEND"] == 1
    sizes = {row["batch_size"]: row["compute_infer"]["count"] for row in stats["batch_stats"]}
    assert sizes == {3: 1, 1: 2}  # the executions' real sizes, not the padded ones
