"""Measuring one load level (a concurrency or a request rate): windows of answered requests,
repeated until the last three agree within ``--stability-percentage``, as perf_analyzer does."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tritonfast._core import LoadRun
from tritonfast.perf.inputs import Tensor
from tritonfast.perf.options import PerfOptions
from tritonfast.perf.server import ServerStats

# A record from LoadRun.take: start, sent, first byte or response, end (ns on the load's
# clock), ok, responses, the payload's index.
RECORD = np.dtype(
    [
        ("start", "<u8"),
        ("sent", "<u8"),
        ("first", "<u8"),
        ("end", "<u8"),
        ("ok", "<u8"),
        ("responses", "<u8"),
        ("payload", "<u8"),
    ]
)
PERCENTILES = (50, 90, 95, 99)
STABILITY_WINDOWS = 3
# How often the progress line is redrawn and a count window checks its count.
TICK_S = 0.25


class LoadError(RuntimeError):
    """Requests failed; the text has the server's words."""


@dataclass(frozen=True)
class Counting:
    """How a level's requests count: inferences per request, whether latency ends at the first
    response (a decoupled model's stream), and which payloads end a sequence."""

    batch_size: int = 1
    first_response: bool = False
    sequence_ends: tuple[int, ...] = ()


@dataclass
class Window:
    """The requests answered within one measurement window, and the server's view of it."""

    begin_ns: int
    end_ns: int
    records: np.ndarray
    server: ServerStats
    counting: Counting

    @property
    def seconds(self) -> float:
        return max(self.end_ns - self.begin_ns, 1) / 1e9

    @property
    def request_count(self) -> int:
        return len(self.records)

    @property
    def throughput(self) -> float:
        """Inferences per second (requests times the batch size)."""
        return self.request_count * self.counting.batch_size / self.seconds

    @property
    def response_throughput(self) -> float:
        return int(self.records["responses"].sum()) / self.seconds

    @property
    def sequence_count(self) -> int:
        ends = np.asarray(self.counting.sequence_ends, np.uint64)
        return int(np.count_nonzero(np.isin(self.records["payload"], ends)))

    @property
    def latencies_ns(self) -> np.ndarray:
        done = "first" if self.counting.first_response else "end"
        return (self.records[done] - self.records["start"]).astype(np.int64)

    def latency_ns(self, percentile: int) -> int:
        """The average latency (``percentile`` -1) or the percentile's."""
        latencies = self.latencies_ns
        if not len(latencies):
            return 0
        if percentile == -1:
            return int(latencies.mean())
        return int(np.percentile(latencies, percentile, method="lower"))


def merged(windows: list[Window]) -> Window:
    """Several windows as one: their requests and durations summed."""
    server = sum((w.server for w in windows), ServerStats())
    records = np.concatenate([w.records for w in windows])
    duration = sum(w.end_ns - w.begin_ns for w in windows)
    first = windows[0].begin_ns
    return Window(first, first + duration, records, server, windows[0].counting)


def stable(windows: list[Window], options: PerfOptions) -> bool:
    """perf_analyzer's rule: over the last three windows, max / min of the throughput (and, in
    synchronous mode, of the latency it stabilizes on) within the stability percentage."""
    if len(windows) < STABILITY_WINDOWS:
        return False
    recent = windows[-STABILITY_WINDOWS:]
    limit = 1 + options.stability / 100

    def within(values: list[float]) -> bool:
        return min(values) > 0 and max(values) / min(values) <= limit

    if not within([w.throughput for w in recent]):
        return False
    return options.async_mode or within([float(w.latency_ns(options.percentile)) for w in recent])


@dataclass
class Level:
    """What one level came to."""

    mode: str  # "concurrency" or "request_rate"
    value: float
    summary: Window
    stable: bool
    windows: list[Window] = field(default_factory=list)
    wall_offset_ns: int = 0  # add to the load's clock for nanoseconds since the Unix epoch
    # Each payload's inputs (by the payload's index), for the profile export.
    inputs: list[list[Tensor]] = field(default_factory=list)


