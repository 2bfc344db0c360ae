"""Python model instances in worker processes: one process per instance, as Triton runs them.

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

Batches are driven from the event loop: the loop writes each batch for the worker and reads
everything the worker sends (:mod:`.looppipe`, through ``execute_later``), with no instance
thread or GIL hand-over in between. Models whose code may wait on the server (BLS) run from the
instance's thread instead (``execute``; a decoupled one's responses are read by a
:class:`~.workerstream.ResponseRelay` thread). Workers are forked from a fork server that
imported this module once (``_worker_context``).

Decoupled models' responses, sent from ``execute`` or from the model's own threads after it
returned, travel over the pipe (see :mod:`.workerstream`). A non-decoupled model's response
sender works too: the worker takes the one response sent through it (waiting for it if the
model sends it after ``execute`` returned).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import io
import itertools
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import numpy as np

from tritonfast._core import copy_into
from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import ModelInstance, PhaseClock
from tritonfast.backends.python import workerbls, workerlog
from tritonfast.backends.python.looppipe import LoopPipe, flag_cancelled
from tritonfast.backends.python.sharedobjects import Place, SharedObjects, as_tuple
from tritonfast.backends.python.workerstream import ResponseRelay, WorkerStreams, rebuild
from tritonfast.custommetrics import CustomMetrics, Labels, State
from tritonfast.data import rawtensor
from tritonfast.data.types import (
    RELEASE_RESCHEDULE,
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    RequestedOutput,
)
from tritonfast.errors import (
    Code,
    InternalError,
    InvalidArgumentError,
    TritonError,
    UnavailableError,
    error_for,
)
from tritonfast.memory.bufferpool import POOL
from tritonfast.memory.sharedmemory import NO_DATA
from tritonfast.memory.shmsegment import (
    Segment,
    SegmentReader,
    SegmentWriter,
    aligned,
    remove_segments,
)
from tritonfast.runtime import handle
from tritonfast.runtime.instance import InstanceLoop, calls_made_by, running_instance
from tritonfast.runtime.responses import Result

MODE_PARAMETER = "TRITONFAST_INSTANCE_MODE"
MODES = ("process", "auto", "thread")
# A model that names no mode: isolated (a crash in it cannot end the server). The server-wide
# default changes with --backend-config=python,instance-mode=<mode>.
DEFAULT_MODE = "process"
MODE_SETTING = "instance-mode"
# How long a worker may take to start (import the model, run initialize) or to finalize.
START_TIMEOUT_S = 120.0
FINALIZE_TIMEOUT_S = 30.0
# A worker with nothing running gets at least this long to finalize, even once the time its
# model was given to stop (the exit timeout, say) has run out.
FINALIZE_FLOOR_S = 2.0
# How often the server passes new cancellations of running requests on to the worker.
CANCEL_POLL_S = 0.005
# How long a decoupled batch run from a thread before the loop drives the worker (warm-up)
# waits after its reply for the final flags still to come.
FINALS_WAIT_S = 60.0
# Tensors from this size on are copied into and out of the segments with the GIL released;
# smaller ones (quicker than handing the GIL to and fro) with it held.
POOLED_COPY_BYTES = 64 * 1024

_instance_serials = itertools.count()

# A tensor's place: (name, datatype, shape, offset, nbytes, object place): at ``offset`` of the
# message's segment, or, with an object place, in a client's shared-memory object there.
TensorSlot = tuple[str, str, tuple[int, ...], int, int, Place | None]


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


_context: Any = None


def _worker_context() -> Any:
    """Where workers come from: a fork server that imported this module (and numpy, protobuf)
    once, so a worker starts in milliseconds plus its model's own imports, instead of a fresh
    interpreter importing everything for each (``spawn``, the fallback where there is no
    fork server). The fork server is single-threaded, so forking it is safe."""
    global _context
    if _context is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            _context = _WorkerContext()
            _context.set_forkserver_preload([__name__])
        else:
            _context = multiprocessing.get_context("spawn")
    return _context


class _WorkerPopen(popen_forkserver.Popen):
    """Starts a worker from the fork server without the server's ``__main__``: a worker needs
    nothing from it, and a program that embeds the server (``tritonfast.Server``) must not
    run again in each worker."""

    def _launch(self, process_obj: Any) -> None:
        prepared = spawn.get_preparation_data(process_obj._name)
        prepared.pop("init_main_from_name", None)
        prepared.pop("init_main_from_path", None)
        buffer = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prepared, buffer)
            reduction.dump(process_obj, buffer)
        finally:
            context.set_spawning_popen(None)
        fds = self._fds  # type: ignore[attr-defined]  # set by popen_forkserver.Popen
        self.sentinel, writer = forkserver.connect_to_new_process(fds)
        # The child watches a duplicate of the data pipe's write end to see this process go.
        watched = os.dup(writer)
        self.finalizer = util.Finalize(
            self,
            util.close_fds,  # type: ignore[attr-defined]  # not in typeshed's stub
            (watched, self.sentinel),
        )
        with open(writer, "wb", closefd=True) as pipe:
            pipe.write(buffer.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _WorkerProcess(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # multiprocessing calls it by this name
        return _WorkerPopen(process_obj)


class _WorkerContext(context.ForkServerContext):
    Process = _WorkerProcess


# -- laying tensors out in a segment ------------------------------------------------------------
def _raw(datatype: str, data: np.ndarray) -> np.ndarray:
    """A tensor's wire bytes as a uint8 array (BYTES: the length-prefixed layout)."""
    raw = rawtensor.to_raw(datatype, data)
    return np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else raw


