"""The protocol-neutral request and response that travel from a codec to a backend and back.

Codecs turn wire bytes into these objects (tensor data as numpy arrays, viewed over the
wire buffer where the protocol allows) and turn responses back into wire bytes. Nothing
here knows about HTTP, gRPC or a particular backend.

Tensor data conventions (datatypes: :mod:`.datatypes`):
- numeric tensors are numpy arrays of the datatype's numpy dtype, C-contiguous, already
  shaped;
- BYTES tensors are numpy ``object`` arrays whose elements are ``bytes``;
- BF16 tensors are ``uint16`` arrays holding the raw bfloat16 bit patterns (numpy has no
  bfloat16), which is why every tensor carries its Triton ``datatype`` string too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Request parameters the protocol itself uses: the server acts on them, and (as Triton, checked
# on 2.51 over HTTP and gRPC) a model does not see them among its request's parameters.
PROTOCOL_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)
# A key in the parameters of a request whose parameters are all the model's, none of them the
# protocol's (a generate request, as Triton reads one): the server schedules it by none of
# them, and its model sees them all, this key aside. (It travels with the parameters, to a
# worker too; a JSON key no client has a reason to send.) Its value is True, or a dict of the
# protocol's parameters the server set for the request itself (an iterative sequence's own
# correlation ID: see protocol_parameters).
MODEL_PARAMETERS_ONLY = "\u0000model-parameters-only"


def protocol_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The parameters a request is scheduled by (``priority``, ``timeout``, a sequence's):
    ``parameters`` itself; for a request whose parameters are all the model's, only those the
    server set for it, kept under :data:`MODEL_PARAMETERS_ONLY`."""
    if MODEL_PARAMETERS_ONLY not in parameters:
        return parameters
    own = parameters[MODEL_PARAMETERS_ONLY]
    return own if type(own) is dict else {}


@dataclass(slots=True)
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its wire parameters (e.g. ``binary_data``)."""

    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


# Triton's TRITONSERVER_REQUEST_RELEASE_RESCHEDULE: a request's release flag that has it run
# again (InferRequest.release_flags).
RELEASE_RESCHEDULE = 2


@dataclass(slots=True)
class PhaseTimes:
    """Where one request's time went, in nanoseconds, as a model's statistics count it: in its
    queue, and in its batch's compute phases. Kept for the requests an ensemble sends to its
    steps (``InferRequest.phases``), whose sums are the ensemble's own statistics, as in
    Triton."""

    queue: int = 0
    compute_input: int = 0
    compute_infer: int = 0
    compute_output: int = 0
    enqueued: int = 0  # perf_counter_ns() when it was queued (0: not yet)

    def add(self, other: PhaseTimes) -> None:
        self.queue += other.queue
        self.compute_input += other.compute_input
        self.compute_infer += other.compute_infer
        self.compute_output += other.compute_output


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""  # "" selects the model's default version
    id: str = ""
    inputs: list[InputTensor] = field(default_factory=list)
    # None means "every output the model produces".
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # Set when the caller went away after the request had started running; models see it
    # through pb_utils InferenceRequest.is_cancelled().
    cancelled: bool = False
    # Set by codecs when an input or requested output names a shared-memory region (its
    # parameters say where); such inputs arrive with empty data for the data plane to fill.
    uses_shared_memory: bool = False
    # Outputs to be written straight into CUDA shared memory by a backend that works in
    # device memory (output name -> memory.cudamemory.CudaWindow); see
    # memory.sharedmemory.resolve_inputs.
    device_outputs: dict[str, Any] | None = None
    # Inputs whose data lies in a client's system shared memory, and outputs bound for it
    # (tensor name -> memory.sharedmemory.ObjectPlace), for a backend in another process to
    # map there itself instead of receiving copies; see memory.sharedmemory.resolve_inputs.
    input_places: dict[str, Any] | None = None
    output_places: dict[str, Any] | None = None
    # A tracing.RequestTrace when this request is traced (every layer stamps it), else None.
    trace: Any = None
    # The trace of the request this one is made for (an ensemble's step, a BLS call): its
    # own trace names it as its parent.
    parent_trace: Any = None
    # Where the request's responses go (set by the scheduler): a runtime.responses.
    # ResponseStream, or the future its caller awaits.
    sink: Any = None
    # A generate_stream request's event writer (tritonfast._core.EventWriter): the core's
    # lane of a decoupled model writes its responses as events with it, and the request's
    # sink gets only the end (unless it declines); other schedulers leave it alone.
    event_writer: Any = None
    # The runtime.responses.ResponseSender its responses go through: made when the request
    # is queued for a decoupled model, on demand (responses.sender_of) for any other.
    sender: Any = None
    # Sequence batching: (the instance slot it runs in, READY); READY is False for the null
    # requests that fill a batch's empty slots (runtime.sequence).
    slot: Any = None
    # What the model asked for the request as its execution ended (pb_utils
    # set_release_flags): RELEASE_RESCHEDULE runs it again, in an iterative sequence.
    release_flags: int = 0
    # Filled with its queue and compute times when given (an ensemble's step: PhaseTimes).
    phases: PhaseTimes | None = None


@dataclass(slots=True)
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] = field(default_factory=dict)
    # Already written into the client's shared memory: the response carries metadata only.
    in_shared_memory: bool = False


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[OutputTensor] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
