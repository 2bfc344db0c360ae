"""The worker process's side of a Python model instance run in its own process
(:mod:`.process` is the server's): :func:`worker_main` imports and initializes the model,
then serves the batches the server sends (:mod:`.channelbatch` reads their inputs from the
server's segment, runs them and writes outputs into the worker's own): over the core's
channel (typed messages, :class:`~tritonfast._core.LaneWorkerChannel`) when the server's core
drives the instance, else over the pipe;
:func:`auto_complete_main` runs a model's ``auto_complete_config``. The model's calls to the
server (BLS, model control, metric values) go over the same pipe (:mod:`.workerbls`), its
logs too (:mod:`.workerlog`); a decoupled model's responses go where its batch came from
(:mod:`.workerstream`)."""

from __future__ import annotations

import collections
import contextlib
import logging
import pickle
import signal
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, overload

from tritonfast._core import LaneWorkerChannel
from tritonfast._proto import model_config_pb2
from tritonfast.backends.python import workerbls, workerlog
from tritonfast.backends.python.channelbatch import (
    Batches,
    BatchRequest,
    answer_of,
    describe_results,
    release_flags,
)
from tritonfast.backends.python.workercalls import ChannelCalls
from tritonfast.backends.python.workerstream import WorkerStreams
from tritonfast.custommetrics import CustomMetrics, Labels, State
from tritonfast.data.types import RELEASE_RESCHEDULE
from tritonfast.errors import TritonError
from tritonfast.runtime import handle
from tritonfast.runtime.responses import Result


