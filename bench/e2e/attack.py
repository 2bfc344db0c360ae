"""Hostile requests against a running server, and what they do to everyone else.

    usage: [SERVER_PGID=pid] python bench/e2e/attack.py HTTP_HOSTPORT GRPC_HOSTPORT [MODEL] [LABEL]

Two well-behaved clients (tritonclient HTTP and gRPC, each one request at a time, a [1,16]
FP32 tensor through MODEL, ``identity`` by default) keep sending through every phase; their
latencies are the measure. Phases, PHASE_S seconds each (default 5), in this order:

- ``unloaded``: no attack; the reference p50/p99.
- ``lying-length``: 100 connections that declare a 32 MiB body and 4 that declare 2^31-1
  bytes, each sending 7 bytes and then nothing, held open for the phase.
- ``json-64MiB``: 64 MiB JSON bodies that break at their very end, sent one after another.
- ``gzip-256MiB`` / ``gzip-1GiB``: gzip bodies of 255 KB / 1 MB that inflate to 256 MiB /
  1 GiB, one after another.
- ``grpc-64MiB``: 64 MiB gRPC messages that do not parse as a ModelInferRequest.
- ``after``: no attack again; what the clients see once it is over.

For each phase: the clients' request count, p50, p99 and p99 over the unloaded p99, their
errors, the attack requests' outcomes, and (with SERVER_PGID: the server's process group) the
server's resident memory at its highest in the phase and at the phase's end, over its
unloaded level. An attack request that is still being sent when the phase ends is finished
before the next phase starts, and the clients measure until then.

Output: a table on stdout and, with OUTDIR set, OUTDIR/attack-LABEL.json.

ATTACKS (attack names separated by blanks) runs only those between ``unloaded`` and
``after``; ATTACKER_NICE sets the attacking process's niceness (0 by default).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.queues import Queue

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

PHASE_S = float(os.environ.get("PHASE_S", "5"))
# The attacking process's niceness. On a real network the attacker's CPU is not the server's;
# on one small machine its sends compete with the server and the measuring clients for the
# same cores, and a high niceness (19) takes most of that share out of the measure.
ATTACKER_NICE = int(os.environ.get("ATTACKER_NICE", "0"))
RSS_EVERY_S = 0.1
PAGE = os.sysconf("SC_PAGE_SIZE")


def server_rss(pgid: int) -> int:
    """Resident bytes of every process in the server's process group (Triton's stubs, our
    workers)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields[2]: pgrp (the fifth field of the line)
                continue
            with open(f"/proc/{entry}/statm") as statm:
                total += int(statm.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return total


@dataclass
class Phase:
    name: str
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"http": [], "grpc": []})
    errors: dict[str, int] = field(default_factory=lambda: {"http": 0, "grpc": 0})
    outcomes: dict[str, int] = field(default_factory=dict)
    rss: list[int] = field(default_factory=list)


class Clients:
    """The two well-behaved clients, recording into whichever phase is current."""

    def __init__(self, http_url: str, grpc_url: str, model: str) -> None:
        self.phase = Phase("warm-up")
        self._stop = threading.Event()
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        self._threads = [
            threading.Thread(target=self._run, args=("http", httpclient, http_url, model, data)),
            threading.Thread(target=self._run, args=("grpc", grpcclient, grpc_url, model, data)),
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, kind: str, module, url: str, model: str, data: np.ndarray) -> None:
        connect = {} if module is grpcclient else {"network_timeout": 30.0}
        client = module.InferenceServerClient(url, **connect)
        tensor = module.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        timeout = {"client_timeout": 30} if module is grpcclient else {}
        while not self._stop.is_set():
            phase = self.phase
            started = time.perf_counter()
            try:
                answer = client.infer(model, [tensor], **timeout)
                ok = np.array_equal(answer.as_numpy("OUTPUT0"), data)
            except Exception:
                ok = False
            elapsed = time.perf_counter() - started
            if ok:
                phase.latencies[kind].append(elapsed)
            else:
                phase.errors[kind] += 1
                time.sleep(0.01)  # a server that refuses everything is not spun on
        client.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


# -- attacks, run in a process of their own: the clients' measure must not wait on the attacker's
# own Python (building and sending bodies of many megabytes) -------------------------------------


def lying_length(http: str, outcome: Callable[[object], None], until: float) -> None:
    host, port = http.rsplit(":", 1)
    sockets = []
    for declared, count in ((32 << 20, 100), ((1 << 31) - 1, 4)):
        for _ in range(count):
            sock = socket.create_connection((host, int(port)), timeout=10)
            head = (
                f"POST /v2/models/x/infer HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
            )
            try:
                sock.sendall(head.encode() + b'{"inpu')
                outcome("held open")
            except OSError as error:
                outcome(type(error).__name__)
            sockets.append(sock)
    time.sleep(max(0.0, until - time.monotonic()))
    for sock in sockets:
        sock.close()


