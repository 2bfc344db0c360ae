"""``RequestQueue(share_statistics_with=...)``: one queue per model instance, one set of
statistics per model version."""

from __future__ import annotations

import pytest
from tritonfast._core import QueuePolicy, RequestQueue
from tritonfast.errors import InvalidArgumentError, UnavailableError

LONG_US = 10_000_000


def run(queue: RequestQueue, results: list[object] | None = None) -> list[object]:
    """Pops one batch of ``queue`` and reports it (every request succeeds unless ``results``
    says otherwise); returns its items."""
    batch = queue.pop(LONG_US)
    assert batch is not None and batch.items, "expected a batch"
    items = batch.items
    batch.report(results if results is not None else [None] * len(items), 1_000, 10_000, 2_000)
    return items


@pytest.mark.timeout(30)
def test_two_queues_record_into_one_set_of_statistics() -> None:
    limit = QueuePolicy(max_queue_size=2)
    first = RequestQueue(4, 0, default_queue_policy=limit, latency_summaries=True)
    second = RequestQueue(
        4,
        0,
        default_queue_policy=limit,
        latency_summaries=True,
        share_statistics_with=first,
    )

    # Items, lengths and size limits stay each queue's own.
    first.push("a", 2)
    second.push("b", 3)
    second.push("c", 1, shape_key=1)
    assert (len(first), len(second)) == (1, 2)
    with pytest.raises(UnavailableError):
        second.push("full")
    first.push("d")  # the first queue's limit is its own
    assert run(first) == ["a", "d"]
    assert run(second) == ["b"]
    assert run(second, [ValueError("boom")]) == ["c"]
    ticket = first.push_cancellable("e")
    assert first.cancel(ticket)
    assert (len(first), len(second)) == (0, 0)

    stats = first.statistics()
    assert second.statistics() == stats
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == 3  # a, d and b
    assert stats["inference_count"] == 2 + 1 + 3
    assert stats["execution_count"] == 3
    assert inference["compute_infer"] == {"count": 3, "ns": 30_000}
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [
        (1, 1),
        (3, 2),
    ]
    assert inference["fail"]["count"] == 3  # full, c (backend) and e (cancelled)
    assert stats["failure_reasons"] == {
        "REJECTED": 1,
        "CANCELED": 1,
        "BACKEND": 1,
        "OTHER": 0,
    }

    summaries = second.latency_summaries([0.5])
    assert summaries is not None
    assert first.latency_summaries([0.5]) is not None
    count, _sum_us, quantiles = summaries["request"]
    assert count == 3
    assert [q for q, _ in quantiles] == [0.5]


@pytest.mark.timeout(30)
def test_a_queue_of_its_own_keeps_its_own_statistics() -> None:
    shared = RequestQueue()
    alone = RequestQueue()
    sharing = RequestQueue(share_statistics_with=shared)
    for queue in (shared, alone, sharing):
        queue.push(object())
        run(queue)
    assert shared.statistics()["execution_count"] == 2
    assert sharing.statistics()["execution_count"] == 2
    assert alone.statistics()["execution_count"] == 1


@pytest.mark.timeout(30)
def test_closing_one_queue_leaves_the_other_open() -> None:
    first = RequestQueue()
    second = RequestQueue(share_statistics_with=first)
    first.close()
    assert first.closed and not second.closed
    second.push("x")
    assert run(second) == ["x"]
    assert first.pop(0) is None
    assert first.statistics()["execution_count"] == 1


@pytest.mark.timeout(30)
def test_latency_summaries_must_match_the_shared_statistics() -> None:
    with_summaries = RequestQueue(latency_summaries=True)
    with pytest.raises(InvalidArgumentError, match="latency_summaries"):
        RequestQueue(share_statistics_with=with_summaries)
    with pytest.raises(InvalidArgumentError, match="latency_summaries"):
        RequestQueue(latency_summaries=True, share_statistics_with=RequestQueue())


@pytest.mark.timeout(30)
def test_only_a_request_queue_can_be_shared() -> None:
    with pytest.raises(TypeError):
        RequestQueue(share_statistics_with=object())  # type: ignore[arg-type]