# A tensor to lay out: (name, datatype, shape, data, object place or None). Those with an
# object place are already there (inputs) or written there by the caller (outputs).
Laid = tuple[str, str, tuple[int, ...], np.ndarray, Place | None]


def _write(writer: SegmentWriter, tensors: list[Laid]) -> tuple[str, int, list[TensorSlot]]:
    """Copy the tensors without an object place into the writer's segment, back to back."""
    raws = [None if place else _raw(datatype, data) for _, datatype, _, data, place in tensors]
    offsets = []
    end = 0
    for raw in raws:
        offsets.append(end)
        if raw is not None:
            end = aligned(end + raw.nbytes)
    segment = writer.reserve(end)
    memory = np.frombuffer(segment.buffer, np.uint8)
    slots: list[TensorSlot] = []
    for (name, datatype, shape, data, place), raw, offset in zip(
        tensors, raws, offsets, strict=True
    ):
        if raw is None:
            slots.append((name, datatype, tuple(shape), 0, data.nbytes, place))
            continue
        if raw.nbytes < POOLED_COPY_BYTES:
            memory[offset : offset + raw.nbytes] = raw
        else:  # with the GIL released (large ones on the core's copy threads)
            copy_into(memory[offset : offset + raw.nbytes], np.ascontiguousarray(raw))
        slots.append((name, datatype, tuple(shape), offset, raw.nbytes, None))
    return segment.name, segment.size, slots


def _read(
    buffer: Any, slot: TensorSlot, model: str, objects: SharedObjects | None, *, copy: bool
) -> np.ndarray:
    """A tensor in a segment (or, in a worker, a client's object): a view, or (``copy``) a
    copy in a recycled pool buffer, made with the GIL released, that outlives the segment's
    next reuse."""
    name, datatype, shape, offset, nbytes, place = slot
    if place is not None and objects is not None:
        view = objects.window(place)[:nbytes].toreadonly()  # as the server's own views
    else:
        view = memoryview(buffer)[offset : offset + nbytes]
    if copy and datatype != "BYTES":
        if nbytes < POOLED_COPY_BYTES:
            view = memoryview(bytearray(view))  # quicker than handing the GIL to and fro
        else:
            view = np.asarray(POOL.gather([np.frombuffer(view, np.uint8)])).data
    return rawtensor.from_raw(datatype, shape, view, name, model)


