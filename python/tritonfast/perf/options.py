"""perf_analyzer's command line, for what ``tritonfast perf`` covers.

Flags, defaults and meanings follow perf_analyzer's ``docs/cli.md``; a flag of perf_analyzer's
that this tool does not implement is refused by name rather than ignored.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class OptionError(ValueError):
    """A flag's value is not usable; the text says which and why."""


@dataclass(frozen=True)
class Range:
    """``start:end:step`` of ``--concurrency-range`` / ``--request-rate-range``."""

    start: float
    end: float
    step: float

    @property
    def open_ended(self) -> bool:
        """An end of 0: the levels go on until the latency limit (``-l``) is reached."""
        return self.end == 0

    def levels(self) -> Iterator[float]:
        if self.end < self.start and not self.open_ended:
            raise OptionError(f"the range's end {self.end:g} is below its start {self.start:g}")
        level = self.start
        while self.open_ended or level <= self.end + 1e-9:
            yield level
            level += self.step


def parse_range(text: str, integer: bool) -> Range:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise OptionError(f"{text!r} is not 'start', 'start:end' or 'start:end:step'")
    try:
        numbers = [int(p) if integer else float(p) for p in parts]
    except ValueError:
        kind = "whole numbers" if integer else "numbers"
        raise OptionError(f"{text!r}: the range takes {kind}") from None
    start = numbers[0]
    end = numbers[1] if len(numbers) > 1 else start
    step = numbers[2] if len(numbers) > 2 else 1
    if start <= 0 or step <= 0:
        raise OptionError(f"{text!r}: start and step must be above 0")
    return Range(start, end, step)


def parse_shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise OptionError(f"--shape {text!r}: expected 'name:dim,dim,...'")
    try:
        shape = [int(d) for d in dims.split(",")] if dims else []
    except ValueError:
        raise OptionError(f"--shape {text!r}: dimensions must be whole numbers") from None
    if any(d < 0 for d in shape):
        raise OptionError(f"--shape {text!r}: dimensions must not be negative")
    return name, shape


@dataclass(frozen=True)
class PerfOptions:
    model: str
    version: str
    url: str
    protocol: str
    batch_size: int
    concurrency: Range | None
    request_rate: Range | None
    poisson: bool
    measurement_ms: int
    count_windows: bool
    window_requests: int
    stability: float
    max_trials: int
    percentile: int
    latency_threshold_ms: int
    request_count: int
    warmup_request_count: int
    shapes: dict[str, list[int]]
    input_data: str
    string_length: int
    string_data: str | None
    async_mode: bool
    request_parameters: dict[str, bool | int | str]
    shared_memory: str
    output_shared_memory_size: int
    streaming: bool
    sequence_length: int | None
    sequence_variation: float
    sequence_ids: tuple[int, int | None]
    num_of_sequences: int
    serial_sequences: bool
    binary_search: bool
    max_threads: int
    csv_file: Path | None
    profile_export_file: Path | None
    verbose: int

    @property
    def rate_mode(self) -> bool:
        return self.request_rate is not None


# perf_analyzer flags this tool does not implement; each is refused with its name.
UNSUPPORTED = (
    "--periodic-concurrency-range",
    "--request-intervals",
    "--fixed-schedule",
    "--service-kind",
    "--collect-metrics",
    "--bls-composing-models",
)