def measure_level(
    options: PerfOptions,
    start_load: Callable[[], LoadRun],
    statistics: Callable[[], ServerStats],
    mode: str,
    value: float,
    counting: Counting,
) -> Level:
    run = start_load()
    wall_offset = time.time_ns() - run.now()
    try:
        if options.warmup_request_count:
            _wait_for(run, options.warmup_request_count, lambda: None)
        answers = _Answers(run)
        begin = run.now()  # nothing answered before the first window counts
        windows: list[Window] = []
        before = statistics()
        for trial in range(options.max_trials):
            progress = _Progress(mode, value, trial + 1, run, begin, counting.batch_size)
            if options.request_count:
                _wait_for(run, options.request_count, progress.show)
            elif options.count_windows:
                _wait_count_window(run, options.window_requests, progress.show)
            else:
                _wait_time_window(options.measurement_ms / 1000, progress.show)
            end = run.now()
            records = answers.within(begin, end)
            progress.clear()
            after = statistics()
            window = Window(begin, end, records, after - before, counting)
            before, begin = after, end
            failed = int(np.count_nonzero(records["ok"] == 0))
            if failed:
                texts = "; ".join(run.errors()) or "no answer"
                raise LoadError(f"{failed} of {len(records)} requests failed: {texts}")
            windows.append(window)
            if options.verbose:
                _print_pass(trial + 1, window, options)
            if options.request_count:
                return Level(mode, value, window, True, windows, wall_offset)
            if stable(windows, options):
                return Level(
                    mode, value, merged(windows[-STABILITY_WINDOWS:]), True, windows, wall_offset
                )
        return Level(mode, value, merged(windows[-STABILITY_WINDOWS:]), False, windows, wall_offset)
    finally:
        run.stop()


class _Answers:
    """The load's records sorted into windows by the time each was answered: one answered
    after a window's end waits for the next window, one answered before its start (a record
    handed over just after the previous window closed) is left out, as perf_analyzer does."""

    def __init__(self, run: LoadRun) -> None:
        self.run = run
        self.pending = np.empty(0, RECORD)

    def within(self, begin: int, end: int) -> np.ndarray:
        fresh = np.frombuffer(self.run.take(), RECORD)
        records = np.concatenate([self.pending, fresh]) if len(self.pending) else fresh
        self.pending = records[records["end"] >= end]
        return records[(records["end"] >= begin) & (records["end"] < end)]


def _print_pass(number: int, window: Window, options: PerfOptions) -> None:
    text = f"  Pass [{number}] throughput: {window.throughput:g} infer/sec. "
    if options.percentile == -1:
        std_us = int(window.latencies_ns.std() // 1000) if window.request_count else 0
        text += f"Avg latency: {window.latency_ns(-1) // 1000} usec (std {std_us} usec). "
    else:
        text += (
            f"p{options.percentile} latency: {window.latency_ns(options.percentile) // 1000} usec"
        )
    print(text, flush=True)


def _wait_time_window(seconds: float, tick: Callable[[], None]) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(TICK_S, left))
        tick()


def _answered(run: LoadRun) -> int:
    succeeded, failed = run.counts()
    return succeeded + failed


def _wait_for(run: LoadRun, count: int, tick: Callable[[], None]) -> None:
    target = _answered(run) + count
    while _answered(run) < target:
        time.sleep(min(TICK_S, 0.01))
        tick()


def _wait_count_window(run: LoadRun, count: int, tick: Callable[[], None]) -> None:
    """At least ``count`` requests and at least a second."""
    target, deadline = _answered(run) + count, time.monotonic() + 1.0
    while _answered(run) < target or time.monotonic() < deadline:
        time.sleep(0.01)
        tick()


class _Progress:
    """A line on the terminal, redrawn while a window runs (only when stderr is a terminal)."""

    def __init__(
        self, mode: str, value: float, trial: int, run: LoadRun, begin_ns: int, batch: int
    ) -> None:
        self.live = sys.stderr.isatty()
        self.label = (
            f"{'concurrency' if mode == 'concurrency' else 'request rate'} {value:g}, trial {trial}"
        )
        self.run, self.begin_ns, self.batch = run, begin_ns, batch
        self.first = _answered(run)
        self.last_draw = 0.0

    def show(self) -> None:
        now = time.monotonic()
        if not self.live or now - self.last_draw < TICK_S:
            return
        self.last_draw = now
        done = _answered(self.run) - self.first
        seconds = max(self.run.now() - self.begin_ns, 1) / 1e9
        sys.stderr.write(
            f"\r  [{self.label}] {done} requests, {done * self.batch / seconds:,.0f} infer/sec "
        )
        sys.stderr.flush()

    def clear(self) -> None:
        if self.live and self.last_draw:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
