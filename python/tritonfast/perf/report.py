"""The report in perf_analyzer's words: the settings, each level's client and server figures,
the closing summary, the CSV file (``-f``) and the profile export (``--profile-export-file``)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from tritonfast import __version__
from tritonfast.perf.inputs import Tensor
from tritonfast.perf.measure import PERCENTILES, Level, Window
from tritonfast.perf.options import PerfOptions


def settings(options: PerfOptions, decoupled: bool) -> str:
    lines = [
        "*** Measurement Settings ***",
        f"  Batch size: {options.batch_size}",
        "  Service Kind: TRITON",
    ]
    if options.warmup_request_count:
        plural = "s" if options.warmup_request_count > 1 else ""
        lines.append(f"  Sending {options.warmup_request_count} warmup request{plural}")
    if options.request_count:
        plural = "s" if options.request_count > 1 else ""
        lines.append(f"  Sending {options.request_count} benchmark request{plural}")
    else:
        mode = "count_windows" if options.count_windows else "time_windows"
        lines.append(f'  Using "{mode}" mode for stabilization')
        metric = "throughput" if options.async_mode else "latency and throughput"
        on = "average" if options.percentile == -1 else f"p{options.percentile}"
        lines.append(f"  Stabilizing using {on} {metric}")
        if options.count_windows:
            lines.append(f"  Minimum number of samples in each window: {options.window_requests}")
        else:
            lines.append(f"  Measurement window: {options.measurement_ms} msec")
    if options.concurrency and options.concurrency.end != 1:
        lines.append(f"  Latency limit: {options.latency_threshold_ms} msec")
        limit = int(max(options.concurrency.start, options.concurrency.end))
        lines.append(f"  Concurrency limit: {limit} concurrent requests")
    if options.request_rate:
        if options.request_rate.end != 1.0:
            lines.append(f"  Latency limit: {options.latency_threshold_ms} msec")
            top = max(options.request_rate.start, options.request_rate.end)
            lines.append(f"  Request Rate limit: {top:g} requests per seconds")
        kind = "poisson" if options.poisson else "uniform"
        lines.append(f"  Using {kind} distribution on request generation")
    lines.append(
        f"  Using {'asynchronous' if options.async_mode else 'synchronous'} calls for inference"
    )
    if decoupled:
        lines.append("  Detected decoupled model, using the first response for measuring latency")
    return "\n".join(lines) + "\n"


def level_heading(mode: str, value: float) -> str:
    if mode == "concurrency":
        return f"Request concurrency: {int(value)}"
    return f"Request Rate: {value:g} inference requests per second"


def percentiles_of(options: PerfOptions) -> list[int]:
    wanted = set(PERCENTILES)
    if options.percentile != -1:
        wanted.add(options.percentile)
    return sorted(wanted)


def client_times_us(window: Window) -> tuple[int, int, int, int]:
    """Averages of the request's whole time, its sending, its receiving, and the wait between."""
    records = window.records
    if not len(records):
        return 0, 0, 0, 0
    total = int((records["end"] - records["start"]).mean()) // 1000
    send = int((records["sent"] - records["start"]).mean()) // 1000
    receive = int((records["end"] - records["first"]).mean()) // 1000
    return total, send, receive, max(total - send - receive, 0)