class _Unsupported(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        parser.error(f"{option_string} is not supported by tritonfast perf yet")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tritonfast perf",
        description="Measure a KServe v2 server's throughput and latency under load;"
        " flags and report follow perf_analyzer's.",
    )
    add = parser.add_argument
    add("-m", dest="model", required=True, help="the model to load")
    add("-x", dest="version", default="", help="the model's version (default: the server's choice)")
    add(
        "-u",
        dest="url",
        default=None,
        help="host:port (default localhost:8000 for HTTP, :8001 for gRPC)",
    )
    add("-i", dest="protocol", default="http", type=str.lower, choices=("http", "grpc"))
    add("-b", dest="batch_size", type=int, default=1, help="batch size of each request")
    add("--concurrency-range", default=None, metavar="START:END:STEP")
    add("--request-rate-range", default=None, metavar="START:END:STEP")
    add("--request-distribution", default="constant", choices=("constant", "poisson"))
    add(
        "-p",
        "--measurement-interval",
        dest="measurement_ms",
        type=int,
        default=5000,
        metavar="MS",
        help="measurement window in milliseconds",
    )
    add("--measurement-mode", default="time_windows", choices=("time_windows", "count_windows"))
    add("--measurement-request-count", type=int, default=50)
    add("-s", "--stability-percentage", dest="stability", type=float, default=10.0)
    add("-r", "--max-trials", type=int, default=10)
    add("--percentile", type=int, default=-1)
    add("--binary-search", action="store_true", help="halve the range around -l's limit")
    add("-l", "--latency-threshold", type=int, default=0, metavar="MS")
    add("--request-count", type=int, default=0)
    add("--warmup-request-count", type=int, default=0)
    add("--shape", action="append", default=[], metavar="NAME:DIMS")
    add("--input-data", default="random", metavar="zero|random|FILE")
    add("--string-length", type=int, default=128)
    add("--string-data", default=None)
    add(
        "--request-parameter",
        action="append",
        default=[],
        metavar="NAME:VALUE:TYPE",
        help="a parameter every request carries; TYPE bool, int or string (repeatable)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-a", "--async", dest="async_mode", action="store_true")
    mode.add_argument("--sync", dest="async_mode", action="store_false")
    add("--shared-memory", default="none", choices=("none", "system", "cuda"))
    add("--output-shared-memory-size", type=int, default=102400, metavar="BYTES")
    add("--streaming", action="store_true", help="gRPC streams (ModelStreamInfer)")
    add("--sequence-length", type=int, default=None, help="requests per sequence (default 20)")
    add("--sequence-length-variation", type=float, default=20.0, metavar="PERCENT")
    add("--sequence-id-range", default="1", metavar="START[:END]")
    add("--num-of-sequences", type=int, default=4, help="concurrent sequences at a request rate")
    add("--serial-sequences", action="store_true", help="one request of a sequence at a time")
    add(
        "--max-threads",
        type=int,
        default=None,
        help="load threads (default: 1, or up to 4 for request rates)",
    )
    add("-f", dest="csv_file", type=Path, default=None, help="write the results as CSV")
    add(
        "--profile-export-file",
        type=Path,
        default=None,
        help="write every request's timestamps as JSON",
    )
    add("-v", dest="verbose", action="count", default=0)
    for flag in UNSUPPORTED:
        add(flag, action=_Unsupported, nargs="?", help=argparse.SUPPRESS)
    return parser


def parse(argv: list[str]) -> PerfOptions:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _options(args)
    except OptionError as e:
        parser.error(str(e))
        raise  # parser.error exits; this keeps type checkers content


