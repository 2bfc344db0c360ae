"""Type stubs for ``tritonfast._core``, the Rust core (built from ``rust/src/py``)."""

from collections.abc import Callable, Sequence
from typing import Any, Literal, final

from typing_extensions import Self

# Exactly the names the extension registers (its runtime ``__all__``), sorted.
__all__ = [
    "QUEUE_FULL_MESSAGE",
    "Batch",
    "CallReplies",
    "EnsembleLane",
    "EnsembleRun",
    "EventWriter",
    "Handoff",
    "HandoffDone",
    "InferSignature",
    "Inflater",
    "Lane",
    "LaneCompletions",
    "LaneRegistry",
    "LaneTicket",
    "LaneWorkerChannel",
    "LaneWorkerLink",
    "LoadRun",
    "OutStream",
    "Outbox",
    "OwnedBytes",
    "PooledBuffer",
    "QueuePolicy",
    "RegionView",
    "RequestQueue",
    "RequestReplies",
    "SequenceBatcher",
    "SequenceTicket",
    "SharedMemoryRegistry",
    "TensorPool",
    "Ticket",
    "__version__",
    "copy_into",
    "grpc_model",
    "json_error",
    "json_input_data",
    "json_numbers",
    "length_delimited_prefix",
    "split_message_field",
]
__version__: str

#: Triton's message for a push to a full priority level (raised as ``UnavailableError``).
QUEUE_FULL_MESSAGE: str

@final
class QueuePolicy:
    """One priority level's queue policy (Triton's ``ModelQueuePolicy``).

    ``default_timeout_us == 0`` means requests never time out; with
    ``allow_timeout_override`` a request may ask for a *shorter* non-zero timeout (as in Triton,
    never a longer one, nor one when the default is 0). ``max_queue_size == 0`` is unlimited.
    """

    def __new__(
        cls,
        timeout_action: Literal["REJECT", "DELAY"] = "REJECT",
        default_timeout_us: int = 0,
        allow_timeout_override: bool = False,
        max_queue_size: int = 0,
    ) -> Self: ...
    @property
    def timeout_action(self) -> Literal["REJECT", "DELAY"]: ...
    @property
    def default_timeout_us(self) -> int: ...
    @property
    def allow_timeout_override(self) -> bool: ...
    @property
    def max_queue_size(self) -> int: ...

@final
class Ticket:
    """The handle of a request pushed with :meth:`RequestQueue.push_cancellable`."""

    @property
    def status(self) -> Literal["QUEUED", "TAKEN", "CANCELLED", "REJECTED"]: ...