# -- the server side ----------------------------------------------------------------------------
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
        # The loop's end of the worker's pipe (made by the first execute_later).
        self._pipe: LoopPipe | None = None
        self._unloading = False  # its pipes no longer hold back for slow clients
        # The instance (runtime.instance.InstanceLoop) whose batches this worker runs: its
        # model's calls to the server are made on that instance's behalf.
        self._caller: InstanceLoop | None = None
        try:
            self._start()
        except BaseException:
            self._inputs.close()
            self._cancel.close()
            raise

    def _start(self) -> None:
        context = _worker_context()
        ours, theirs = context.Pipe()
        output_prefix = f"{self._output_prefix}-{next(self._generations)}"
        process = context.Process(
            target=worker_main,
            args=(theirs, output_prefix, *self._start_args),
            name=f"tritonfast-instance:{self._instance_name}",
            daemon=True,
        )
        process.start()
        theirs.close()
        self._process, self._conn, self._pipe = process, ours, None
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
        if self._decoupled and not self.runs_elsewhere:
            self._relay = ResponseRelay(ours, self._instance_name, self._serve_call)

    def _serve_call(
        self, message: tuple[Any, ...], send: Callable[[tuple[Any, ...]], None]
    ) -> None:
        """Answer a call the worker's model made to the server (BLS, model control, a
        metric's value), on behalf of the instance whose batches the worker runs: while the
        call is in flight that instance counts as waiting on the server."""
        with calls_made_by(self._caller):
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
            pipe = self._pipe = LoopPipe(
                self._conn,
                loop,
                self._instance_name,
                self._cancel.buffer,
                self._serve_call,
                unbounded=self._unloading,
            )
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
        name, size, slots = _write(self._inputs, tensors)
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
                _read(segment.buffer, slot, self._model_name, None, copy=True),
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
        if left <= 0 and pipe is not None and pipe.busy():
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
            if self._relay is not None:
                self._relay.join(wait)
                self._relay = None
            if self._process is not None:
                _reap(self._process, wait)
                self._process = None
            remove_segments(self._output_prefix)


def _reap(process: multiprocessing.process.BaseProcess, wait: float) -> None:
    """Waits up to ``wait`` seconds for a worker to exit, kills it if it has not, and closes
    the process object: its sentinel and the pipe end the worker watches are descriptors, held
    until then (or until the object is collected, which an error's traceback can put off for
    as long as the error is kept), so a worker failing every restart would leak two a time."""
    process.join(wait)
    if process.is_alive():
        process.kill()
        process.join()
    process.close()


# -- auto-complete in a worker ------------------------------------------------------------------
def auto_complete_in_worker(model_file: Path, config: model_config_pb2.ModelConfig) -> None:
    """Import the model and run its ``auto_complete_config`` in a short-lived worker, and take
    the completed configuration back (in place): a model whose import or hook crashes its
    process fails its load, not the server."""
    context = _worker_context()
    ours, theirs = context.Pipe()
    process = context.Process(
        target=_auto_complete_main,
        args=(theirs, str(model_file), config.SerializeToString()),
        name=f"tritonfast-auto-complete:{config.name}",
        daemon=True,
    )
    process.start()
    theirs.close()
    try:
        reply = None
        while reply is None:
            if not ours.poll(START_TIMEOUT_S):
                raise InternalError(
                    f"model '{config.name}': importing model.py and completing its"
                    f" configuration took over {START_TIMEOUT_S:.0f} s"
                )
            message = ours.recv()
            if message[0] == "log":
                workerlog.emit(message)
            else:
                reply = message
    except (EOFError, OSError):
        process.join(5)  # the pipe closes a moment before the exit is reported
        raise InternalError(
            f"model '{config.name}': the worker process exited with code {process.exitcode}"
            " while it imported model.py and completed the model's configuration"
        ) from None
    finally:
        ours.close()
        _reap(process, FINALIZE_TIMEOUT_S)
    kind, payload = reply
    if kind == "error":
        raise error_for(Code(payload[0]), payload[1])
    config.CopyFrom(model_config_pb2.ModelConfig.FromString(payload))