def _options(args: argparse.Namespace) -> PerfOptions:
    if args.concurrency_range and args.request_rate_range:
        raise OptionError("--concurrency-range and --request-rate-range exclude each other")
    concurrency = None
    rate = None
    if args.request_rate_range:
        rate = parse_range(args.request_rate_range, integer=False)
    else:
        concurrency = parse_range(args.concurrency_range or "1", integer=True)
    if args.batch_size < 1:
        raise OptionError("-b: the batch size must be at least 1")
    if args.measurement_ms < 1:
        raise OptionError("--measurement-interval must be at least 1 ms")
    if not 0 <= args.percentile <= 99 and args.percentile != -1:
        raise OptionError("--percentile takes a value from 1 to 99")
    if args.string_length < 0:
        raise OptionError("--string-length must not be negative")
    shapes = dict(parse_shape(text) for text in args.shape)
    for searched in (concurrency, rate):
        if searched is not None and searched.open_ended and not args.latency_threshold:
            raise OptionError("an open-ended range (end 0) needs --latency-threshold")
    if args.binary_search:
        searched = concurrency or rate
        if not args.latency_threshold or searched is None or searched.open_ended:
            raise OptionError("--binary-search needs a range with an end and --latency-threshold")
    if args.streaming and args.protocol != "grpc":
        raise OptionError("--streaming needs -i grpc")
    if args.streaming and rate:
        raise OptionError("--streaming is measured with --concurrency-range, not a request rate")
    if args.output_shared_memory_size < 1:
        raise OptionError("--output-shared-memory-size must be at least 1")
    if args.num_of_sequences < 1:
        raise OptionError("--num-of-sequences must be at least 1")
    if args.sequence_length is not None and args.sequence_length < 1:
        raise OptionError("--sequence-length must be at least 1")
    sequence_ids = _id_range(args.sequence_id_range)
    default_port = "8001" if args.protocol == "grpc" else "8000"
    threads = args.max_threads if args.max_threads is not None else (4 if rate else 1)
    if threads < 1:
        raise OptionError("--max-threads must be at least 1")
    return PerfOptions(
        model=args.model,
        version=args.version,
        url=args.url or f"localhost:{default_port}",
        protocol=args.protocol,
        batch_size=args.batch_size,
        concurrency=concurrency,
        request_rate=rate,
        poisson=args.request_distribution == "poisson",
        measurement_ms=args.measurement_ms,
        count_windows=args.measurement_mode == "count_windows",
        window_requests=args.measurement_request_count,
        stability=args.stability,
        max_trials=max(1, args.max_trials),
        percentile=args.percentile,
        latency_threshold_ms=args.latency_threshold,
        request_count=args.request_count,
        warmup_request_count=args.warmup_request_count,
        shapes=shapes,
        input_data=args.input_data,
        string_length=args.string_length,
        string_data=args.string_data,
        async_mode=args.async_mode,
        request_parameters=dict(parse_parameter(text) for text in args.request_parameter),
        shared_memory=args.shared_memory,
        output_shared_memory_size=args.output_shared_memory_size,
        streaming=args.streaming,
        sequence_length=args.sequence_length,
        sequence_variation=max(args.sequence_length_variation, 0.0),
        sequence_ids=sequence_ids,
        num_of_sequences=args.num_of_sequences,
        serial_sequences=args.serial_sequences,
        binary_search=args.binary_search,
        max_threads=threads,
        csv_file=args.csv_file,
        profile_export_file=args.profile_export_file,
        verbose=args.verbose,
    )


def parse_parameter(text: str) -> tuple[str, bool | int | str]:
    """``--request-parameter NAME:VALUE:TYPE``."""
    name, _, rest = text.partition(":")
    value, _, kind = rest.rpartition(":")
    if not name or not _ or kind not in ("bool", "int", "string"):
        raise OptionError(
            f"--request-parameter {text!r}: expected NAME:VALUE:TYPE, TYPE bool, int or string"
        )
    if kind == "string":
        return name, value
    if kind == "bool":
        if value.lower() not in ("true", "false"):
            raise OptionError(f"--request-parameter {text!r}: a bool is true or false")
        return name, value.lower() == "true"
    try:
        return name, int(value)
    except ValueError:
        raise OptionError(
            f"--request-parameter {text!r}: {value!r} is not a whole number"
        ) from None


def _id_range(text: str) -> tuple[int, int | None]:
    start, _, end = text.partition(":")
    try:
        first, last = int(start), (int(end) if end else None)
    except ValueError:
        raise OptionError(f"--sequence-id-range {text!r}: expected START or START:END") from None
    if first < 1 or (last is not None and last <= first):
        raise OptionError(f"--sequence-id-range {text!r}: IDs start at 1 and END is above START")
    return first, last
