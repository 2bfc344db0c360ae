"""``tritonfast perf``: read the model, prepare its requests, measure each level, report."""

from __future__ import annotations

import functools
import sys

from tritonfast._core import LoadRun
from tritonfast.perf import inputs, report
from tritonfast.perf.measure import Counting, Level, LoadError, measure_level
from tritonfast.perf.options import PerfOptions, parse
from tritonfast.perf.plan import Plan, plan
from tritonfast.perf.server import (
    GrpcControl,
    HttpControl,
    ModelInfo,
    ServerError,
    ServerStats,
    control_for,
)
from tritonfast.perf.sharedmemory import Regions

# gRPC: a thread's requests spread over HTTP/2 connections of at most this many streams each.
STREAMS_PER_CONNECTION = 4


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    address = options.url.removeprefix("http://").removeprefix("grpc://")
    control = control_for(options.protocol, address)
    regions = None
    try:
        try:
            model = control.model_info(options.model, options.version)
            streams = inputs.streams(
                model,
                options.batch_size,
                options.shapes,
                options.input_data,
                options.string_length,
                options.string_data,
            )
            if options.shared_memory != "none":
                size = options.output_shared_memory_size
                regions = Regions(control, options.shared_memory, size)
            first = _Search(options).next()
            assert first is not None  # a range has a start
            # What the model or the flags rule out is said before anything is measured.
            plan(options, model, address, streams, _contexts(*first), regions)
        except (ServerError, inputs.InputError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(report.settings(options, model.decoupled), flush=True)
        levels, status = _measure(options, control, address, model, streams, regions)
    finally:
        if regions is not None:
            regions.close()
        control.close()
    if levels:
        print(report.summary(levels, options), flush=True)
        if options.csv_file:
            report.write_csv(options.csv_file, levels, options)
        if options.profile_export_file:
            report.write_profile_export(options.profile_export_file, levels, options)
    return status


def _measure(
    options: PerfOptions,
    control: HttpControl | GrpcControl,
    address: str,
    model: ModelInfo,
    streams: list[list[list[inputs.Tensor]]],
    regions: Regions | None,
) -> tuple[list[Level], int]:
    """Each level in turn until the range ends, the latency limit is passed or a level fails;
    returns the levels measured and the exit status."""

    def start_load(made: Plan, mode: str, value: float) -> LoadRun:
        return LoadRun(
            made.protocol,
            address,
            made.payloads,
            path=made.path,
            # (A request rate's sequences are shared out between the threads.)
            threads=min(options.max_threads, len(made.scripts) or options.max_threads),
            connections_per_thread=_connections(options, mode, value),
            concurrency=int(value) if mode == "concurrency" else None,
            rate=value if mode == "request_rate" else None,
            poisson=options.poisson,
            scripts=made.scripts,
            decoupled=made.decoupled,
            serial=options.serial_sequences,
        )

    def statistics() -> ServerStats:
        return control.statistics(options.model, options.version)

    levels: list[Level] = []
    try:
        search = _Search(options)
        while (next_level := search.next()) is not None:
            mode, value = next_level
            print(report.level_heading(mode, value), flush=True)
            made = plan(options, model, address, streams, _contexts(mode, value), regions)
            level = measure_level(
                options,
                functools.partial(start_load, made, mode, value),
                statistics,
                mode,
                value,
                Counting(options.batch_size, made.decoupled, made.sequence_ends),
            )
            level.inputs = list(made.inputs)
            levels.append(level)
            if not level.stable:
                kind = "concurrency" if mode == "concurrency" else "request rate"
                print(
                    f"Failed to obtain stable measurement within {options.max_trials} measurement"
                    f" windows for {kind} {value:g}. Please try to increase the"
                    " --measurement-interval.",
                    file=sys.stderr,
                )
            print(report.level_report(level, options), flush=True)
            if not level.stable:
                return levels, 1
            latency_ms = level.summary.latency_ns(options.percentile) / 1e6
            over = bool(options.latency_threshold_ms) and latency_ms >= options.latency_threshold_ms
            if over and not options.binary_search:
                print(
                    "Measured latency went over the set limit of"
                    f" {options.latency_threshold_ms} msec. ",
                    file=sys.stderr,
                )
            search.tell(over)
    except (LoadError, ServerError, ConnectionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return levels, 1
    return levels, 0


class _Search:
    """The levels to measure: the range in order until a level's latency is over the limit,
    or (``--binary-search``) halving the range around the limit until it is one step wide."""

    def __init__(self, options: PerfOptions) -> None:
        searched = options.request_rate or options.concurrency
        assert searched is not None
        self.mode = "request_rate" if options.request_rate else "concurrency"
        self.integer = self.mode == "concurrency"
        self.binary = options.binary_search
        self.levels = searched.levels()
        self.low, self.high, self.step = searched.start, searched.end, searched.step
        self.asked: float | None = None
        self.asked_count = 0
        self.done = False

    def next(self) -> tuple[str, float] | None:
        if self.done:
            return None
        self.asked_count += 1
        if not self.binary:
            self.asked = next(self.levels, None)
        elif self.asked_count == 1:
            self.asked = self.low  # the start first, then the end, then between them
        elif self.asked_count == 2 and self.high != self.low:
            self.asked = self.high
        elif self.high - self.low > self.step:
            middle = (self.low + self.high) / 2
            self.asked = float(round(middle)) if self.integer else middle
            if self.asked in (self.low, self.high):
                return None
        else:
            return None
        return None if self.asked is None else (self.mode, self.asked)

    def tell(self, over: bool) -> None:
        """Whether the level just measured was over the latency limit."""
        if not self.binary:
            self.done = over
            return
        assert self.asked is not None
        if self.asked_count == 1 and over:
            self.done = True  # even the start is over the limit
        elif self.asked_count == 2 and not over:
            self.done = True  # even the end is within it
        elif self.asked_count > 2:
            if over:
                self.high = self.asked
            else:
                self.low = self.asked


def _connections(options: PerfOptions, mode: str, value: float) -> int:
    if options.protocol != "grpc" or mode != "concurrency":
        return 1
    per_thread = -(-int(value) // options.max_threads)
    return max(1, -(-per_thread // STREAMS_PER_CONNECTION))


def _contexts(mode: str, value: float) -> int:
    """Clients with a request in flight: the concurrency (one for a request rate's plan)."""
    return int(value) if mode == "concurrency" else 1