def post(http: str, model: str, body: bytes, headers: dict[str, str]) -> object:
    request = urllib.request.Request(
        f"http://{http}/v2/models/{model}/infer", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__


def json_body(mib: int) -> bytes:
    head = b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":['
    numbers = b"1," * ((mib << 20) // 2)
    return head + numbers + b"]}]"  # ends a list with a comma before it, and misses a brace


def gzip_bomb(mib: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    parts = [compressor.compress(b'{"inputs":')]
    blanks = b" " * (1 << 20)
    parts += [compressor.compress(blanks) for _ in range(mib)]
    parts.append(compressor.compress(b"x") + compressor.flush())
    return b"".join(parts)


def grpc_junk(grpc_url: str, junk: bytes) -> object:
    channel = grpc.insecure_channel(grpc_url, options=[("grpc.max_send_message_length", -1)])
    try:
        channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(junk, timeout=300)
        return "answered"
    except grpc.RpcError as error:
        return error.code().name
    finally:
        channel.close()


def attacker(http: str, grpc_url: str, model: str, orders: Queue, results: Queue) -> None:
    """The attacking process: builds its bodies, then runs each ordered attack until the time
    it is given (repeating the ones made of single requests) and answers with the outcomes."""
    os.nice(ATTACKER_NICE)
    json_headers = {"Content-Type": "application/json"}
    gzip_headers = {**json_headers, "Content-Encoding": "gzip"}
    json_64 = json_body(64)
    bombs = {256: gzip_bomb(256), 1024: gzip_bomb(1024)}
    junk = b"\x0a\xff\xff\xff\xff\x0f" + b"\xee" * (64 << 20)  # a field past the message's end
    sends: dict[str, Callable[[], object]] = {
        "json-64MiB": lambda: post(http, model, json_64, json_headers),
        "gzip-256MiB": lambda: post(http, model, bombs[256], gzip_headers),
        "gzip-1GiB": lambda: post(http, model, bombs[1024], gzip_headers),
        "grpc-64MiB": lambda: grpc_junk(grpc_url, junk),
    }
    results.put("ready")
    while (order := orders.get()) is not None:
        name, until = order
        outcomes: Counter[str] = Counter()

        def outcome(what: object, outcomes: Counter[str] = outcomes) -> None:
            outcomes[str(what)] += 1

        if name == "lying-length":
            lying_length(http, outcome, until)
        else:
            while True:
                outcome(sends[name]())
                if time.monotonic() >= until:
                    break
        results.put(dict(outcomes))


ATTACKS = ["lying-length", "json-64MiB", "gzip-256MiB", "gzip-1GiB", "grpc-64MiB"]
# Only these attacks (names separated by blanks), to look at one in isolation.
ONLY = os.environ.get("ATTACKS", "").split() or ATTACKS


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    http, grpc_url = sys.argv[1], sys.argv[2]
    model = sys.argv[3] if len(sys.argv) > 3 else "identity"
    label = sys.argv[4] if len(sys.argv) > 4 else "server"
    pgid = int(os.environ.get("SERVER_PGID", "0"))
    spawn = multiprocessing.get_context("spawn")
    orders: Queue = spawn.Queue()
    results: Queue = spawn.Queue()
    attacking = spawn.Process(target=attacker, args=(http, grpc_url, model, orders, results))
    attacking.start()
    results.get()  # its bodies are built
    clients = Clients(http, grpc_url, model)
    time.sleep(1.0)  # warm-up: connections open, first requests answered
    phases: list[Phase] = []
    for name in ["unloaded", *[a for a in ATTACKS if a in ONLY], "after"]:
        phase = Phase(name)
        clients.phase = phase
        phases.append(phase)
        until = time.monotonic() + PHASE_S
        attacked = name in ATTACKS
        if attacked:
            orders.put((name, until))
        while True:
            if pgid:
                phase.rss.append(server_rss(pgid))
            if time.monotonic() >= until:
                if not attacked:
                    break
                try:
                    phase.outcomes = results.get(timeout=RSS_EVERY_S)
                    break
                except queue.Empty:
                    continue
            time.sleep(RSS_EVERY_S)
    orders.put(None)
    attacking.join()
    clients.stop()
    return report(phases, label)


def report(phases: list[Phase], label: str) -> int:
    base = phases[0]
    base_rss = min(base.rss) if base.rss else 0
    base_p99 = {kind: percentile(values, 99) for kind, values in base.latencies.items()}
    rows = []
    print(
        f"{'phase':<13} {'client':<5} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'p99/unl':>8}"
        f" {'errors':>6} {'RSS max MB':>10} {'RSS end MB':>10}  attack outcomes"
    )
    for phase in phases:
        for kind, values in phase.latencies.items():
            p50, p99 = percentile(values, 50), percentile(values, 99)
            rss_max = (max(phase.rss) - base_rss) / 2**20 if phase.rss else float("nan")
            rss_end = (phase.rss[-1] - base_rss) / 2**20 if phase.rss else float("nan")
            row = {
                "phase": phase.name,
                "client": kind,
                "n": len(values),
                "p50_ms": p50 * 1e3,
                "p99_ms": p99 * 1e3,
                "p99_over_unloaded": p99 / base_p99[kind],
                "errors": phase.errors[kind],
                "rss_max_over_unloaded_mb": rss_max,
                "rss_end_over_unloaded_mb": rss_end,
                "outcomes": phase.outcomes,
            }
            rows.append(row)
            outcomes = ", ".join(f"{k} x{v}" for k, v in sorted(phase.outcomes.items()))
            print(
                f"{phase.name:<13} {kind:<5} {len(values):>6} {p50 * 1e3:>8.2f} {p99 * 1e3:>8.2f}"
                f" {row['p99_over_unloaded']:>8.2f} {phase.errors[kind]:>6} {rss_max:>10.0f}"
                f" {rss_end:>10.0f}  {outcomes if kind == 'http' else ''}"
            )
    out = os.environ.get("OUTDIR")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"attack-{label}.json"), "w") as file:
            json.dump({"label": label, "base_rss_mb": base_rss / 2**20, "rows": rows}, file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