def _as_tritons_stub() -> None:
    """What a model finds in its process, as in Triton's Python stub: SIGINT and SIGTERM are
    ignored, since the server decides when the model stops (Ctrl-C in a terminal, or a
    SIGTERM sent to the whole process group, reaches the workers too, and the server still
    has their models finalized), and ``sys.argv`` is ``['']`` rather than the server's
    command line (Triton's QA models run ``unittest.main`` in ``execute``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.argv = [""]


def auto_complete_main(conn: Connection, model_file: str, config_bytes: bytes) -> None:
    _as_tritons_stub()
    from tritonfast.backends.python.loader import auto_complete, load_model_class

    workerlog.forward_model_logs(conn.send)
    config = model_config_pb2.ModelConfig.FromString(config_bytes)
    try:
        auto_complete(load_model_class(Path(model_file), config.name), config)
    except TritonError as exc:
        conn.send(("error", (exc.code.value, exc.message)))
        return
    conn.send(("ok", config.SerializeToString()))


def worker_main(
    conn: Connection,
    lane_conn: Connection,
    output_prefix: str,
    model_file: str,
    config_bytes: bytes,
    instance_name: str,
    repository_path: str,
    version: int,
    metrics_source: str,
) -> None:
    """Entry point of a worker process: load and initialize the model, then serve batches."""
    _as_tritons_stub()
    config = model_config_pb2.ModelConfig.FromString(config_bytes)
    # Responses of decoupled requests and model logs are sent from any thread: every send
    # takes its lock.
    streams = WorkerStreams(conn)
    workerlog.forward_model_logs(streams.send)
    pipe = _PipeReader(conn, streams)
    in_batch = threading.Event()
    server = _install_server_handle(streams, pipe, in_batch, metrics_source)
    metrics = server.custom_metrics.registry
    instance = _started_instance(
        streams, config, model_file, instance_name, repository_path, version, metrics
    )
    if instance is None:
        return
    server.open()
    # Batches come over the core's channel when the server's core drives the instance (see
    # process.ProcessInstance.core_link), else over the pipe.
    channel = LaneWorkerChannel(lane_conn.fileno())
    # The calls the model makes while a batch from the channel runs (see workercalls).
    server.direct = calls = ChannelCalls(channel)
    # A decoupled model's responses to the channel's batches go over the channel.
    channel_streams = (
        streams.over_channel(channel) if config.model_transaction_policy.decoupled else None
    )
    _Worker(
        pipe, in_batch, streams, instance, config.name, instance_name, output_prefix, metrics
    ).serve(channel, conn.fileno(), metrics_source, calls, channel_streams)


def _install_server_handle(
    streams: WorkerStreams, pipe: _PipeReader, in_batch: threading.Event, metrics_source: str
) -> workerbls.WorkerHandle:
    """The model's calls to the server (BLS, model control, a custom metric's value over
    every process) go over the pipe, once the worker serves (:meth:`WorkerHandle.open`); its
    metric families register in the worker's own registry from the start (``initialize``
    often makes them)."""

    def ask_server(name: str, labels: Labels, state: State) -> float | None:
        # Between batches the server may not be reading this worker's pipe (an instance
        # driven from its own thread): outside a batch, this worker's own value.
        if not in_batch.is_set():
            return None
        return server.metric_value(metrics_source, name, labels, state)

    server = workerbls.WorkerHandle(streams.send, pipe.next_answer, CustomMetrics(ask_server))
    handle.install(server)
    return server


def _started_instance(
    streams: WorkerStreams,
    config: model_config_pb2.ModelConfig,
    model_file: str,
    instance_name: str,
    repository_path: str,
    version: int,
    metrics: CustomMetrics,
) -> Any:
    """The model's instance, imported and initialized, once the server is told it is ready
    (with the state of the ``metrics`` it made); None once the server is told why it could
    not start."""
    from tritonfast.backends.python.instance import PythonInstance
    from tritonfast.backends.python.loader import describe, load_model_class

    try:
        model_class = load_model_class(Path(model_file), config.name)
        instance = PythonInstance(
            model_class,
            config,
            instance_name=instance_name,
            repository_path=Path(repository_path),
            version=version,
            model_file=Path(model_file),
        )
    except TritonError as exc:
        streams.send(("error", exc.message))
        return None
    except Exception as exc:  # the model's constructor, or a bug: a message, not a dead worker
        streams.send(("error", describe(exc)))
        return None
    streams.send(("ready", metrics.state_if_changed(), instance.may_wait))
    return instance


class _Worker:
    """A worker's loop: read a batch (or finalize) from the pipe, run it, send its reply."""

    def __init__(
        self,
        pipe: _PipeReader,
        in_batch: threading.Event,
        streams: WorkerStreams,
        instance: Any,
        model_name: str,
        instance_name: str,
        output_prefix: str,
        metrics: CustomMetrics,
    ) -> None:
        self._pipe = pipe
        self._streams = streams
        self._metrics = metrics  # the worker's custom metrics, sent with each reply
        # (in_batch: set while a batch runs; the server reads the pipe then.)
        self._batches = Batches(instance, model_name, instance_name, output_prefix, in_batch)

    def serve(
        self,
        channel: LaneWorkerChannel | None,
        pipe_fd: int,
        metrics_source: str,
        calls: ChannelCalls | None,
        channel_streams: WorkerStreams | None,
    ) -> None:
        """Runs batches until the server says finalize or goes away: from the core's
        ``channel`` while it is open (the pipe then brings only finalize and cancellations),
        else from the pipe. ``channel_streams``: where a decoupled model's responses to the
        channel's batches go."""
        try:
            while True:
                if channel is not None:
                    try:
                        batch = channel.next(pipe_fd)
                    except ConnectionError:  # the core is done with this worker: the pipe
                        channel = None  # still brings finalize
                        continue
                    if batch is not None:
                        run = self._batches.run(batch, calls, channel_streams)
                        if channel_streams is not None:
                            channel_streams.flush()  # (its responses before its reply)
                        state = self._metrics.state_if_changed()
                        extra = b"" if state is None else pickle.dumps((metrics_source, state))
                        channel.reply(*run, extra)
                        continue
                    # The pipe has something: a cancellation is taken in passing; a batch or
                    # finalize is served below.
                    taken = self._pipe.next_work(wait=False)
                    if taken is None:
                        continue
                    message = taken
                else:
                    message = self._pipe.next_work()
                if message[0] == "finalize":
                    self._finalize()
                    return
                self._run_batch(message)
        except (EOFError, ConnectionError):  # the server went away
            return
        finally:
            self._batches.close()

    def _finalize(self) -> None:
        batches = self._batches
        try:
            batches.instance.finalize()
        except TritonError as exc:  # to the server's log, in one line
            logging.getLogger(workerlog.MODEL_LOGGER).error(
                "finalize failed for instance %s: %s", batches.instance_name, exc.message
            )
        self._streams.send(("finalized",))

    def _run_batch(self, message: tuple[Any, ...]) -> None:
        """A batch from the pipe (a decoupled model's, whose responses go through the
        streams when ``tokens`` are given)."""
        _, name, size, described, flags_name, flags_size, tokens = message
        batches = self._batches
        requests, failed = batches.requests(
            name, size, described, batches.flags(flags_name, flags_size), copy=tokens is not None
        )
        if tokens is not None:
            for token, request in zip(tokens, requests, strict=True):
                request.sender = self._streams.sender(token, request)
        returned = batches.execute(requests)
        release = release_flags(requests, failed, len(described))
        if tokens is not None:
            self._end_streams(requests, returned, release)
        else:
            self._reply(requests, returned, failed, described, release)

    def _end_streams(
        self,
        requests: list[BatchRequest],
        returned: Sequence[Result | None] | None,
        release: list[int] | None,
    ) -> None:
        """A decoupled batch: its responses went through the streams; what ``execute``
        returned when it failed ends them, as in-process streams end."""
        if returned is not None:
            for request, result in zip(requests, returned, strict=True):
                if result is not None and request.sender is not None:
                    with contextlib.suppress(TritonError):  # already closed
                        request.sender.send(result, final=True)
        self._streams.send(("results", "", 0, [], self._metrics.state_if_changed(), release))

    def _reply(
        self,
        requests: list[BatchRequest],
        returned: Sequence[Result | None] | None,
        failed: dict[int, TritonError],
        described: list[tuple[Any, ...]],
        release: list[int] | None,
    ) -> None:
        """A batch's results, written to the output segment and described to the server."""
        answers: list[Result | None] = (
            [None] * len(requests) if returned is None else list(returned)
        )
        instance_name = self._batches.instance_name
        results: list[Result | None] = [
            None  # rescheduled: it runs again, and answers then
            if result is None and request.release_flags & RELEASE_RESCHEDULE
            else answer_of(request, result, instance_name)
            for request, result in zip(requests, answers, strict=True)
        ]
        for index in sorted(failed):
            results.insert(index, failed[index])
        places = [d[7] for d in described]
        batches = self._batches
        reply = describe_results(batches.outputs, results, places, batches.objects)
        self._streams.send((*reply, self._metrics.state_if_changed(), release))


