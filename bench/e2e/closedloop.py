"""Closed-loop load from tritonfast's own load generator (``tritonfast._core.LoadRun``, the
engine of ``tritonfast perf``) for the benchmark scripts: one request's bytes (or each
client's own series of requests) sent by ``concurrency`` clients for a warm-up and then a
measured time, every answer required to be a success."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from tritonfast._core import LoadRun
from tritonfast.perf.measure import RECORD
from tritonfast.perf.payloads import GRPC_INFER_PATH


class LoadFailed(Exception):
    pass


@dataclass(frozen=True)
class Measured:
    requests: int  # answered within the measured time
    answered: int  # answered in all, the warm-up included
    seconds: float
    p50_us: float
    p99_us: float
    server_cpu_s: float  # of process group SERVER_PGID over the measured time (0 without one)
    responses: int = 0  # the measured requests' responses (a decoupled model's stream)
    first_p50_us: float = 0.0  # from a request's sending to its first response

    @property
    def req_s(self) -> float:
        return self.requests / self.seconds


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every process in process group ``pgid``."""
    from stateful import group_cpu_s as of_group

    return of_group(pgid) if pgid else 0.0


def closed_loop(
    protocol: str,
    address: str,
    request: bytes | list[bytes],
    concurrency: int,
    seconds: float,
    warm: float = 1.0,
    connections: int = 1,
    pgid: int = 0,
    scripts: list[list[int]] | None = None,
    decoupled: bool = False,
) -> Measured:
    """``protocol`` "http" (``request`` a whole HTTP/1.1 request) or "grpc" (a serialized
    ``ModelInferRequest``); gRPC clients spread over ``connections`` HTTP/2 connections.
    With ``scripts`` (one per client), ``request`` is a list and each client sends the
    requests its script names, in order, over and over (a sequence's requests, say).
    ``protocol`` "grpc-stream": each client a ``ModelStreamInfer`` stream, a request
    complete at its ``triton_final_response`` when ``decoupled``."""
    payloads = [request] if isinstance(request, bytes) else request
    run = LoadRun(
        protocol,
        address,
        payloads,
        path=GRPC_INFER_PATH,
        connections_per_thread=connections,
        concurrency=concurrency,
        decoupled=decoupled,
        **({} if scripts is None else {"scripts": scripts}),
    )
    try:
        time.sleep(warm)
        run.take()
        begin, cpu_begin = run.now(), group_cpu_s(pgid)
        time.sleep(seconds)
        end, cpu_end = run.now(), group_cpu_s(pgid)
        records = np.frombuffer(run.take(), RECORD)
    finally:
        run.stop()
    succeeded, failed = run.counts()
    if failed:
        raise LoadFailed(f"{failed} requests failed: {'; '.join(run.errors())}")
    records = records[(records["end"] >= begin) & (records["end"] < end)]
    if not len(records):
        raise LoadFailed("no request was answered in the measured time")
    latencies_us = (records["end"] - records["start"]) / 1e3
    return Measured(
        requests=len(records),
        answered=succeeded,
        seconds=(end - begin) / 1e9,
        p50_us=float(np.percentile(latencies_us, 50)),
        p99_us=float(np.percentile(latencies_us, 99)),
        server_cpu_s=cpu_end - cpu_begin,
        responses=int(records["responses"].sum()),
        first_p50_us=float(np.percentile((records["first"] - records["sent"]) / 1e3, 50)),
    )