def _as_tritons_stub() -> None:
    """What a model finds in its process, as in Triton's Python stub: SIGINT and SIGTERM are
    ignored, since the server decides when the model stops (Ctrl-C in a terminal, or a
    SIGTERM sent to the whole process group, reaches the workers too, and the server still
    has their models finalized), and ``sys.argv`` is ``['']`` rather than the server's
    command line (Triton's QA models run ``unittest.main`` in ``execute``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.argv = [""]


def _auto_complete_main(conn: Connection, model_file: str, config_bytes: bytes) -> None:
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


# -- the worker process -------------------------------------------------------------------------
def worker_main(
    conn: Connection,
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
    _Worker(
        pipe, in_batch, streams, instance, config.name, instance_name, output_prefix, metrics
    ).serve()


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
        self._in_batch = in_batch  # set while a batch runs (the server reads the pipe then)
        self._streams = streams
        self._instance = instance
        self._model_name = model_name
        self._instance_name = instance_name
        self._metrics = metrics  # the worker's custom metrics, sent with each reply
        self._inputs = SegmentReader()
        self._cancel_flags = SegmentReader()
        self._outputs = SegmentWriter(output_prefix)
        self._objects = SharedObjects()

    def serve(self) -> None:
        try:
            while True:
                message = self._pipe.next_work()
                if message[0] == "finalize":
                    self._finalize()
                    return
                self._run_batch(message)
        except EOFError:  # the server went away
            return
        finally:
            self._objects.close()
            self._outputs.close()
            self._inputs.close()
            self._cancel_flags.close()

    def _finalize(self) -> None:
        try:
            self._instance.finalize()
        except TritonError as exc:  # to the server's log, in one line
            logging.getLogger(workerlog.MODEL_LOGGER).error(
                "finalize failed for instance %s: %s", self._instance_name, exc.message
            )
        self._streams.send(("finalized",))

    def _run_batch(self, message: tuple[Any, ...]) -> None:
        _, name, size, described, flags_name, flags_size, tokens = message
        requests, failed = self._requests(name, size, described, flags_name, flags_size, tokens)
        self._in_batch.set()
        try:
            returned = (
                self._instance.execute(cast(list[InferRequest], requests), PhaseClock())
                if requests
                else []
            )
        finally:
            self._in_batch.clear()
        for request in requests:
            request.detach()  # the cancellation bytes now belong to the next batch
        release = _release_flags(requests, failed, len(described))
        if tokens is not None:
            self._end_streams(requests, returned, release)
        else:
            self._reply(requests, returned, failed, described, release)

    def _requests(
        self,
        name: str,
        size: int,
        described: list[tuple[Any, ...]],
        flags_name: str,
        flags_size: int,
        tokens: list[int] | None,
    ) -> tuple[list[_WorkerRequest], dict[int, TritonError]]:
        """The batch's requests, over its input segment; and, by position, those that failed
        already (a client's object it could not map)."""
        segment = self._inputs.map(name, size)
        flags = self._cancel_flags.map(flags_name, flags_size).buffer
        self._objects.start_batch()
        requests: list[_WorkerRequest] = []
        failed: dict[int, TritonError] = {}
        for index, d in enumerate(described):
            try:
                requests.append(
                    _request(
                        segment.buffer,
                        self._model_name,
                        d,
                        flags,
                        index,
                        self._objects,
                        copy=tokens is not None,
                    )
                )
            except TritonError as error:
                failed[index] = error
        if tokens is not None:
            for token, request in zip(tokens, requests, strict=True):
                request.sender = self._streams.sender(token, request)
        return requests, failed

    def _end_streams(
        self,
        requests: list[_WorkerRequest],
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
        requests: list[_WorkerRequest],
        returned: Sequence[Result | None] | None,
        failed: dict[int, TritonError],
        described: list[tuple[Any, ...]],
        release: list[int] | None,
    ) -> None:
        """A batch's results, written to the output segment and described to the server."""
        answers: list[Result | None] = (
            [None] * len(requests) if returned is None else list(returned)
        )
        results: list[Result | None] = [
            None  # rescheduled: it runs again, and answers then
            if result is None and request.release_flags & RELEASE_RESCHEDULE
            else _answer_of(request, result, self._instance_name)
            for request, result in zip(requests, answers, strict=True)
        ]
        for index in sorted(failed):
            results.insert(index, failed[index])
        places = [d[7] for d in described]
        reply = _describe_results(self._outputs, results, places, self._objects)
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

    def next_work(self) -> tuple[Any, ...]:
        """The next batch (or finalize); EOFError once the server is gone."""
        return self._take(self._work)

    def next_answer(self) -> tuple[Any, ...]:
        """The next answer to the server call under way; EOFError once the server is gone."""
        return self._take(self._answers)

    def _take(self, mine: collections.deque[tuple[Any, ...]]) -> tuple[Any, ...]:
        with self._changed:
            while not mine and self._reading and not self._gone:
                self._changed.wait()
            if mine:
                return mine.popleft()
            if self._gone:
                raise EOFError("the server went away")
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
                    continue
                theirs = self._answers if kind in workerbls.ANSWERS else self._work
                if theirs is mine:
                    return message
                with self._changed:
                    theirs.append(message)
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._reading = False
                self._changed.notify_all()


class _WorkerRequest(InferRequest):
    """A request in the worker: ``cancelled`` reads its byte of the cancellation segment; its
    ``sink``, made when first asked for (by the model's response sender), is the future the
    worker takes the one response of a request answered through its sender from."""

    __slots__ = ("_flags", "_index", "_sink")
    _flags: Any
    _index: int
    _sink: concurrent.futures.Future[Any] | None

    @property  # type: ignore[override]
    def sink(self) -> concurrent.futures.Future[Any]:
        sink = self._sink
        if sink is None:
            sink = self._sink = concurrent.futures.Future()
        return sink

    @sink.setter
    def sink(self, value: Any) -> None:
        self._sink = value

    @property  # type: ignore[override]
    def cancelled(self) -> bool:
        flags = self._flags  # None once its batch returned
        return flags is not None and bool(flags[self._index])

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        pass  # only the server raises the flag

    def detach(self) -> None:
        """Its batch returned: from now on only the server's cancel messages count."""
        self._flags = None


def _release_flags(
    requests: list[_WorkerRequest], failed: dict[int, TritonError], count: int
) -> list[int] | None:
    """The release flags the model set (pb_utils set_release_flags), in the batch's order;
    None when it set none."""
    if not any(request.release_flags for request in requests):
        return None
    flags = [0] * count
    positions = (index for index in range(count) if index not in failed)
    for index, request in zip(positions, requests, strict=False):
        flags[index] = request.release_flags
    return flags


def _answer_of(request: _WorkerRequest, result: Result | None, instance_name: str) -> Result:
    """A request's response: the one ``execute`` returned, or else the one the model sent
    through its response sender (waited for: the model may send it from a thread of its own,
    after ``execute`` returned)."""
    if result is not None:
        return result
    sink = request._sink
    if request.sender is None or sink is None:  # (a sink alone: is_cancelled() asked for one)
        return InternalError(
            f"model instance '{instance_name}' returned no response for request"
            f" '{request.id}' and did not use its response sender"
        )
    try:
        return cast(Result, sink.result())
    except TritonError as error:
        return error


def _request(
    buffer: Any,
    model: str,
    described: tuple[Any, ...],
    flags: Any,
    index: int,
    objects: SharedObjects,
    *,
    copy: bool,
) -> _WorkerRequest:
    """A request of the batch in ``buffer``; ``copy``: its inputs are copied out of the
    segment (a decoupled model's requests outlive their batch: threads or coroutines of the
    model may read them after ``execute`` returned, when the segment holds the next batch)."""
    model_name, model_version, request_id, parameters, output_names, slots, trace, _ = described
    request = _WorkerRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        trace=trace,
        inputs=[
            InputTensor(slot[0], slot[1], slot[2], _read(buffer, slot, model, objects, copy=copy))
            for slot in slots
        ],
        outputs=None if output_names is None else [RequestedOutput(n) for n in output_names],
        parameters=parameters,
    )
    request._flags = flags
    request._index = index
    return request