class _PipeReader:
    """Who reads the worker's pipe. A model's threads call the server (BLS, metric values)
    whenever they like, even after ``execute`` returned, while the worker's loop waits for the
    next batch: whoever waits reads, one at a time, and hands over what is for the other
    (batches and finalize for the loop, answers for the server call under way, made one at a
    time); cancellations go straight to the streams. So the common cases cost no hand-over:
    the loop reads its batches itself, a call made while a batch runs reads its answer."""

    def __init__(self, conn: Connection, streams: WorkerStreams) -> None:
        self._conn = conn
        self._streams = streams
        self._changed = threading.Condition()
        self._work: collections.deque[tuple[Any, ...]] = collections.deque()
        self._answers: collections.deque[tuple[Any, ...]] = collections.deque()
        self._reading = False  # someone is in recv
        self._gone = False  # the server went away

    @overload
    def next_work(self) -> tuple[Any, ...]: ...
    @overload
    def next_work(self, wait: bool) -> tuple[Any, ...] | None: ...

    def next_work(self, wait: bool = True) -> tuple[Any, ...] | None:
        """The next batch (or finalize); EOFError once the server is gone. ``wait`` False:
        None when the pipe has nothing for the loop now (what was there, if anything, was
        a cancellation or for someone else)."""
        return self._take(self._work, wait)

    def next_answer(self) -> tuple[Any, ...]:
        """The next answer to the server call under way; EOFError once the server is gone."""
        return self._take(self._answers)

    @overload
    def _take(self, mine: collections.deque[tuple[Any, ...]]) -> tuple[Any, ...]: ...
    @overload
    def _take(
        self, mine: collections.deque[tuple[Any, ...]], wait: bool
    ) -> tuple[Any, ...] | None: ...

    def _take(
        self, mine: collections.deque[tuple[Any, ...]], wait: bool = True
    ) -> tuple[Any, ...] | None:
        with self._changed:
            while not mine and self._reading and not self._gone:
                self._changed.wait()
            if mine:
                return mine.popleft()
            if self._gone:
                raise EOFError("the server went away")
            if not wait and not self._conn.poll(0):
                return None
            self._reading = True
        try:
            while True:
                try:
                    message = self._conn.recv()
                except (EOFError, OSError):
                    with self._changed:
                        self._gone = True
                    raise EOFError("the server went away") from None
                kind = message[0]
                if kind == "cancel":
                    self._streams.cancel(message[1])
                else:
                    theirs = self._answers if kind in workerbls.ANSWERS else self._work
                    if theirs is mine:
                        return message
                    with self._changed:
                        theirs.append(message)
                        self._changed.notify_all()
                if not wait:
                    return None
        finally:
            with self._changed:
                self._reading = False
                self._changed.notify_all()
