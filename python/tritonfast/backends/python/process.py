"""Python model instances in worker processes: one process per instance, as Triton runs them.
This module is the server's side (:class:`ProcessInstance`); the worker's is :mod:`.worker`,
how workers start and end :mod:`.workerprocess`, how tensors lie in the segments between them
:mod:`.segmentlayout`.

The default for Python models; chosen per model in ``config.pbtxt`` with::

    parameters { key: "TRITONFAST_INSTANCE_MODE" value: { string_value: "process" } }

(``"auto"`` runs instances in the server process, and short executions on the event loop, see
``runtime.looprun``; ``"thread"`` runs them in the server process, always on the instances'
own threads; ``--backend-config=python,instance-mode=...`` changes the default.) Each instance
has its own interpreter and GIL, so N instances execute Python code truly in parallel, and a
crash in one ends its worker, not the server.

Tensors never go through pickle: the server writes a batch's input tensors into a
shared-memory segment it owns, the worker views them there with numpy (no copy) and writes its
output tensors into a segment the worker owns, from which the server copies them out. Only the
small description of each batch (names, shapes, offsets, parameters) travels over a pipe.
Input arrays a model receives are valid until its ``execute`` returns (the segment is reused
by the next batch); a model that keeps one longer must copy it. Decoupled models get copies,
since their requests commonly outlive ``execute`` (a thread or coroutine per request).

Large tensors in a client's system shared memory do not go through the segments: the server
names where they lie in the client's object, and the worker maps it and reads the input, or
writes the output, there (:mod:`.sharedobjects`), as the server does in-process.

A worker that dies (a crash in native code, ``os._exit``) fails the batch it was running with
an error naming the instance, and is started again, with ``initialize``, for the next batch.

A client that goes away while its request runs is seen by the model through
``request.is_cancelled()``: the server raises that request's byte in a small shared
cancellation segment (one byte per request of the batch), which the worker's requests read.

Batches of models the server's core takes all the way (:mod:`tritonfast.runtime.lane`) go to
the worker over a channel of the core's (typed messages, written and read without the GIL on
the lane's driver threads): :meth:`ProcessInstance.core_link`; so do a decoupled model's
responses, sent from ``execute`` or from the model's own threads after it returned (read by
the core, see ``rust/src/lane/streams.rs``). The pipe then carries the rest (logs, metric
values, the calls the model makes through the server's Python, streams' cancellations,
finalize), read on the event loop. With ``core-path=off`` batches are driven from the event
loop instead: the loop writes each batch for the worker and reads everything the worker sends
(:mod:`.looppipe`, through ``execute_later``), a decoupled model's responses included (over
the pipe, see :mod:`.workerstream`). Those whose code may wait on the server (BLS) run from the
instance's thread then (``execute``; a decoupled one's responses are read by a
:class:`~.workerstream.ResponseRelay` thread). Workers are forked from a fork server that
imported the worker's module once (:func:`~.workerprocess.worker_context`).

A non-decoupled model's response sender works too: the worker takes the one response sent
through it (waiting for it if the model sends it after ``execute`` returned).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tritonfast._core import LaneWorkerLink
from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import ModelInstance, PhaseClock
from tritonfast.backends.python import workerbls, workerlog
from tritonfast.backends.python.looppipe import LoopPipe, flag_cancelled
from tritonfast.backends.python.segmentlayout import read_tensor, write_tensors
from tritonfast.backends.python.sharedobjects import Place, as_tuple
from tritonfast.backends.python.worker import worker_main
from tritonfast.backends.python.workerprocess import (
    FINALIZE_TIMEOUT_S,
    START_TIMEOUT_S,
    reap,
    worker_context,
)
from tritonfast.backends.python.workerstream import ResponseRelay, rebuild
from tritonfast.custommetrics import State
from tritonfast.data.types import RELEASE_RESCHEDULE, InferRequest, InferResponse, OutputTensor
from tritonfast.errors import (
    Code,
    InternalError,
    InvalidArgumentError,
    TritonError,
    UnavailableError,
    error_for,
)
from tritonfast.memory.sharedmemory import NO_DATA
from tritonfast.memory.shmsegment import Segment, SegmentReader, SegmentWriter, remove_segments
from tritonfast.runtime import handle
from tritonfast.runtime.instance import Caller, calls_made_by, running_instance
from tritonfast.runtime.responses import Result

MODE_PARAMETER = "TRITONFAST_INSTANCE_MODE"
MODES = ("process", "auto", "thread")
# A model that names no mode: isolated (a crash in it cannot end the server). The server-wide
# default changes with --backend-config=python,instance-mode=<mode>.
DEFAULT_MODE = "process"
MODE_SETTING = "instance-mode"
# A worker with nothing running gets at least this long to finalize, even once the time its
# model was given to stop (the exit timeout, say) has run out.
FINALIZE_FLOOR_S = 2.0
# How often the server passes new cancellations of running requests on to the worker.
CANCEL_POLL_S = 0.005
# How long a decoupled batch run from a thread before the loop drives the worker (warm-up)
# waits after its reply for the final flags still to come.
FINALS_WAIT_S = 60.0

_instance_serials = itertools.count()


def instance_mode(config: model_config_pb2.ModelConfig, default: str = DEFAULT_MODE) -> str:
    """``"process"``, ``"auto"`` or ``"thread"``, from the model's parameters (``default``
    when it names none)."""
    if MODE_PARAMETER not in config.parameters:
        return default
    mode = config.parameters[MODE_PARAMETER].string_value
    if mode not in MODES:
        raise InvalidArgumentError(
            f"model '{config.name}': parameter {MODE_PARAMETER} must be one of"
            f" {', '.join(MODES)}, not '{mode}'"
        )
    return mode


class ProcessInstance(ModelInstance):
    """A model instance whose ``TritonPythonModel`` lives in its own worker process."""

    def __init__(
        self,
        model_file: Path,
        config: model_config_pb2.ModelConfig,
        *,
        instance_name: str,
        repository_path: Path,
        version: int,
    ) -> None:
        self._instance_name = instance_name
        self._model_name = config.name
        self._decoupled = config.model_transaction_policy.decoupled
        # Decoupled models driven from the instance thread: the pipe's reader; and the tokens
        # naming each decoupled request's stream.
        self._relay: ResponseRelay | None = None
        self._tokens = itertools.count(1)
        # Segment names carry a serial, not the instance name (which may hold any character).
        serial = next(_instance_serials)
        self._metrics_source = f"{self._model_name}:{version}:{instance_name}:{serial}"
        # Where the worker's custom metrics go: its server's, shown on its /metrics (made
        # while the server starts the model: handle.current() names that server).
        self._server_metrics = handle.current().custom_metrics.workers
        self._start_args = (
            str(model_file),
            config.SerializeToString(),
            instance_name,
            str(repository_path),
            version,
            self._metrics_source,
        )
        self._inputs = SegmentWriter(f"tritonfast-in-{serial}")
        # One byte per request of a batch: 1 once that request's caller has gone away.
        self._cancel = Segment.create(f"tritonfast-cancel-{serial}", max(config.max_batch_size, 1))
        # Where the worker creates its output segments; removed here if the worker dies.
        self._output_prefix = f"tritonfast-out-{os.getpid()}-{serial}"
        self._generations = itertools.count()
        self._outputs = SegmentReader()
        # Batches go from the event loop to the worker and back (execute_later), unless the
        # model may wait on the server (then from the instance thread: execute).
        self.runs_elsewhere = True
        self._finalized = False  # set by finalize: a worker that dies is not started again
        self._stop_deadline: float | None = None  # see stop_by
        self._stopping = threading.Lock()  # see _stop_process
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        # The server's end of the worker's channel from the core (see core_link).
        self._lane_conn: Connection | None = None
        # Set by the core's scheduler: whether the core runs a batch on this worker now, and
        # whose calls its model's calls to the server are.
        self.core_running: Callable[[], bool] | None = None
        self.core_caller: Caller | None = None
        self._lane_tag = f"lane{serial}"
        # The loop's end of the worker's pipe (made by the first execute_later).
        self._pipe: LoopPipe | None = None
        self._unloading = False  # its pipes no longer hold back for slow clients
        # The instance (runtime.instance.InstanceLoop) whose batches this worker runs: its
        # model's calls to the server are made on that instance's behalf.
        self._caller: Caller | None = None
        try:
            self._start()
        except BaseException:
            self._inputs.close()
            self._cancel.close()
            raise

    def _start(self) -> None:
        context = worker_context()
        ours, theirs = context.Pipe()
        lane_ours, lane_theirs = context.Pipe()
        output_prefix = f"{self._output_prefix}-{next(self._generations)}"
        process = context.Process(
            target=worker_main,
            args=(theirs, lane_theirs, output_prefix, *self._start_args),
            name=f"tritonfast-instance:{self._instance_name}",
            daemon=True,
        )
        process.start()
        theirs.close()
        lane_theirs.close()
        self._process, self._conn, self._pipe = process, ours, None
        self._lane_conn = lane_ours
        if not ours.poll(START_TIMEOUT_S):
            self._stop_process()
            raise InternalError(f"instance '{self._instance_name}' did not start in time")
        try:
            reply = ours.recv()
            while reply[0] == "log":  # initialize logged
                workerlog.emit(reply)
                reply = ours.recv()
        except (EOFError, OSError):
            process.join(5)  # the pipe closes a moment before the exit is reported
            reply = ("error", f"the worker process exited with code {process.exitcode}")
        if reply[0] != "ready":
            self._stop_process()
            raise InternalError(reply[1])
        self._take_metrics(reply[1])
        if reply[2]:
            # It may wait on the server (BLS) or on a loop of its own: batches from its
            # instance thread, which the server's calls-in-progress accounting follows.
            self.runs_elsewhere = False

    # -- driven by the core (runtime.lane) ----------------------------------------------------
    def core_link(self, loop: asyncio.AbstractEventLoop) -> LaneWorkerLink:
        """The core's link to the current worker (every worker takes batches over the core's
        channel when the core drives it; a decoupled model's responses come back over it
        too); its pipe (logs, metric values, finalize) is
        read on ``loop`` from now on."""
        conn, self._lane_conn = self._lane_conn, None
        if conn is None:
            raise InternalError(f"instance '{self._instance_name}' has no worker")
        self._watch_pipe(loop)
        with conn:  # the link holds its own descriptor of the channel
            return LaneWorkerLink(conn.fileno(), self._lane_tag, self._streams_died_message())

    def _streams_died_message(self) -> str:
        return (
            f"the worker process of model instance '{self._instance_name}' exited before it"
            " sent the final response"
        )

    def core_cancel(self, token: int) -> None:
        """The consumer of stream ``token`` went away: the worker's sender reports it."""
        pipe = self._pipe
        if pipe is not None and not pipe.closed:
            with contextlib.suppress(OSError):  # a dead worker: its streams end anyway
                pipe.send(("cancel", token))

    def _watch_pipe(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have ``loop`` read the worker's pipe (made there, as every LoopPipe is)."""
        done = threading.Event()

        def watch() -> None:
            if self._pipe is None and self._conn is not None:
                self._pipe = self._loop_pipe(self._conn, loop)
            done.set()

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            watch()
            return
        loop.call_soon_threadsafe(watch)
        done.wait(START_TIMEOUT_S)

    def _loop_pipe(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> LoopPipe:
        """The loop's reader of the worker's pipe (made on ``loop``)."""
        return LoopPipe(
            conn,
            loop,
            self._instance_name,
            self._cancel.buffer,
            self._serve_call,
            unbounded=self._unloading,
        )

    def core_died(self) -> TritonError:
        """The worker went away in a batch: the loop stops reading its pipe, the process is
        seen out; the error the batch gets."""
        pipe = self._pipe
        if pipe is not None and not pipe.closed:
            stopped = threading.Event()

            def stop() -> None:
                pipe.died()
                stopped.set()

            with contextlib.suppress(RuntimeError):  # the loop is gone
                pipe.loop.call_soon_threadsafe(stop)
                stopped.wait(START_TIMEOUT_S)
        return self._died()

    def core_restart(self) -> TritonError | None:
        """A new worker after the last one died; the error its batches get when it cannot
        start (or the instance is going away)."""
        if self._finalized:
            return InternalError("the model is unloading")
        return self._restart()

    def _serve_call(
        self, message: tuple[Any, ...], send: Callable[[tuple[Any, ...]], None]
    ) -> None:
        """Answer a call the worker's model made to the server (BLS, model control, a
        metric's value), on behalf of the instance whose batches the worker runs: while the
        call is in flight that instance counts as waiting on the server."""
        with calls_made_by(self._caller or self.core_caller):
            workerbls.serve(message, send)

    def _restart(self) -> TritonError | None:
        """Starts a worker again after its last one died. When it cannot (its ``initialize``
        raising, say), returns the error the batch waiting for it fails with (the next batch
        tries again): made, not raised, so that it carries no traceback, whose frames would
        keep the batch and its requests for as long as a client holds the error."""
        try:
            self._start()
        except TritonError as exc:
            return InternalError(
                f"Failed to process the request(s) for model instance '{self._instance_name}',"
                f" message: its worker process could not be started again: {exc.message}"
            )
        return None

    def execute(self, requests: list[InferRequest], clock: PhaseClock) -> list[Result] | None:
        """From the instance thread (models that may wait on the server), or before the loop
        drives the worker (warm-up)."""
        self._caller = running_instance() or self._caller  # (a retry comes from elsewhere)
        if self._conn is None:
            if self._finalized:  # the instance is going away: no new worker
                return [InternalError("the model is unloading")] * len(requests)
            failed = self._restart()
            if failed is not None:
                return [failed] * len(requests)
        assert self._conn is not None
        flags = self._cancel.buffer
        tokens = None
        relay = self._relay
        if relay is None and self._decoupled and not self.runs_elsewhere:
            # (Made here, not when the worker starts: a worker the core drives has its pipe
            # read on the loop.)
            relay = self._relay = ResponseRelay(self._conn, self._instance_name, self._serve_call)
        if self._decoupled:
            tokens = [next(self._tokens) for _ in requests]
            if relay is not None:
                for token, request in zip(tokens, requests, strict=True):
                    relay.open(token, request.sender)
        message = self._message(requests, tokens)
        try:
            if relay is None:
                reply = self._exchange(message, requests, tokens, clock)
            else:
                relay.send(message)
                clock.inputs_ready()
                reply = None
                while reply is None:
                    try:
                        reply = relay.reply(CANCEL_POLL_S)
                    except queue.Empty:
                        flag_cancelled(requests, flags)
            clock.infer_done()
        except (EOFError, OSError):
            return [self._died()] * len(requests)
        assert reply is not None
        rescheduled = self._take_release_flags(reply, requests, tokens)
        if self._decoupled:
            if relay is not None:
                relay.forget(rescheduled)
            self._take_metrics(reply[4])
            return None  # every response went through the requests' senders
        return self._results(reply)

    def _exchange(
        self,
        message: tuple[Any, ...],
        requests: list[InferRequest],
        tokens: list[int] | None,
        clock: PhaseClock,
    ) -> tuple[Any, ...]:
        """Send a batch and read the worker's pipe on this thread until its reply, and for a
        decoupled batch until every request's final flag or :data:`FINALS_WAIT_S` after the
        reply, whichever comes first (the pipe is read by no one else here: no relay, and the
        loop not yet driving the worker)."""
        conn = self._conn
        assert conn is not None
        flags = self._cancel.buffer
        senders = {}
        if tokens is not None:
            senders = {t: r.sender for t, r in zip(tokens, requests, strict=True) if r.sender}
        conn.send(message)
        clock.inputs_ready()
        reply = None
        deadline = 0.0  # once the reply came: how long the finals may still take
        while reply is None or senders:
            if not conn.poll(CANCEL_POLL_S):
                flag_cancelled(requests, flags)
                if reply is not None and time.monotonic() > deadline:
                    break
                continue
            received = conn.recv()
            kind = received[0]
            if kind == "log":
                workerlog.emit(received)
            elif kind in workerbls.REQUESTS:  # the model called another model
                self._serve_call(received, conn.send)
            elif kind == "responses":
                for token, described, final in received[1]:
                    sender = senders.pop(token, None) if final else senders.get(token)
                    if sender is not None:
                        sender.send(rebuild(described) if described else None, final)
            else:
                reply = received
                deadline = time.monotonic() + FINALS_WAIT_S
        assert reply is not None
        return reply

    def execute_later(
        self,
        requests: list[InferRequest],
        clock: PhaseClock,
        finish: Callable[[Sequence[Result] | None], None],
        release: Callable[[], None],
    ) -> None:
        """The batch goes to the worker from the loop; the worker's answer (and a decoupled
        batch's responses) come back to the loop through the instance's :class:`LoopPipe`."""
        self._caller = running_instance() or self._caller  # (a retry comes from elsewhere)
        loop = asyncio.get_running_loop()
        pipe = self._pipe
        if self._conn is None or (pipe is not None and pipe.closed):
            # Its worker died (in an earlier batch, or while a stream was open) and has not
            # started again: start it, then run the batch.
            def retry() -> None:
                self.execute_later(requests, clock, finish, release)

            self._restart_then(loop, None, requests, finish, release, retry)
            return
        if pipe is None:
            pipe = self._pipe = self._loop_pipe(self._conn, loop)
        senders = None
        tokens = None
        if self._decoupled:
            tokens = [next(self._tokens) for _ in requests]
            senders = {
                token: request.sender
                for token, request in zip(tokens, requests, strict=True)
                if request.sender is not None
            }

        def replied(reply: tuple[Any, ...] | None) -> None:
            if reply is None:  # the worker died
                self._restart_then(loop, self._died, requests, finish, release, None)
                return
            clock.infer_done()
            rescheduled = self._take_release_flags(reply, requests, tokens)
            if self._decoupled:  # every response went through the requests' streams
                pipe.forget(rescheduled)
                self._take_metrics(reply[4])
                finish(None)
            else:
                finish(self._results(reply))
            release()

        try:
            pipe.run(self._message(requests, tokens), requests, replied, senders)
        except OSError:  # the worker died since its last batch: this one fails with it
            pipe.died()
            self._restart_then(loop, self._died, requests, finish, release, None)
            return
        clock.inputs_ready()

    def _restart_then(
        self,
        loop: asyncio.AbstractEventLoop,
        failure: Callable[[], TritonError] | None,
        requests: list[InferRequest],
        finish: Callable[[Sequence[Result] | None], None],
        release: Callable[[], None],
        retry: Callable[[], None] | None,
    ) -> None:
        """Off the loop: see the dead worker out (``failure`` says why its batch failed) and
        start a new one, then release the instance; or, with no failure (no worker when a batch
        came), start one and ``retry`` the batch on it."""

        def work() -> None:
            if failure is not None:
                error = failure()
                loop.call_soon_threadsafe(finish, [error] * len(requests))
            elif self._conn is not None:  # died between batches: see it out first
                self._died()
            if self._finalized:  # the instance is going away: no new worker
                if failure is None:
                    loop.call_soon_threadsafe(
                        finish, [InternalError("the model is unloading")] * len(requests)
                    )
                loop.call_soon_threadsafe(release)
                return
            failed = self._restart()
            if failed is not None:
                if failure is None:
                    loop.call_soon_threadsafe(finish, [failed] * len(requests))
                loop.call_soon_threadsafe(release)
                return
            if retry is not None:  # the worker is back: run the batch after all
                loop.call_soon_threadsafe(retry)
            else:
                loop.call_soon_threadsafe(release)

        loop.run_in_executor(None, work)

    def _message(self, requests: list[InferRequest], tokens: list[int] | None) -> tuple[Any, ...]:
        """The batch's inputs written to the input segment, and the message describing it."""
        tensors = [
            (t.name, t.datatype, t.shape, t.data, self._input_place(r, t.name))
            for r in requests
            for t in r.inputs
        ]
        name, size, slots = write_tensors(self._inputs, tensors)
        described = []
        position = 0
        for request in requests:
            count = len(request.inputs)
            described.append(
                (
                    request.model_name,
                    request.model_version,
                    request.id,
                    request.parameters,
                    None if request.outputs is None else [o.name for o in request.outputs],
                    slots[position : position + count],
                    workerbls.trace_token(request.trace),
                    self._output_places(request),
                )
            )
            position += count
        self._cancel.buffer[: len(requests)] = bytes(len(requests))
        return ("execute", name, size, described, self._cancel.name, self._cancel.size, tokens)

    def _input_place(self, request: InferRequest, name: str) -> Place | None:
        """Where the worker finds an input in a client's shared memory, if it can; None: it
        gets a copy. (A decoupled model's requests outlive their batch: copies.)"""
        places = request.input_places
        place = places.get(name) if places is not None and not self._decoupled else None
        return as_tuple(place) if place is not None and place.still_registered() else None

    def _output_places(self, request: InferRequest) -> dict[str, Place] | None:
        """Where the worker writes outputs bound for a client's shared memory itself (one it
        can no longer map there comes back in its segment, for the server to write)."""
        places = request.output_places
        if places is None or self._decoupled:
            return None
        return {n: as_tuple(p) for n, p in places.items()}

    def _died(self) -> TritonError:
        """The worker went away in a batch: see it out, and the error that batch gets."""
        code = None
        process = self._process  # finalize may be seeing it out at the same time
        if process is not None:
            with contextlib.suppress(ValueError):  # finalize closed it meanwhile
                process.join(5)  # the pipe closes a moment before the exit is reported
                code = process.exitcode
        self._stop_process()
        if self._finalized:
            return UnavailableError(
                f"model instance '{self._instance_name}' was unloaded before the request"
                " finished: its worker process was stopped at the end of the exit timeout"
            )
        return InternalError(
            f"Failed to process the request(s) for model instance '{self._instance_name}',"
            f" message: the instance's worker process exited (code {code}); it restarts"
            " for the next request"
        )

    def _results(self, reply: tuple[Any, ...]) -> list[Result]:
        _, out_name, out_size, results, metrics, _ = reply
        self._take_metrics(metrics)
        segment = self._outputs.map(out_name, out_size) if out_name else None
        return [self._result(segment, r) for r in results]

    @staticmethod
    def _take_release_flags(
        reply: tuple[Any, ...], requests: list[InferRequest], tokens: list[int] | None
    ) -> list[int]:
        """The release flags the model set on the requests (``reply``'s last field); returns
        the stream tokens of those it rescheduled (a new token carries them next time)."""
        release = reply[-1]
        if release is None:
            return []
        for request, flags in zip(requests, release, strict=True):
            request.release_flags = flags
        if tokens is None:
            return []
        return [
            token
            for token, flags in zip(tokens, release, strict=True)
            if flags & RELEASE_RESCHEDULE
        ]

    def _take_metrics(self, state: State | None) -> None:
        """The worker's custom metrics, when they changed (exported on /metrics)."""
        if state is not None:
            self._server_metrics.update(self._metrics_source, state)

    def _result(self, segment: Any, result: tuple[Any, ...]) -> Result:
        if result[0] == "none":  # rescheduled: answered when it runs again
            return None  # type: ignore[return-value]
        if result[0] == "error":
            return error_for(Code(result[1]), result[2])
        _, model_name, model_version, response_id, parameters, slots = result
        outputs = [
            OutputTensor(slot[0], slot[1], slot[2], NO_DATA, in_shared_memory=True)
            if slot[5] is not None  # the worker wrote it into the client's shared memory
            else OutputTensor(
                slot[0],
                slot[1],
                slot[2],
                read_tensor(segment.buffer, slot, self._model_name, None, copy=True),
            )
            for slot in slots
        ]
        return InferResponse(model_name, model_version, response_id, outputs, parameters)

    def unloading(self) -> None:
        self._unloading = True
        pipe = self._pipe
        if pipe is not None:
            pipe.stop_holding_back()

    def stop_by(self, deadline: float) -> None:
        self._stop_deadline = deadline

    def _finalize_wait(self) -> float:
        """How long to wait for the worker to finalize: its model's time to stop (see
        stop_by), at most FINALIZE_TIMEOUT_S; none once that is over and the worker is still
        running a batch (it answers nothing before the batch ends), else FINALIZE_FLOOR_S at
        least."""
        if self._stop_deadline is None:
            return FINALIZE_TIMEOUT_S
        left = self._stop_deadline - time.monotonic()
        pipe = self._pipe
        busy = pipe is not None and pipe.busy()
        if left <= 0 and (busy or (self.core_running is not None and self.core_running())):
            return 0.0
        return min(FINALIZE_TIMEOUT_S, max(left, FINALIZE_FLOOR_S))

    def finalize(self) -> None:
        self._finalized = True
        wait = self._finalize_wait()
        end = time.monotonic() + wait
        pipe = self._pipe
        if pipe is not None and not pipe.closed and pipe.finalize(wait):
            pass  # done through the loop, which reads the worker's pipe (or given up on)
        elif self._conn is not None:
            try:
                self._conn.send(("finalize",))
                while self._conn.poll(wait):
                    reply = self._conn.recv()
                    if reply[0] != "log":
                        break
                    workerlog.emit(reply)
            except (EOFError, OSError):
                pass
        # What is left of the same wait for the worker to exit (then it is killed).
        self._stop_process(max(0.0, end - time.monotonic()))
        self._server_metrics.remove(self._metrics_source)
        self._inputs.close()
        self._outputs.close()
        self._cancel.close()

    def _stop_process(self, wait: float = FINALIZE_TIMEOUT_S) -> None:
        # Finalize and the loop seeing a worker die (as finalize closes its pipe) may both
        # get here: one at a time.
        with self._stopping:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._lane_conn is not None:
                self._lane_conn.close()
                self._lane_conn = None
            if self._relay is not None:
                self._relay.join(wait)
                self._relay = None
            if self._process is not None:
                reap(self._process, wait)
                self._process = None
            remove_segments(self._output_prefix)
