"""Microbenchmark of ``tritonfast._core.RequestQueue`` through its Python API.

Prints figures and judges nothing:

* round trip: ``push`` + ``pop(0)`` on one thread, ns per item (unbatched, and batches of 8),
  and the same with ``push_cancellable`` (what the scheduler uses) plus a batch ``report``;
* cross-thread latency: a consumer thread blocked in ``pop``; the time from ``push`` on the
  main thread until the consumer holds the item, p50/p99 in µs. "parked" leaves the consumer time
  to park before each push; "back-to-back" pushes as soon as the previous item was acknowledged.

Usage: ``python bench/micro/queue_bench.py [--quick]`` (``--quick`` finishes in a few seconds).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from tritonfast._core import RequestQueue

LONG_US = 10_000_000


def round_trip_ns(items: int, batch: int) -> float:
    """Nanoseconds per item for push + pop on one thread, ``batch`` items per pop."""
    q = RequestQueue(max_batch_size=batch if batch > 1 else 0)
    payload = object()
    push, pop = q.push, q.pop
    rounds = items // batch
    start = time.perf_counter_ns()
    for _ in range(rounds):
        for _ in range(batch):
            push(payload)
        pop(0)
    return (time.perf_counter_ns() - start) / (rounds * batch)


def scheduler_round_trip_ns(items: int, batch: int) -> float:
    """Like :func:`round_trip_ns` with the scheduler's calls: ``push_cancellable`` per item,
    then ``pop`` and one ``report`` per batch."""
    q = RequestQueue(max_batch_size=batch if batch > 1 else 0)
    payload = object()
    push, pop = q.push_cancellable, q.pop
    results = [None] * batch
    rounds = items // batch
    start = time.perf_counter_ns()
    for _ in range(rounds):
        for _ in range(batch):
            push(payload)
        popped = pop(0)
        assert popped is not None
        popped.report(results, 0, 0, 0)
    return (time.perf_counter_ns() - start) / (rounds * batch)


def cross_thread_latency_us(samples: int, gap_s: float) -> list[float]:
    """Push-to-consumer latencies in µs, one per sample.

    The consumer sends each latency back on a second queue, so the main thread waits with the GIL
    released (a Python-level spin would hold the GIL the consumer needs to return).
    """
    work, acks = RequestQueue(), RequestQueue()

    def consume() -> None:
        while (batch := work.pop(LONG_US)) is not None:
            if batch.items:
                acks.push((time.perf_counter_ns() - batch.items[0]) / 1000)

    consumer = threading.Thread(target=consume, name="queue-bench-consumer")
    consumer.start()
    latencies = []
    try:
        for _ in range(samples):
            if gap_s:
                time.sleep(gap_s)
            work.push(time.perf_counter_ns())
            ack = acks.pop(LONG_US)
            if ack is None or not ack.items:
                raise RuntimeError("the consumer did not answer within 10 s")
            latencies.append(ack.items[0])
    finally:
        work.close()
        consumer.join()
    return latencies


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sample counts (a few seconds)")
    args = parser.parse_args()
    items = 200_000 if args.quick else 2_000_000
    samples = 2_000 if args.quick else 20_000

    print(f"round trip, unbatched   : {round_trip_ns(items, 1):8.0f} ns/item")
    print(f"round trip, batches of 8: {round_trip_ns(items, 8):8.0f} ns/item")
    print(f"scheduler calls, unbatched   : {scheduler_round_trip_ns(items, 1):8.0f} ns/item")
    print(f"scheduler calls, batches of 8: {scheduler_round_trip_ns(items, 8):8.0f} ns/item")
    for name, gap in (("parked", 0.0002), ("back-to-back", 0.0)):
        lat = cross_thread_latency_us(samples, gap)
        print(
            f"push -> blocked consumer ({name:12}): p50 {percentile(lat, 50):7.1f} µs  "
            f"p99 {percentile(lat, 99):7.1f} µs  mean {statistics.fmean(lat):7.1f} µs  "
            f"(n={len(lat)})"
        )


if __name__ == "__main__":
    main()
