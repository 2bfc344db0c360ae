"""The worker process's side of a Python model instance run in its own process
(:mod:`.process` is the server's): :func:`worker_main` imports and initializes the model,
then serves the batches the server sends, reading their inputs from the server's segment and
writing outputs into its own (:mod:`.segmentlayout`): over the core's channel (typed
messages, :class:`~tritonfast._core.LaneWorkerChannel`) when the server's core drives the
instance, else over the pipe;
:func:`auto_complete_main` runs a model's ``auto_complete_config``. The model's calls to the
server (BLS, model control, metric values) go over the same pipe (:mod:`.workerbls`), its
logs and a decoupled model's responses too (:mod:`.workerlog`, :mod:`.workerstream`)."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import pickle
import signal
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import orjson

from tritonfast._core import LaneWorkerChannel
from tritonfast._proto import model_config_pb2
from tritonfast.backends.base import PhaseClock
from tritonfast.backends.python import workerbls, workerlog
from tritonfast.backends.python.segmentlayout import Laid, raw_bytes, read_tensor, write_tensors
from tritonfast.backends.python.sharedobjects import Place, SharedObjects
from tritonfast.backends.python.workercalls import ChannelCalls
from tritonfast.backends.python.workerstream import WorkerStreams
from tritonfast.custommetrics import CustomMetrics, Labels, State
from tritonfast.data.types import (
    RELEASE_RESCHEDULE,
    InferRequest,
    InputTensor,
    OutputTensor,
    RequestedOutput,
)
from tritonfast.errors import InternalError, TritonError
from tritonfast.memory.shmsegment import SegmentReader, SegmentWriter
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


def _trace(token: int) -> workerbls.TraceToken | None:
    """A request's trace as the worker holds it (its token; 0: untraced)."""
    return workerbls.TraceToken(token) if token else None


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
    # The server's core drives the instance over the channel unless the model streams its
    # responses (see process.ProcessInstance.core_driven).
    channel = calls = None
    if not config.model_transaction_policy.decoupled:
        channel = LaneWorkerChannel(lane_conn.fileno())
        # The calls the model makes while a batch from the channel runs (see workercalls).
        server.direct = calls = ChannelCalls(channel)
    _Worker(
        pipe, in_batch, streams, instance, config.name, instance_name, output_prefix, metrics
    ).serve(channel, conn.fileno(), metrics_source, calls)


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

    def serve(
        self,
        channel: LaneWorkerChannel | None,
        pipe_fd: int,
        metrics_source: str,
        calls: ChannelCalls | None,
    ) -> None:
        """Runs batches until the server says finalize or goes away: from the core's
        ``channel`` when there is one (the pipe then brings only finalize), else from the
        pipe."""
        try:
            while True:
                if channel is not None:
                    try:
                        batch = channel.next(pipe_fd)
                    except ConnectionError:  # the core is done with this worker: the pipe
                        channel = None  # still brings finalize
                        continue
                    if batch is not None:
                        self._run_channel_batch(channel, batch, metrics_source, calls)
                        continue
                message = self._pipe.next_work()
                if message[0] == "finalize":
                    self._finalize()
                    return
                self._run_batch(message)
        except (EOFError, ConnectionError):  # the server went away
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
        flags = self._cancel_flags.map(flags_name, flags_size).buffer
        requests, failed = self._requests(name, size, described, flags, tokens)
        returned = self._execute(requests)
        release = _release_flags(requests, failed, len(described))
        if tokens is not None:
            self._end_streams(requests, returned, release)
        else:
            self._reply(requests, returned, failed, described, release)

    def _execute(self, requests: list[_WorkerRequest]) -> Sequence[Result | None] | None:
        """Run the model on a batch's requests (the server may be called meanwhile)."""
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
        return cast(Sequence[Result | None] | None, returned)

    def _run_channel_batch(
        self,
        channel: LaneWorkerChannel,
        batch: tuple[Any, ...],
        metrics_source: str,
        calls: ChannelCalls | None,
    ) -> None:
        """A batch from the core: its requests described in the channel's message, its reply
        written back there (parameters as JSON text, errors by code name)."""
        model, version, name, size, flags_name, flags_size, described = batch
        requests, failed = self._requests(
            name,
            size,
            [
                (model, version, i, orjson.loads(p) if p else {}, o, s, _trace(t), places)
                for i, p, o, s, places, t in described
            ],
            self._cancel_flags.map(flags_name, flags_size).buffer,
            None,
        )
        if calls is not None:
            calls.open()
        try:
            returned = self._execute(requests)
        finally:
            if calls is not None:
                calls.close()  # (waits for a call still in flight: its answer comes first)
        answers: list[Result | None] = (
            [None] * len(requests) if returned is None else list(returned)
        )
        results: list[Result | None] = [
            _no_reschedule(request, self._instance_name)
            if request.release_flags & RELEASE_RESCHEDULE
            else _answer_of(request, result, self._instance_name)
            for request, result in zip(requests, answers, strict=True)
        ]
        for index in sorted(failed):
            results.insert(index, failed[index])
        _, out_name, out_size, laid = _describe_results(
            self._outputs, results, [d[4] for d in described], self._objects
        )
        state = self._metrics.state_if_changed()
        channel.reply(
            out_name,
            out_size,
            [_channel_result(entry) for entry in laid],
            b"" if state is None else pickle.dumps((metrics_source, state)),
        )

    def _requests(
        self,
        name: str,
        size: int,
        described: list[tuple[Any, ...]],
        flags: Any,
        tokens: list[int] | None,
    ) -> tuple[list[_WorkerRequest], dict[int, TritonError]]:
        """The batch's requests, over its input segment; and, by position, those that failed
        already (a client's object it could not map). ``flags``: the batch's cancellation
        bytes (None: its requests are never seen cancelled)."""
        segment = self._inputs.map(name, size)
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


def _no_reschedule(request: _WorkerRequest, instance_name: str) -> TritonError:
    """A request the model rescheduled, though the core drives only models that cannot be
    (no iterative sequence): it ends with Triton's error."""
    return InternalError(
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model"
        f" instance '{instance_name}' does not support rescheduling: it takes"
        " sequence_batching { iterative_sequence: true }"
    )


def _channel_result(described: tuple[Any, ...]) -> tuple[Any, ...]:
    """A result of :func:`_describe_results` as the core's channel carries it."""
    if described[0] == "ok":
        _, model_name, model_version, response_id, parameters, slots = described
        text = orjson.dumps(parameters, default=str).decode() if parameters else ""
        return ("ok", model_name, str(model_version), response_id or "", text, slots)
    if described[0] == "error":
        return described
    return ("error", "INTERNAL", "a request that is not decoupled was rescheduled")


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
            InputTensor(
                slot[0], slot[1], slot[2], read_tensor(buffer, slot, model, objects, copy=copy)
            )
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
    name, size, slots = write_tensors(writer, tensors) if tensors else ("", 0, [])
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
    raw = raw_bytes(tensor.datatype, tensor.data)
    SharedObjects.put(window, raw, tensor.name)
    return (tensor.name, tensor.datatype, tensor.shape, raw, place)