def _describe_results(
    writer: SegmentWriter,
    results: list[Result | None],
    places: list[dict[str, Place] | None],
    objects: SharedObjects,
) -> tuple[str, str, int, list[tuple[Any, ...]]]:
    """The reply to a batch: outputs with a place in a client's object written there, the
    others into the writer's segment. None: a rescheduled request (no response yet)."""
    laid: list[list[Laid]] = []
    for index, (result, placed) in enumerate(zip(results, places, strict=True)):
        if result is None or isinstance(result, TritonError):
            laid.append([])
            continue
        try:
            laid.append([_laid_output(t, placed, objects) for t in result.outputs])
        except TritonError as error:
            results[index] = error
            laid.append([])
    tensors = [tensor for outputs in laid for tensor in outputs]
    name, size, slots = _write(writer, tensors) if tensors else ("", 0, [])
    described: list[tuple[Any, ...]] = []
    position = 0
    for result in results:
        if result is None:
            described.append(("none",))
            continue
        if isinstance(result, TritonError):
            described.append(("error", result.code.value, result.message))
            continue
        count = len(result.outputs)
        described.append(
            (
                "ok",
                result.model_name,
                result.model_version,
                result.id,
                result.parameters,
                slots[position : position + count],
            )
        )
        position += count
    return "results", name, size, described


def _laid_output(
    tensor: OutputTensor, places: dict[str, Place] | None, objects: SharedObjects
) -> Laid:
    """An output to describe; one bound for a client's object is written there first."""
    place = places.get(tensor.name) if places is not None else None
    window = None
    if place is not None:
        # Changed since the server looked: the server writes it, as in-process.
        with contextlib.suppress(TritonError):
            window = objects.window(place)
    if place is None or window is None:
        return (tensor.name, tensor.datatype, tensor.shape, tensor.data, None)
    raw = _raw(tensor.datatype, tensor.data)
    SharedObjects.put(window, raw, tensor.name)
    return (tensor.name, tensor.datatype, tensor.shape, raw, place)