@final
class Batch:
    """What one :meth:`RequestQueue.pop` returned.

    ``items`` is a batch to run (in priority, then arrival order); ``rejected`` holds items
    whose queue timeout expired under the REJECT action, to be answered with Triton's
    "Request timeout expired". Never both at once; both empty when the wait timed out.
    ``len(batch)`` is ``len(batch.items)``.
    """

    @property
    def items(self) -> list[Any]: ...
    @property
    def rejected(self) -> tuple[Any, ...]: ...
    @property
    def expired(self) -> bool:
        """A :class:`SequenceBatcher` batch whose ``rejected`` are the requests of backlog
        sequences whose timeout expired (not of cancelled sequences)."""
    @property
    def seq(self) -> int:
        """0, 1, 2, ... in the order batches left the queue (for ordered completion)."""
    @property
    def slots(self) -> tuple[int, ...] | None:
        """A :class:`SequenceBatcher` batch's slot per item (``None`` items are null entries,
        not counted by :meth:`report`); ``None`` for a queue's batch."""

    def report(
        self,
        results: Sequence[object],
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """Record the batch's execution in the queue's statistics, once.

        ``results`` has one entry per item; an exception instance marks a failed request.
        Raises ``ValueError`` for a length mismatch or a second report.
        """

    def __len__(self) -> int: ...

@final
class RequestQueue:
    """A per-model request queue: priority levels, queue policies, cancellation, dynamic
    batching and statistics.

    With ``max_batch_size == 0`` batching is off and every batch is one item. Otherwise a batch
    takes items in candidate order (priority level 1 first, FIFO within a level), never
    splitting one and only joining items of equal ``shape_key``, while the sum of their batch
    sizes stays within ``max_batch_size``; it leaves at a preferred size, when full, or
    ``max_queue_delay_us`` after its oldest item was enqueued. Several threads may call
    :meth:`pop` at once; each item goes to exactly one of them.

    ``priority_levels == 0`` gives a single level under ``default_queue_policy``; otherwise
    priorities run from 1 (highest) to ``priority_levels``, a push with priority 0 (or above
    ``priority_levels``) goes to ``default_priority_level``, and ``priority_queue_policy``
    overrides the policy of given levels.

    With ``share_statistics_with=other``, the new queue records into ``other``'s statistics
    instead of its own: several queues (one per model instance, each fed by a scheduler that
    routes requests to its instance) then keep one set of statistics for the model version, and
    :meth:`statistics` and :meth:`latency_summaries` of any of them return the combined numbers.
    Only the statistics are shared: items, ``len()``, size limits and ``close()`` stay each
    queue's own. ``latency_summaries`` must match ``other``'s (``InvalidArgumentError``
    otherwise).

    Errors are raised as :mod:`tritonfast.errors` exceptions (``InvalidArgumentError`` for a bad
    batch size or configuration, ``UnavailableError`` for a push after :meth:`close` or to a full
    level).
    """

    def __new__(
        cls,
        max_batch_size: int = 0,
        max_queue_delay_us: int = 0,
        preferred_batch_sizes: list[int] = ...,
        *,
        priority_levels: int = 0,
        default_priority_level: int = 0,
        default_queue_policy: QueuePolicy | None = None,
        priority_queue_policy: dict[int, QueuePolicy] | None = None,
        latency_summaries: bool = False,
        share_statistics_with: RequestQueue | None = None,
    ) -> Self: ...
    def push(
        self,
        item: object,
        batch_size: int = 1,
        priority: int = 0,
        timeout_us: int = 0,
        shape_key: int = 0,
    ) -> None:
        """Enqueue ``item`` (never blocks).

        ``shape_key`` (0 to 2**64 - 1): items batch together only when their keys are equal.
        ``timeout_us``: the request's queue timeout, honoured as the level's policy allows.
        """

    def push_cancellable(
        self,
        item: object,
        batch_size: int = 1,
        priority: int = 0,
        timeout_us: int = 0,
        shape_key: int = 0,
    ) -> Ticket:
        """Like :meth:`push`, returning a :class:`Ticket` for :meth:`cancel`."""

    def cancel(self, ticket: Ticket) -> bool:
        """Remove a still-queued item so it is never handed out (never blocks).

        True if it was removed; False if it was already handed out, rejected or cancelled.
        """

    def pop(self, timeout_us: int) -> Batch | None:
        """Wait up to ``timeout_us`` microseconds, with the GIL released, for work.

        Returns a :class:`Batch` (empty on timeout), or ``None`` once the queue is closed and
        drained. ``timeout_us=0`` polls: it returns a batch only if one may leave right now.
        Once this call holds an item, the batch leaves by the batching rules (at the latest
        ``max_queue_delay_us`` after its oldest item was enqueued), even past ``timeout_us``.
        """

    def pop_or_hand_off(self, timeout_us: int, handoff: Handoff, instance: int) -> Batch | None:
        """Like :meth:`pop`, for instance ``instance`` of a model whose batches may run on the
        event loop: while ``handoff`` is on, each batch is offered to it and the calling thread
        waits (GIL released) until the loop has run it, then takes the next. Returns what the
        caller must handle itself: a batch to run (handoff off) or rejections, an empty batch
        once ``timeout_us`` has passed, ``None`` once closed and drained."""

    def close(self) -> None:
        """Reject further pushes and wake every waiter; queued items are still handed out."""

    def abandon(self) -> list[Any]:
        """Close, and return every item still queued (each counted as a failure), for the
        caller to answer."""

    @property
    def closed(self) -> bool: ...
    def statistics(self) -> dict[str, Any]:
        """The model version's statistics (layout: ``tritonfast.runtime.scheduler``), combined
        over every queue that shares them."""

    def __len__(self) -> int: ...
    def latency_summaries(
        self, quantiles: list[float]
    ) -> dict[str, tuple[int, int, list[tuple[float, float]]]] | None:
        """Latency summaries (µs) per duration, when the queue keeps them (combined over every
        queue that shares its statistics)."""

@final
class PooledBuffer:
    """Bytes on loan from a :class:`TensorPool`; ``numpy.asarray(buffer)`` views them as
    ``uint8`` without a copy, and they return to the pool when the last view dies."""

    @property
    def nbytes(self) -> int: ...
    @property
    def offset(self) -> int | None:
        """Where the buffer starts in its pool's shared segment (None for heap buffers)."""
    @property
    def object(self) -> tuple[str, int, int] | None:
        """The shared-memory object the buffer is, ``(path, device, inode)``, for a pool made
        with ``objects``; None otherwise."""
    def reserve(self, nbytes: int) -> None:
        """Take the memory of an object buffer's first ``nbytes`` bytes now, so that writing
        them cannot fail (raises UnavailableError when shared memory has no room)."""
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    def __len__(self) -> int: ...

@final
class InferSignature:
    """A model's inputs and outputs, mirrored from its configuration when it loads, which the
    core checks decoded requests against (with Triton's messages)."""

    def __new__(
        cls,
        model: str,
        max_batch_size: int,
        inputs: Sequence[tuple[str, str, Sequence[int], bool]],
        outputs: Sequence[str],
    ) -> Self:
        """``inputs``: ``(name, datatype, dims, optional)`` each (the datatype's wire name,
        the dimensions without the batch dimension)."""

    def decode_http(
        self, body: bytes, json_length: int
    ) -> (
        tuple[
            str,
            list[tuple[str, str, tuple[int, ...], bytes]],
            list[tuple[str, bool]] | None,
            bool,
            int | None,
            int | None,
            int,
        ]
        | None
    ):
        """An HTTP inference request body (its JSON header ``json_length`` bytes long) decoded
        and checked without the GIL: ``(id, inputs, outputs, binary_default, priority,
        timeout, batch_size)``, inputs as ``(name, datatype, shape, raw bytes)`` and outputs as
        ``(name, binary)`` (None: every output); None when the request is not one the core
        takes on (the reference path decides). Raises Triton's error for a request its model
        refuses."""

@final
class LaneCompletions:
    """Which HTTP requests the core answered by itself (one per server): an ``eventfd`` to
    watch, and the answered requests' tokens."""

    def __new__(cls) -> Self: ...
    def fileno(self) -> int:
        """The descriptor to watch for readability."""

    def take(self) -> list[int]:
        """The tokens of the requests answered since the last call."""

@final
class LaneRegistry:
    """The lanes of a server's models, by name and version, for the calls its models make."""

    def __new__(cls) -> Self: ...
    def set(self, model: str, versions: dict[str, Lane], default: str) -> None:
        """``model``'s lanes from now on and its default version; none: calls to it go
        through Python."""

@final
class LaneWorkerLink:
    """The server's end of one worker's channel from the core, and the segments its batches
    travel in."""

    def __new__(cls, fd: int, tag: str, died_message: str | None = None) -> Self:
        """``fd``: the server's end of the channel (duplicated); the segments of its batches
        carry ``tag`` in their names; ``died_message``: what a decoupled request's stream ends
        with when the worker goes away first."""
    @staticmethod
    def in_process(
        runner: Callable[[tuple[Any, ...]], tuple[str, int, bytes, list[tuple[Any, ...]]]],
        tag: str,
    ) -> LaneWorkerLink:
        """An instance in this process: ``runner(batch)`` runs each batch (on the driver
        thread, with the GIL) and returns ``(segment, segment_len, data, results)``, as a
        worker replies; an exception it raises fails the batch with INTERNAL and its text."""

@final
class LaneWorkerChannel:
    """The worker's end of its channel from the core."""

    def __new__(cls, fd: int) -> Self: ...
    def next(
        self, pipe_fd: int
    ) -> (
        tuple[
            str,
            str,
            str,
            int,
            str,
            int,
            list[
                tuple[
                    str,
                    str,
                    list[str] | None,
                    list[tuple[str, str, tuple[int, ...], int, int, Any]],
                    dict[str, tuple[str, int, int, int, int]] | None,
                    int,
                    int,
                ]
            ],
        ]
        | None
    ):
        """Waits (GIL released) for the next batch: ``(model_name, model_version, segment,
        segment_len, cancel_segment, cancel_len, requests)``, each request ``(id,
        parameters_json, output_names, slots, output_places, trace, stream)`` (``stream``: a
        decoupled request's token, else 0); None when ``pipe_fd`` became readable first."""

    def call(
        self,
        model_name: str,
        model_version: str,
        request_id: str,
        parameters: str,
        priority: int,
        timeout_us: int,
        outputs: list[str] | None,
        inputs: list[tuple[str, str, list[int], Any]],
    ) -> tuple[Any, ...]:
        """A call to another model over the channel, its answer awaited (GIL released):
        ``("ok", model_name, model_version, id, parameters_json, [(name, datatype, shape,
        bytes)])``, ``("not_run" | "error", code, message)`` or ``("reroute",)``."""

    def stream(self, items: list[tuple[int, tuple[Any, ...] | None, bool]]) -> None:
        """Sends a decoupled model's responses, ``[(token, described, final)]``:
        ``("ok", model_name, model_version, id, parameters_json, [(name, datatype, shape,
        data)])``, ``("error", code, message)`` or None (a bare final flag); from any thread."""

    def reply(
        self, segment: str, segment_len: int, data: bytes, results: list[Any], extra: bytes
    ) -> None:
        """Sends a batch's reply: ``("ok", model_name, model_version, id, parameters_json,
        slots)``, ``("error", code, message)`` or ``("streamed",)`` per request; the slots'
        offsets are in ``segment``, or, with none, in ``data``."""

@final
class LaneTicket:
    """A request queued in a :class:`Lane`, for :meth:`Lane.cancel`."""

@final
class Lane:
    """A model version's request path in the core: its queue, its batches run on its
    workers by driver threads, HTTP answers written by the core."""

    def __new__(
        cls,
        signature: InferSignature,
        model_version: str,
        queue: RequestQueue | SequenceBatcher,
        completions: LaneCompletions,
        deliver: Any,
        *,
        dynamic: bool,
        keyed_inputs: list[str],
        keyed_by_names: bool,
        instances: int = 0,
        registry: LaneRegistry | None = None,
        controls: tuple[
            list[tuple[str, str, str, bytes, bytes]],
            tuple[str, str] | None,
            bool,
            list[tuple[str, str, str, list[int], bytes]],
        ]
        | None = None,
        regions: SharedMemoryRegistry | None = None,
        streamed: Callable[[list[tuple[Any, tuple[Any, ...] | None, bool]]], None] | None = None,
        cancel_stream: Callable[[int, int], None] | None = None,
    ) -> Self:
        """``queue``: a queue with the rules to follow (its configuration is copied), or a
        sequence batcher and its requests' ``controls`` (flags as name, kind, datatype, false
        and true bytes; CORRID as name and datatype; whether the model batches; implicit
        states as input and output names, datatype, initial shape and bytes);
        ``deliver(items, extra, marks)`` answers requests submitted from Python; ``regions``:
        the system shared-memory regions its requests may name (without, such requests take
        the reference path); ``streamed(items)``: a decoupled model's lane, whose responses
        are handed over as its workers send them, ``[(sink, result, final)]``, and
        ``cancel_stream(instance, token)`` tells a worker that an open stream's consumer went
        away."""

    def submit_http(
        self,
        body: Any,
        json_length: int,
        stream: OutStream,
        minor: int,
        keep_alive: bool,
        token: int,
        body_object: tuple[str, int, int] | None = None,
    ) -> LaneTicket | None:
        """An HTTP request (its body ``bytes`` or a C-contiguous uint8 array) queued (a
        ``LaneTicket``); None for the reference path; raises Triton's error for a refused
        one. ``body_object``: the shared-memory object ``(path, device, inode)`` the body was
        received into (``PooledBuffer.object``), where the worker reads its large inputs."""

    def submit_grpc(
        self,
        message: bytes,
        sink: Any,
        stream: bool = False,
        replies: RequestReplies | None = None,
    ) -> LaneTicket | None:
        """A gRPC ``ModelInferRequest`` as received, queued (a ``LaneTicket``); its reply,
        serialized (``stream``: as a stream's ``ModelStreamInferResponse``), goes to
        ``deliver`` with ``sink``, or, with ``replies``, a decoupled model's replies are
        queued on the stream's call by the core (``deliver`` hears of the end, of replies
        it must encode, and of the call to start sending on: a response None that is not
        the last); None for the reference path."""

    def submit_generate_http(
        self, body: Any, stream: OutStream, minor: int, keep_alive: bool, token: int
    ) -> LaneTicket | None:
        """A ``generate`` body (bytes, or a C-contiguous numpy array of bytes), decoded,
        checked and queued without the GIL, for a model neither decoupled nor with sequences;
        its answer (the generate extension's JSON) is written on ``stream`` and ``token``
        handed to the completions. None when the reference path must take it; raises
        Triton's error for a refused one."""

    def submit_generate_events(self, body: Any, stream: OutStream, token: int) -> LaneTicket | None:
        """A ``generate_stream`` body the connection hands over whole, for a decoupled model:
        decoded, checked and queued without the GIL, its answer written on ``stream``
        (keep-alive HTTP/1.1) by the core alone, ``token`` handed to the completions once it
        is. None when the reference path must take it; raises Triton's error for a refused
        one."""

    def submit(
        self,
        request_id: str,
        inputs: list[tuple[str, str, list[int], Any, tuple[str, int, int, int, int] | None]],
        outputs: list[str] | None,
        output_places: list[tuple[str, tuple[str, int, int, int, int]]] | None,
        parameters: str,
        priority: int,
        timeout_us: int,
        batch_size: int,
        sink: Any,
        trace: int = 0,
        sequence: tuple[int | str, bool, bool] | None = None,
        events: EventWriter | None = None,
    ) -> LaneTicket:
        """A request decoded and checked by Python, answered through ``deliver``;
        ``sequence``: its correlation ID and START and END flags; ``events``: a
        ``generate_stream`` request's writer, which writes a decoupled model's responses as
        events (``deliver`` then gets only the end, unless the writer declines)."""

    def cancel(self, ticket: LaneTicket) -> bool:
        """Removes a queued request (True), or flags a running one, or has the worker of an
        open stream told (``cancel_stream``)."""

    def end_streams(self, code: str, message: str) -> None:
        """Ends every open stream with the error."""

    @property
    def decoupled(self) -> bool: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def drive(self, instance: int, link: LaneWorkerLink) -> str:
        """Runs the instance's batches until ``"closed"`` or ``"died"`` (GIL released)."""

    def running(self, instance: int) -> bool:
        """Whether the instance runs a batch now."""

    def calling(self, instance: int, began: bool) -> None:
        """A call the instance's model made through Python began or ended."""

    def stuck(self) -> bool:
        """Whether every instance runs a batch that waits on a call to the server."""

    def fail_held(self, instance: int, code: str, message: str) -> None: ...
    def fail_next(
        self, instance: int, code: str, message: str, timeout_s: float
    ) -> bool | None: ...
    def abandon(self, code: str, message: str) -> None: ...
    def statistics(self) -> dict[str, Any]: ...
    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None: ...
    def __len__(self) -> int: ...

@final
class EnsembleRun:
    """A request running through an ``EnsembleLane``."""

@final
class EnsembleLane:
    """An ensemble version whose steps all run on lanes: the core runs its requests whole."""

    def __new__(
        cls,
        signature: InferSignature,
        model_version: str,
        outputs: list[str],
        steps: list[tuple[str, str, list[tuple[str, str]], list[tuple[str, str]]]],
        registry: LaneRegistry,
    ) -> Self:
        """``outputs``: the ensemble's outputs in its configuration's order; ``steps``: each
        step's model and version ("": its default), (model input, ensemble tensor) and (model
        output, ensemble tensor) pairs; their lanes found in ``registry`` as requests start."""

    def counts(self) -> dict[str, Any]:
        """What the requests it ran came to: ``success``/``fail`` as ``(count, ns)``,
        ``inferences``, ``last_ms``, ``queue_ns``, ``compute_input_ns``,
        ``compute_infer_ns``, ``compute_output_ns``."""

    def submit_http(
        self,
        body: Any,
        json_length: int,
        stream: OutStream,
        minor: int,
        keep_alive: bool,
        token: int,
        body_object: tuple[str, int, int] | None = None,
    ) -> EnsembleRun | None:
        """As ``Lane.submit_http``; None when the reference path must take the request."""

    def submit_generate_http(
        self, body: Any, stream: OutStream, minor: int, keep_alive: bool, token: int
    ) -> EnsembleRun | None:
        """None: an ensemble's ``generate`` requests take the reference path."""

    def submit_generate_events(
        self, body: Any, stream: OutStream, token: int
    ) -> EnsembleRun | None:
        """None: an ensemble's ``generate_stream`` requests take the reference path."""

    def submit_grpc(self, message: bytes, sink: Any) -> EnsembleRun | None:
        """As ``Lane.submit_grpc``: the reply goes to the ``deliver`` of the lane whose step
        finishes the request."""

    def cancel(self, run: EnsembleRun) -> bool:
        """Stops the run's queued steps: True when it will not be answered."""

@final
class Inflater:
    """One compressed body (gzip or zlib framing, told from its first bytes as zlib does with
    ``windowBits = 15 + 32``), inflated step by step with the GIL released. The body's bytes
    (a C-contiguous numpy array) are copied when it is made."""

    def __new__(cls, body: Any) -> Self: ...
    def step(self, max_out: int) -> int:
        """Inflate up to ``max_out`` more bytes; returns the total inflated so far."""
    @property
    def state(self) -> str:
        """``"running"`` (step again), ``"ended"``, ``"truncated"`` (the input stopped early:
        what inflated is the body), ``"corrupt"``, or ``"taken"`` after :meth:`take`."""
    def take(self) -> OwnedBytes:
        """The inflated bytes (once)."""

@final
class LoadRun:
    """A running load against one server (``tritonfast perf``): requests sent from the core's
    own event-loop threads, without the GIL. ``protocol`` is ``"http"`` (each payload a whole
    HTTP/1.1 request) or ``"grpc"`` (each payload a serialized message for ``path``); exactly
    one of ``concurrency`` and ``rate`` (requests per second) is given; ``"grpc-stream"``
    sends ``ModelStreamInfer`` requests, one stream per context (``decoupled``: a request is
    complete at its ``triton_final_response``). ``scripts``: the payloads' order, one list of
    indices per context (an open loop takes turns over them; ``serial``: only over those whose
    last request is answered). Raises ``ConnectionError`` when the server cannot be reached."""

    def __new__(
        cls,
        protocol: str,
        address: str,
        payloads: list[bytes],
        *,
        path: str = ...,
        threads: int = 1,
        connections_per_thread: int = 1,
        concurrency: int | None = None,
        rate: float | None = None,
        poisson: bool = False,
        seed: int = 0,
        scripts: list[list[int]] = ...,
        decoupled: bool = False,
        serial: bool = False,
    ) -> Self: ...
    def now(self) -> int:
        """Nanoseconds since the load began, on the records' clock."""
    def take(self) -> bytes:
        """The requests answered since the last call: seven little-endian u64 each (start,
        sent, first byte or response, end in ns on the load's clock; 1 if the server answered
        success; the responses; the payload's index)."""
    def counts(self) -> tuple[int, int]:
        """``(succeeded, failed)`` so far."""
    def errors(self) -> list[str]:
        """The distinct texts of the first failures (at most 16)."""
    def stop(self) -> None:
        """Send nothing more; wait for what is in flight (at most 10 s)."""

@final
class OwnedBytes:
    """Bytes the core made (an inflated body, parsed numbers); ``numpy.asarray(buffer)`` is a
    writable ``uint8`` view of them, valid while any such array lives."""

    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    def __len__(self) -> int: ...

@final
class TensorPool:
    """Recycled buffers in power-of-two size classes (at least 256 bytes, 64-byte aligned).

    With ``segment`` (a POSIX shared-memory name) and ``segment_bytes``, the buffers are ranges
    of that new segment, which another process can map by name and read at ``offset``. With
    ``objects`` (a POSIX name prefix), each buffer is a shared-memory object of its own
    (``PooledBuffer.object``), idle ones kept up to ``idle_bytes`` in all.
    """

    def __new__(
        cls,
        max_free_per_class: int = 4,
        segment: str | None = None,
        segment_bytes: int = 0,
        objects: str | None = None,
        idle_bytes: int = ...,
    ) -> Self: ...
    @property
    def segment(self) -> str | None: ...
    def gather(self, arrays: list[Any]) -> PooledBuffer:
        """The bytes of C-contiguous numpy ``arrays`` back to back in one pooled buffer,
        copied with the GIL released."""
    def acquire(self, nbytes: int) -> PooledBuffer: ...
    def statistics(self) -> dict[str, int]:
        """``allocated``, ``reused``, ``bytes_gathered`` (cumulative) and ``idle_buffers``."""

@final
class RegionView:
    """A window of a registered shared-memory region; ``numpy.asarray(view)`` is a ``uint8``
    view of it (read-only unless made writable), valid while any such array lives."""

    @property
    def nbytes(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    def __len__(self) -> int: ...
    def write(self, array: Any) -> None:
        """Copy a C-contiguous array's bytes to the start of this (writable) window."""

@final
class SharedMemoryRegistry:
    """Clients' system shared-memory regions, by name (Triton's shared-memory extension)."""

    def __new__(cls) -> Self: ...
    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the POSIX object ``key`` as ``name``."""
    def unregister(self, name: str) -> bool: ...
    def unregister_all(self) -> int: ...
    def status(self, name: str | None = None) -> list[dict[str, Any]]: ...
    def view(
        self, name: str, offset: int, byte_size: int, writable: bool = False
    ) -> RegionView: ...
    def object_of(self, name: str) -> tuple[str, int, int, int] | None:
        """``(key, offset, device, inode)``: the object region ``name`` maps, identified as
        the server opened it, and where the region starts in it."""

def copy_into(destination: Any, source: Any) -> None:
    """Copy the bytes of ``source`` to the start of ``destination`` (C-contiguous numpy
    arrays, the destination writable and at least as large), with the GIL released: large
    copies on the core's copy threads. Overlapping arrays are moved as by ``memmove``."""

def json_error(document: Any) -> tuple[int, str | None]:
    """``(offset, message)`` of the first error RapidJSON (Triton's parser) would report in
    ``document`` (a C-contiguous numpy array of its bytes, read in place), in its words;
    ``(end, None)`` where a valid document ends. Runs without the GIL."""

def json_input_data(document: Any) -> list[tuple[int, int, int]]:
    """``(k, start, end)``: where each ``inputs[k].data`` array lies in ``document`` (a
    C-contiguous numpy array of a document :func:`json_error` accepted, cut at its end).
    Inputs whose member names are ambiguous (escapes, ``data`` twice) are left out. Runs
    without the GIL."""

def grpc_model(message: bytes) -> tuple[str, str] | None:
    """The model name and version a serialized ``ModelInferRequest`` names; None when the
    core cannot read it."""

def json_numbers(document: Any, start: int, end: int, kind: str) -> OwnedBytes | None:
    """The numbers of the JSON array at ``document[start:end]``, flattened, as 8-byte values of
    ``kind`` (``"f64"``, ``"i64"`` or ``"u64"``); None when an element is not a number of that
    kind. Runs without the GIL."""

def split_message_field(message: bytes, field: int) -> tuple[bytes, list[tuple[int, int]]]:
    """``message`` (protobuf) without its length-delimited occurrences of ``field``, and the
    ``(start, end)`` ranges of those payloads in ``message``."""

def length_delimited_prefix(field: int, length: int) -> bytes:
    """The key and length that precede ``length`` payload bytes of ``field`` on the wire."""

@final
class Handoff:
    """Batches that instance threads formed and the event loop runs (switched off when
    created). Watch :meth:`fileno` for readability, then call :meth:`take`."""

    def __new__(cls, queue: RequestQueue) -> Self: ...
    def fileno(self) -> int: ...
    enabled: bool
    def close(self) -> None:
        """Switch offers off for good (``enabled = True`` no longer switches them on)."""

    def take(self) -> list[tuple[int, Batch, HandoffDone]]:
        """The offered batches, oldest first: (instance index, batch, done). Call
        ``done.complete()`` once the batch has run (dropping ``done`` does the same)."""

@final
class HandoffDone:
    def complete(self) -> None: ...

@final
class Outbox:
    """A thread of the core's that sends HTTP answers, so the event loop spends no time in
    ``send``."""

    def __new__(cls) -> Self: ...
    def open(self, fileno: int) -> OutStream:
        """A stream over a duplicate of the connected socket ``fileno`` (still the caller's)."""

    def finish(self, timeout_s: float) -> None:
        """End the thread once everything written is sent, or after ``timeout_s`` at the
        latest (the GIL is released meanwhile)."""

@final
class OutStream:
    """One connection's outgoing bytes, sent in the order written. The socket stays open
    until the stream is closed and has sent everything, even if the caller closes its own
    descriptor first."""

    def write(self, data: bytes) -> None:
        """Queue ``data``; ``ConnectionError`` once closed or the peer is gone."""

    def write_now(self, data: bytes) -> None:
        """Send ``data`` on this thread if nothing written before it waits (the rest is
        queued); else queue it like :meth:`write`."""

    def close(self) -> None:
        """Let go of the socket once everything written is sent."""

    def abort(self) -> None:
        """Drop what is unsent and let go of the socket."""

    @property
    def unsent(self) -> int:
        """Bytes written and not yet handed to the kernel."""

@final
class CallReplies:
    """A gRPC stream call's serialized replies in the order queued, full at ``ahead``: the
    core's reader threads queue a decoupled model's replies here without the GIL."""

    def __new__(cls, ahead: int) -> CallReplies: ...
    def push(self, reply: bytes) -> bool | None:
        """Queue ``reply``: True when the call was idle (the caller starts sending, with
        ``next()``), False when a send in flight takes it on, None when the call is over."""

    def next(self) -> tuple[bytes, int] | None:
        """The next reply to send and how many wait behind it; None once none is queued (the
        call is idle from then on) or the call is over."""

    def end(self) -> None:
        """Nothing more is sent: what is queued, and whatever comes, is dropped."""

    @property
    def over(self) -> bool: ...
    @property
    def sending(self) -> bool:
        """Whether a send is in flight (or about to be started)."""

    def full(self) -> bool: ...

@final
class RequestReplies:
    """One request's replies on its call's queue (handed to ``Lane.submit_grpc``)."""

    def __new__(cls, call: CallReplies) -> RequestReplies: ...
    @property
    def first_at(self) -> int:
        """When the core queued the request's first reply (``time.perf_counter_ns()``); 0
        before."""

@final
class EventWriter:
    """A ``generate_stream`` request's Server-Sent Events, written by the core on its
    connection's writer stream as a decoupled model's responses come: the answer's head with
    the first event, then one chunk per event (the caller writes the body's last chunk). A
    first response that is an error, or a stream with no response, is declined: the caller
    gets it, and every later response, as usual."""

    def __new__(cls, stream: OutStream) -> EventWriter: ...
    @property
    def started(self) -> bool:
        """Whether the answer's head and first event were written."""

    @property
    def first_at(self) -> int:
        """When the first event was written (``time.perf_counter_ns()``); 0 before."""

@final
class SequenceTicket:
    """The handle of a request pushed with :meth:`SequenceBatcher.push`."""

    @property
    def status(self) -> Literal["QUEUED", "TAKEN", "CANCELLED"]: ...

@final
class SequenceBatcher:
    """Triton's sequence batcher: each sequence (correlation ID) is pinned to one instance slot
    from its START to its END; its requests run one at a time, in arrival order; sequences
    beyond the slots wait in a backlog; a sequence idle for ``max_sequence_idle_us`` is
    released. ``strategy`` is "direct" (batch position = slot, null entries below the highest
    slot with work) or "oldest" (the oldest waiting requests of up to ``max_batch_size``
    sequences)."""

    def __new__(
        cls,
        model: str,
        instances: int,
        max_batch_size: int = 0,
        *,
        strategy: Literal["direct", "oldest"] = "direct",
        max_queue_delay_us: int = 0,
        minimum_slot_utilization: float = 0.0,
        max_candidate_sequences: int = 0,
        preferred_batch_sizes: list[int] = ...,
        max_sequence_idle_us: int = 1_000_000,
        latency_summaries: bool = False,
    ) -> Self: ...
    def push(
        self,
        item: object,
        correlation_id: int | str,
        start: bool = False,
        end: bool = False,
        batch_size: int = 1,
        timeout_us: int = 0,
    ) -> SequenceTicket:
        """Queue ``item``; never blocks. Raises Triton's ``InvalidArgumentError`` (batch size
        above 1, no correlation ID, no START for an unknown sequence) or ``UnavailableError``
        (a START once closed). ``timeout_us`` (0: none): a backlog sequence is dropped when a
        request's timeout passes before it gets a slot (its requests come back in an
        ``expired`` batch)."""

    def cancel(self, ticket: SequenceTicket) -> bool: ...
    def end(self, correlation_id: int | str) -> None:
        """Ends the live sequence ``correlation_id`` without a request (an iterative sequence
        whose request was not rescheduled): it leaves its slot once none of its requests
        waits."""

    def pop(self, instance: int, timeout_us: int) -> Batch | None:
        """Wait (GIL released) for a batch for ``instance``: a :class:`Batch` whose ``items``
        hold ``None`` at null entries, or whose ``rejected`` holds the requests of cancelled
        sequences (a cancelled request cancels the rest of its sequence; answer them
        CANCELLED); both empty on a timeout. ``None`` once closed with nothing left for the
        instance."""

    def close(self) -> None: ...
    def abandon(self) -> list[Any]:
        """Close for good, and return every request still waiting, for the caller to answer
        (every sequence ends; later pushes fail)."""

    @property
    def closed(self) -> bool: ...
    @property
    def live_sequences(self) -> int: ...
    def statistics(self) -> dict[str, Any]: ...
    def latency_summaries(self, quantiles: list[float]) -> dict[str, Any] | None: ...
    def __len__(self) -> int: ...