def level_report(level: Level, options: PerfOptions) -> str:
    window = level.summary
    lines = ["  Client: ", f"    Request count: {window.request_count}"]
    if window.counting.sequence_ends:
        count = window.sequence_count
        lines.append(f"    Sequence count: {count} ({count / window.seconds:g} seq/sec)")
    lines.append(f"    Throughput: {window.throughput:g} infer/sec")
    if window.counting.first_response:
        lines.append(f"    Response Throughput: {window.response_throughput:g} infer/sec")
    latencies = window.latencies_ns
    if options.percentile == -1:
        std_us = int(latencies.std() // 1000) if len(latencies) else 0
        average = window.latency_ns(-1) // 1000
        lines.append(f"    Avg latency: {average} usec (standard deviation {std_us} usec)")
    for p in percentiles_of(options):
        lines.append(f"    p{p} latency: {window.latency_ns(p) // 1000} usec")
    total, send, receive, wait = client_times_us(window)
    if options.protocol == "grpc":
        if options.verbose:
            split = f"marshal {send} usec + response wait {wait} usec + unmarshal {receive} usec"
        else:
            split = (
                f"(un)marshal request/response {send + receive} usec + response wait {wait} usec"
            )
        lines.append(f"    Avg gRPC time: {total} usec ({split})")
    else:
        if options.verbose:
            split = f"send {send} usec + response wait {wait} usec + receive {receive} usec"
        else:
            split = f"send/recv {send + receive} usec + response wait {wait} usec"
        lines.append(f"    Avg HTTP time: {total} usec ({split})")
    server = window.server
    lines += [
        "  Server: ",
        f"    Inference count: {server.inference_count}",
        f"    Execution count: {server.execution_count}",
    ]
    if server.cache_hit_count or server.cache_miss_count:
        lines.append(f"    Cache hit count: {server.cache_hit_count}")
        lines.append(f"    Cache miss count: {server.cache_miss_count}")
    average = server.average_us("success")
    parts = {
        name: server.average_us(name)
        for name in ("queue", "compute_input", "compute_infer", "compute_output")
    }
    overhead = max(average - sum(parts.values()), 0)
    lines.append(f"    Successful request count: {server.success_count}")
    lines.append(
        f"    Avg request latency: {average} usec (overhead {overhead} usec"
        f" + queue {parts['queue']} usec + compute input {parts['compute_input']} usec"
        f" + compute infer {parts['compute_infer']} usec"
        f" + compute output {parts['compute_output']} usec)"
    )
    return "\n".join(lines) + "\n"


def summary(levels: list[Level], options: PerfOptions) -> str:
    on = "Average" if options.percentile == -1 else f"p{options.percentile}"
    lines = [f"Inferences/Second vs. Client {on} Batch Latency"]
    for level in levels:
        label = (
            f"Concurrency: {int(level.value)}"
            if level.mode == "concurrency"
            else f"Request Rate: {level.value:g}"
        )
        latency = level.summary.latency_ns(options.percentile) // 1000
        lines.append(
            f"{label}, throughput: {level.summary.throughput:g} infer/sec, latency {latency} usec"
        )
    return "\n".join(lines) + "\n"


def write_csv(path: Path, levels: list[Level], options: PerfOptions) -> None:
    """perf_analyzer's columns (times in usec), rows by increasing throughput."""
    first = "Concurrency" if options.concurrency else "Request Rate"
    decoupled = bool(levels) and levels[0].summary.counting.first_response
    header = [first, "Inferences/Second"]
    if decoupled:
        header.append("Response Throughput")
    header += [
        "Client Send",
        "Network+Server Send/Recv",
        "Server Queue",
        "Server Compute Input",
        "Server Compute Infer",
        "Server Compute Output",
        "Client Recv",
    ]
    header += [f"p{p} latency" for p in percentiles_of(options)]
    rows = []
    for level in sorted(levels, key=lambda lv: lv.summary.throughput):
        window, server = level.summary, level.summary.server
        _total, send, receive, wait = client_times_us(window)
        compute_count = server.compute_input_count
        compute_us = (
            (server.compute_input_ns + server.compute_infer_ns + server.compute_output_ns)
            // compute_count
            // 1000
            if compute_count
            else 0
        )
        network = max(wait - server.average_us("queue") - compute_us, 0)
        value: Any = int(level.value) if level.mode == "concurrency" else f"{level.value:g}"
        responses = [f"{window.response_throughput:g}"] if decoupled else []
        rows.append(
            [
                value,
                f"{window.throughput:g}",
                *responses,
                send,
                network,
                server.average_us("queue"),
                server.average_us("compute_input"),
                server.average_us("compute_infer"),
                server.average_us("compute_output"),
                receive,
                *(window.latency_ns(p) // 1000 for p in percentiles_of(options)),
            ]
        )
    with path.open("w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def write_profile_export(path: Path, levels: list[Level], options: PerfOptions) -> None:
    """Every measured request's send and answer times (ns since the Unix epoch) per level, and
    the window boundaries, in perf_analyzer's profile-export layout."""
    experiments = []
    for level in levels:
        inputs = [{t.name: _json_values(t) for t in tensors} for tensors in level.inputs]
        offset = level.wall_offset_ns
        requests = []
        for window in level.windows:
            order = np.argsort(window.records["start"], kind="stable")
            for record in window.records[order]:
                requests.append(
                    {
                        "timestamp": int(record["start"]) + offset,
                        "request_inputs": inputs[int(record["payload"])],
                        "response_timestamps": _response_times(record, offset),
                        "response_outputs": [{}],
                    }
                )
        boundaries = []
        for window in level.windows:
            boundaries += [window.begin_ns + offset, window.end_ns + offset]
        experiments.append(
            {
                "experiment": {
                    "mode": level.mode,
                    "value": int(level.value) if level.mode == "concurrency" else level.value,
                },
                "requests": requests,
                "window_boundaries": boundaries,
            }
        )
    document = {
        "experiments": experiments,
        "version": f"tritonfast {__version__}",
        "service_kind": "triton",
        "endpoint": "",
    }
    path.write_text(json.dumps(document))


def _response_times(record: np.void, offset: int) -> list[int]:
    """The first response's time and, when there were more, the last one's."""
    first, last = int(record["first"]) + offset, int(record["end"]) + offset
    return [first, last] if int(record["responses"]) > 1 else [last]


def _json_values(tensor: Tensor) -> Any:
    """An input's values as perf_analyzer exports them: a string for BYTES (a list of
    strings for several), a number for one element, else a flat list."""
    if tensor.datatype == "BYTES":
        texts = [item.decode(errors="replace") for item in tensor.values]
        return texts[0] if len(texts) == 1 else texts
    flat = np.asarray(tensor.values).ravel().tolist()
    return flat[0] if len(flat) == 1 else flat
