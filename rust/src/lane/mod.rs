//! The request path of a model whose instances run in worker processes, in the core: requests
//! go into the model's queue (or, for a stateful model, its sequence batcher: [`source`],
//! [`sequence`]) already decoded ([`Lane::submit_http`] and [`Lane::submit_grpc`]
//! take a request's bytes as received), each instance's driver thread forms batches, hands
//! them to its worker through shared memory and a socket ([`message`], [`channel`],
//! [`segment`]), and answers each request from the worker's reply: an HTTP request by writing
//! its response on its connection ([`response`]) and telling the event loop
//! ([`completions`]); a gRPC call with its reply serialized ([`grpcreply`]) and any other
//! request with its response, both through the [`Deliver`] the lane was made with (the
//! server's Python, once per batch).
//!
//! Nothing here runs Python per request. The server's Python runs once per batch at most (to
//! answer requests that came from Python), and the worker's runs the model's `execute` once
//! per batch.

pub mod call;
pub mod callreplies;
pub mod channel;
pub mod completions;
pub mod ensemble;
pub mod events;
pub mod grpcreply;
pub mod message;
pub mod regions;
pub mod response;
pub mod segment;
pub mod sequence;
pub mod source;
pub mod state;
pub mod streams;

use std::hash::{Hash, Hasher};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Code, CoreError};
use crate::infer::{
    BodyObject, CoreInput, CoreOutput, CoreRequest, DataType, Decoded, Signature, TensorData,
    decode_generate, decode_grpc, decode_http, request_prefix,
};
use crate::outbox::Stream;
use crate::queue::{QUEUE_FULL_MESSAGE, QueueConfig, RequestMeta, RequestQueue};
use crate::sequence::{CorrelationId, SequenceConfig};
use crate::shm::RegionRegistry;
use crate::stats::{ComputeTimes, ModelStats};
use call::{CALL_TAG, CallAnswer, CallMessage, CallSink, LaneRegistry, STREAM_TAG, stuck_message};
use callreplies::{CallReplies, Pushed, RequestReplies};
use channel::{Channel, GET_READY};
use completions::Completions;
use ensemble::{Ended, Spent, StepSink};
use events::{EventWriter, response_json};
pub use grpcreply::GrpcForm;
use grpcreply::{grpc_answer, grpc_empty_final};
use message::{BatchMessage, BatchRequest, Outcome, ReplyMessage, Slot};
use response::{
    Framing, HttpAnswer, ResponseParts, error_answer, error_json, json_answer, response_answer,
    slot_bytes,
};
use segment::{CancelFlags, InputSegment, OutputSegment, aligned};
use sequence::{Controls, null_inputs};
use source::{Entry, Popped, RunTicket, Source};
pub use source::{LaneTicket, REQUEST_TIMEOUT_MESSAGE};
use state::ImplicitStates;
use streams::{Direct, OpenStream, OpenStreams, Replies, StreamMessage, StreamSink, Streamed};
/// The most streamed responses a worker's reader hands over together.
const STREAMED_AT_ONCE: usize = 256;

/// How long a driver waits for a batch before it looks again whether its worker is gone.
const IDLE_POLL: Duration = Duration::from_millis(200);
/// How long before a batch waiting out its delay leaves its worker is told to get ready (see
/// `WorkerLink::get_ready`): about what waking it takes, so that it polls for the batch only
/// briefly (at most `channel::GET_READY_POLL`).
const GET_READY_AHEAD: Duration = Duration::from_micros(40);

/// Triton's answer to a request that arrives while the model's scheduler is stopping.
pub const STOPPING_MESSAGE: &str =
    "Server is stopping, scheduler for model has stopped accepting new inference requests";

/// Where an HTTP request's answer goes.
#[derive(Debug)]
pub struct HttpReply {
    pub stream: Arc<Stream>,
    pub framing: Framing,
    /// Handed to the event loop once the answer is written.
    pub token: u64,
    /// The answer is the generate extension's (a `generate` request), not an `infer` one's.
    pub generate: bool,
}

/// Who is waiting for a request's answer.
#[derive(Debug)]
pub enum Sink<E> {
    Http(HttpReply),
    /// The server's Python (another frontend, a model's call): answered through [`Deliver`].
    External(E),
    /// A gRPC call or a stream's request: its serialized reply handed to [`Deliver`].
    Grpc(E, GrpcForm),
    /// A gRPC stream's request to a decoupled model: its serialized replies queued on its
    /// call by the core ([`callreplies`]).
    Replies(E, Arc<RequestReplies>),
    /// A `generate_stream` request from the server's Python: on a decoupled lane its events
    /// are written by the core ([`events`]), else it is answered as `External`.
    Events(E, Arc<EventWriter>),
    /// A step of an ensemble the core runs.
    Step(StepSink<E>),
    /// A model's call (BLS) the core takes: answered on the caller's channel.
    Call(CallSink),
}

/// What [`Deliver`] hands on for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Response(OwnedResponse),
    /// A gRPC reply, serialized.
    Encoded(Vec<u8>),
}

/// The bytes a request arrived in: a buffer of its own, or one its submitter lends (a large
/// HTTP body received into a buffer of the server's, not copied again).
pub type Body = Box<dyn AsRef<[u8]> + Send>;

/// No body (a request whose inputs all have buffers of their own).
pub fn no_body() -> Body {
    Box::new(Vec::new())
}

/// A request in a lane's queue.
pub struct LaneItem<E> {
    pub request: CoreRequest,
    /// The bytes its inputs' `Body` ranges lie in.
    pub body: Body,
    /// Its parameters for the model, as a JSON object's text (empty for none).
    pub parameters: String,
    pub sink: Sink<E>,
}

impl<E: std::fmt::Debug> std::fmt::Debug for LaneItem<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneItem")
            .field("request", &self.request)
            .field("body_len", &(*self.body).as_ref().len())
            .field("sink", &self.sink)
            .finish_non_exhaustive()
    }
}

/// An output tensor copied out of the worker's segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedOutput {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    /// Its bytes; none when the worker wrote them into a client's object (`in_place`).
    pub data: Vec<u8>,
    pub in_place: bool,
}

/// A response for an external sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: String,
    pub parameters: String,
    pub outputs: Vec<OwnedOutput>,
}

/// Answers the requests that came from the server's Python.
pub trait Deliver<E>: Send + Sync {
    /// One batch's results for external sinks, what the worker sent besides (opaque, may be
    /// empty), and the batch's compute marks (see [`Marks`]). Called on a driver thread,
    /// before the batch's HTTP answers are written.
    fn deliver(&self, results: Vec<(E, Result<Answer, CoreError>)>, extra: Vec<u8>, marks: Marks);

    /// Responses of decoupled requests (see [`streams`]), in the order the worker sent them.
    /// Called on a worker's reader thread, which reads nothing more from that worker until
    /// it returns (a consumer that falls behind may hold it back so).
    fn stream(&self, parts: Vec<Streamed<E>>);
}

/// When a batch's computation started, its inputs were handed over, its outputs began to come
/// back, and it ended: `CLOCK_MONOTONIC` nanoseconds (Python's `perf_counter_ns` on Linux),
/// all zero for requests answered without running.
pub type Marks = [u64; 4];

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec into `now`, which is live and of the right type.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

/// How requests join batches: the dynamic batcher's rules, or one request per execution.
#[derive(Debug, Clone, Default)]
pub struct Batching {
    /// Priorities, timeouts and shape keys apply (the dynamic batcher); else FIFO.
    pub dynamic: bool,
    /// Inputs whose shapes (past the batch dimension) must agree within a batch.
    pub keyed_inputs: Vec<String>,
    /// Whether the set of inputs sent must agree too (some inputs are optional).
    pub keyed_by_names: bool,
}

/// Where a lane's requests wait: a queue with its configuration and batching rules, or (a
/// stateful model's) a sequence batcher and the control inputs its requests get.
#[derive(Debug, Clone)]
pub enum Scheduling {
    Queue(QueueConfig, Batching),
    Sequences(SequenceConfig, Controls),
}

/// Runs a batch in this process (an instance the server's Python holds, such as an ONNX
/// Runtime session): the same batch and reply a worker's channel carries, and the same
/// segments, handed over by a call instead of a socket.
pub trait BatchRunner: Send + Sync {
    /// The reply to `batch`; an error fails the batch (the instance stays).
    fn run(&self, batch: BatchMessage) -> Result<ReplyMessage, CoreError>;
}

/// How a driver hands an instance its batches.
enum Exchange {
    /// Over a worker process's channel.
    Worker(Arc<Channel>),
    /// By a call, in this process.
    InProcess(Box<dyn BatchRunner>),
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exchange::Worker(channel) => f.debug_tuple("Worker").field(channel).finish(),
            Exchange::InProcess(_) => f.write_str("InProcess"),
        }
    }
}

/// An instance as a driver reaches it: a worker process, or a runner in this process.
#[derive(Debug)]
pub struct WorkerLink {
    exchange: Exchange,
    inputs: InputSegment,
    outputs: OutputSegment,
    cancel: Arc<CancelFlags>,
    /// What a decoupled request's stream ends with when the worker goes away first.
    died_message: String,
}

impl WorkerLink {
    /// `fd`: the server's end of the worker's channel; its inputs and its batches'
    /// cancellation flags go into segments whose names carry `tag` (`tritonfast-in-<tag>-...`,
    /// `tritonfast-cancel-<tag>-...`).
    pub fn new(fd: OwnedFd, tag: &str) -> Result<Self, CoreError> {
        Self::with(Exchange::Worker(Arc::new(Channel::new(fd))), tag)
    }

    /// Tells a worker that sleeps between batches that one leaves soon (`GET_READY_AHEAD`),
    /// so that it wakes meanwhile rather than after the batch is sent: the kernel's 15-20 µs
    /// to wake it overlap the batch's delay. Only a worker that waits for nothing but its
    /// next batch (`idle`: no decoupled model's streams, no calls) is told.
    fn get_ready(&self, idle: bool) {
        if let Exchange::Worker(channel) = &self.exchange
            && idle
        {
            // (A worker gone shows on the batch's own send.)
            let _ = channel.send(GET_READY);
        }
    }

    /// An instance in this process, whose batches `runner` runs (segments named as above).
    pub fn in_process(runner: Box<dyn BatchRunner>, tag: &str) -> Result<Self, CoreError> {
        Self::with(Exchange::InProcess(runner), tag)
    }

    fn with(exchange: Exchange, tag: &str) -> Result<Self, CoreError> {
        Ok(WorkerLink {
            exchange,
            inputs: InputSegment::new(&format!("tritonfast-in-{tag}")),
            outputs: OutputSegment::default(),
            cancel: Arc::new(CancelFlags::new(&format!("tritonfast-cancel-{tag}"))?),
            died_message: "the worker process exited before it sent the final response".into(),
        })
    }

    /// What the open streams of a decoupled model end with when its worker goes away.
    #[must_use]
    pub fn with_died_message(mut self, message: String) -> Self {
        self.died_message = message;
        self
    }
}

/// The batch an instance runs: its requests' tickets, by position, and its flags.
#[derive(Debug)]
struct Running {
    tickets: Vec<RunTicket>,
    flags: Arc<CancelFlags>,
}

/// Why [`Lane::drive`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum DriveEnd {
    /// The queue is closed and empty.
    Closed,
    /// The worker went away during a batch, which is held for [`Lane::fail_held`].
    Died,
}

/// What [`Lane::submit_http`] did with a request.
#[derive(Debug)]
pub enum Submitted {
    Queued(LaneTicket),
    Refused(CoreError),
    /// Not one the core takes on: the reference path decides.
    Reference,
}

/// A batch whose worker went away while running it.
type Held<E> = Vec<Entry<E>>;

/// One model version's lane.
pub struct Lane<E> {
    model_name: String,
    model_version: String,
    signature: Signature,
    batching: Batching,
    source: Source<E>,
    completions: Arc<Completions>,
    deliver: Box<dyn Deliver<E>>,
    /// Per instance: the batch its worker died in, until answered.
    held: Mutex<Vec<Option<Held<E>>>>,
    /// Per instance: the batch it runs, for cancellations to reach.
    running: Mutex<Vec<Option<Running>>>,
    /// How many instances run its batches (for calls to tell whether all of them wait).
    instances: usize,
    /// Where calls its models make find their targets; None: every call goes through Python.
    registry: Option<Arc<LaneRegistry<E>>>,
    /// Per instance: its model's calls to the server in flight (the core's and Python's).
    calls: Mutex<Vec<Arc<AtomicUsize>>>,
    /// The clients' shared-memory regions its requests may name; None: such requests take the
    /// reference path.
    regions: Option<Arc<RegionRegistry>>,
    /// Whether its model is decoupled: its requests' responses are streamed ([`streams`]).
    decoupled: bool,
    streams: OpenStreams<E>,
    /// The last stream token given out.
    tokens: AtomicU64,
    /// A stateful model's implicit states (none for others).
    states: ImplicitStates,
}

impl<E> std::fmt::Debug for Lane<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("model", &self.model_name)
            .finish_non_exhaustive()
    }
}

impl<E: Send + Sync> Lane<E> {
    /// A lane whose requests go through a queue or a sequence batcher, as `scheduling` says.
    pub fn new(
        model_version: String,
        signature: Signature,
        scheduling: Scheduling,
        completions: Arc<Completions>,
        deliver: Box<dyn Deliver<E>>,
    ) -> Result<Self, CoreError> {
        let mut states = ImplicitStates::default();
        let (source, batching) = match scheduling {
            Scheduling::Queue(queue, batching) => {
                (Source::Queue(RequestQueue::with_config(queue)?), batching)
            }
            Scheduling::Sequences(config, mut controls) => {
                states = ImplicitStates::new(std::mem::take(&mut controls.states));
                (Source::sequence(config, controls)?, Batching::default())
            }
        };
        Ok(Lane {
            model_name: signature.model().to_owned(),
            model_version,
            signature,
            batching,
            source,
            completions,
            deliver,
            held: Mutex::new(Vec::new()),
            running: Mutex::new(Vec::new()),
            instances: 0,
            registry: None,
            calls: Mutex::new(Vec::new()),
            regions: None,
            decoupled: false,
            streams: OpenStreams::default(),
            tokens: AtomicU64::new(0),
            states,
        })
    }

    /// Its model is decoupled: each request's responses are streamed, as the worker sends
    /// them. Such a lane takes requests from Python and gRPC streams' requests; HTTP and
    /// unary gRPC requests, and those naming shared-memory regions, take the reference path.
    #[must_use]
    pub fn decoupled(mut self) -> Self {
        self.decoupled = true;
        self
    }

    pub fn is_decoupled(&self) -> bool {
        self.decoupled
    }

    /// This lane's requests may name the shared-memory regions in `regions`.
    #[must_use]
    pub fn with_regions(mut self, regions: Arc<RegionRegistry>) -> Self {
        self.regions = Some(regions);
        self
    }

    /// This lane's `instances` take calls their models make to the models in `registry`.
    #[must_use]
    pub fn with_calls(mut self, instances: usize, registry: Arc<LaneRegistry<E>>) -> Self {
        self.instances = instances;
        self.registry = Some(registry);
        self
    }

    /// Instance `instance`'s count of calls in flight.
    pub fn calls_of(&self, instance: usize) -> Arc<AtomicUsize> {
        let mut calls = self.calls.lock();
        if calls.len() <= instance {
            calls.resize_with(instance + 1, Arc::default);
        }
        Arc::clone(&calls[instance])
    }

    /// Whether every instance runs a batch that waits on a call to the server: a call to
    /// this model could then never run.
    pub fn stuck(&self) -> bool {
        if self.instances == 0 {
            return false;
        }
        let calls = self.calls.lock();
        let running = self.running.lock();
        (0..self.instances).all(|i| {
            calls.get(i).is_some_and(|c| c.load(Ordering::Acquire) > 0)
                && running.get(i).is_some_and(Option::is_some)
        })
    }

    /// The statistics of the requests it ran.
    pub fn stats(&self) -> &Arc<ModelStats> {
        self.source.stats()
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.source.len()
    }

    pub fn is_empty(&self) -> bool {
        self.source.is_empty()
    }

    pub fn is_closed(&self) -> bool {
        self.source.is_closed()
    }

    /// Whether its model takes sequences (the sequence batcher).
    pub fn is_sequence(&self) -> bool {
        self.source.is_sequence()
    }

    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Decodes an HTTP request's body (its JSON header `json_length` bytes) and queues it; the
    /// large inputs of a body received into a shared-memory `object` are read there by the
    /// worker.
    pub fn submit_http(
        &self,
        body: Body,
        json_length: usize,
        reply: HttpReply,
        object: Option<&BodyObject>,
    ) -> Submitted {
        if self.decoupled {
            return Submitted::Reference;
        }
        match decode_http((*body).as_ref(), json_length, &self.signature) {
            Decoded::Reference => Submitted::Reference,
            Decoded::Refused(error) => Submitted::Refused(error),
            Decoded::Request(mut request, batch_size) => {
                if !self.takes(&mut request) {
                    return Submitted::Reference;
                }
                if let Some(object) = object {
                    regions::place_in_body(&mut request, object);
                }
                let item = LaneItem {
                    parameters: reference_parameters(&request),
                    request,
                    body,
                    sink: Sink::Http(reply),
                };
                self.push_decoded(item, batch_size)
            }
        }
    }

    /// Decodes a gRPC `ModelInferRequest` (as received, from a call or a stream) and queues
    /// it; its answer goes to [`Deliver`] serialized in `form`. A request the core does not
    /// take on, or that its model refuses, goes to the reference path (which words gRPC's
    /// errors).
    pub fn submit_grpc(&self, message: Body, sink: E, form: GrpcForm) -> Submitted {
        self.queue_grpc(message, form, Sink::Grpc(sink, form))
    }

    /// As [`Lane::submit_grpc`] for a stream's request whose replies are queued on its call
    /// by the core ([`callreplies`]) when the model is decoupled (else its one reply goes to
    /// [`Deliver`] as `submit_grpc`'s).
    pub fn submit_grpc_replies(
        &self,
        message: Body,
        sink: E,
        replies: Arc<RequestReplies>,
    ) -> Submitted {
        let sink = if self.decoupled {
            Sink::Replies(sink, replies)
        } else {
            Sink::Grpc(sink, GrpcForm::Stream)
        };
        self.queue_grpc(message, GrpcForm::Stream, sink)
    }

    fn queue_grpc(&self, message: Body, form: GrpcForm, sink: Sink<E>) -> Submitted {
        if self.decoupled && form == GrpcForm::Unary {
            return Submitted::Reference;
        }
        let decoded = decode_grpc(
            (*message).as_ref(),
            &self.signature,
            form == GrpcForm::Stream,
        );
        let Decoded::Request(mut request, batch_size) = decoded else {
            return Submitted::Reference;
        };
        if !self.takes(&mut request) {
            return Submitted::Reference;
        }
        let item = LaneItem {
            parameters: reference_parameters(&request),
            request,
            body: message,
            sink,
        };
        self.push_decoded(item, batch_size)
    }

    /// Decodes a `generate_stream` body and queues it, for a decoupled model whose requests
    /// are not sequences': its events are written by `writer`. A body the core does not take
    /// on goes to the reference path.
    fn submit_generate(&self, body: &[u8], sink: E, writer: Arc<EventWriter>) -> Submitted {
        if !self.decoupled {
            return Submitted::Reference;
        }
        self.queue_generate(body, Sink::Events(sink, writer))
    }

    /// Decodes a `generate_stream` body the connection handed over whole and queues it, for a
    /// decoupled model: its answer is written on `stream` (keep-alive HTTP/1.1) by a whole
    /// event writer, which hands `token` to the completions once it is; `sink` (nothing the
    /// server's Python reads) only fills the sink's place.
    pub fn submit_generate_events(
        &self,
        body: &[u8],
        stream: Arc<Stream>,
        token: u64,
        sink: E,
    ) -> Submitted {
        let writer = EventWriter::whole(stream, Arc::clone(&self.completions), token);
        self.submit_generate(body, sink, Arc::new(writer))
    }

    /// Decodes a `generate` body and queues it, for a model that is neither decoupled nor a
    /// sequence model: its answer (the generate extension's JSON) is written on `reply`'s
    /// stream. A body the core does not take on goes to the reference path.
    pub fn submit_generate_http(&self, body: &[u8], reply: HttpReply) -> Submitted {
        if self.decoupled || !reply.generate {
            return Submitted::Reference;
        }
        self.queue_generate(body, Sink::Http(reply))
    }

    /// A generate body decoded and queued for `sink` (not for a sequence model's lane: the
    /// reference path words what a sequence needs).
    fn queue_generate(&self, body: &[u8], sink: Sink<E>) -> Submitted {
        if self.source.is_sequence() {
            return Submitted::Reference;
        }
        let Some((request, parameters, batch_size)) = decode_generate(body, &self.signature) else {
            return Submitted::Reference;
        };
        let item = LaneItem {
            request,
            body: no_body(),
            parameters,
            sink,
        };
        self.push_decoded(item, batch_size)
    }

    /// Whether a decoded request is this lane's to queue: a sequence's request goes to a
    /// sequence batcher, any other request to a queue, and the shared-memory regions it names
    /// must all be there (they are found now). (The reference path answers the rest: a
    /// sequence parameter sent to a model without sequences, a request of no sequence sent to
    /// one with, a region not registered or too small, ...)
    fn takes(&self, request: &mut CoreRequest) -> bool {
        let scheduled = match &request.sequence {
            Some(sequence) => self.source.is_sequence() && !sequence.id.is_none(),
            None => !self.source.is_sequence(),
        };
        if !scheduled || !request.uses_regions() {
            return scheduled;
        }
        if self.decoupled {
            return false; // (a stream's responses are not written into regions here)
        }
        self.regions
            .as_ref()
            .is_some_and(|regions| regions::resolve(request, regions))
    }

    /// Queues a request the core decoded. A sequence's request its batcher refuses goes to the
    /// reference path (nothing was queued), which words the refusal.
    fn push_decoded(&self, item: LaneItem<E>, batch_size: u64) -> Submitted {
        match self.push(item, batch_size) {
            Ok(ticket) => Submitted::Queued(ticket),
            Err(_) if self.source.is_sequence() => Submitted::Reference,
            Err(error) => Submitted::Refused(error),
        }
    }

    /// Queues a request the server's Python decoded and checked.
    pub fn submit(&self, item: LaneItem<E>, batch_size: u64) -> Result<LaneTicket, CoreError> {
        self.push(item, batch_size)
    }

    fn push(&self, item: LaneItem<E>, batch_size: u64) -> Result<LaneTicket, CoreError> {
        let request = &item.request;
        let mut meta = RequestMeta {
            batch_size: u32::try_from(batch_size.max(1)).unwrap_or(u32::MAX),
            ..RequestMeta::default()
        };
        if self.batching.dynamic {
            meta.priority = request
                .priority
                .map_or(0, |p| u32::try_from(p).unwrap_or(u32::MAX));
            meta.shape_key = self.shape_key(request);
        }
        if self.batching.dynamic || self.source.is_sequence() {
            // (A sequence's timeout applies while it waits for a slot.)
            meta.timeout = Duration::from_micros(request.timeout_us.unwrap_or(0));
        }
        let sequence = request
            .sequence
            .as_ref()
            .map(|s| (s.id.clone(), s.start, s.end));
        let id = request.id.clone();
        self.source.push(item, meta, sequence).map_err(|error| {
            // Triton prefixes these with the request id.
            if error.code != Code::Unavailable {
                return error;
            }
            let message = if error.message == QUEUE_FULL_MESSAGE {
                QUEUE_FULL_MESSAGE
            } else if self.source.is_closed() {
                STOPPING_MESSAGE
            } else {
                return error;
            };
            CoreError::unavailable(format!("{}{message}", request_prefix(&id)))
        })
    }

    /// What must agree for requests to share a batch, hashed (0: nothing).
    fn shape_key(&self, request: &CoreRequest) -> u64 {
        let batching = &self.batching;
        if batching.keyed_inputs.is_empty() && !batching.keyed_by_names {
            return 0;
        }
        let mut parts: Vec<(&str, &[u64])> = Vec::new();
        for input in &request.inputs {
            if batching.keyed_inputs.contains(&input.name) {
                parts.push((&input.name, input.shape.get(1..).unwrap_or(&[])));
            } else if batching.keyed_by_names {
                parts.push((&input.name, &[]));
            }
        }
        parts.sort_unstable();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        parts.hash(&mut hasher);
        hasher.finish() | 1
    }

    /// Removes a queued request (true); or, for one that runs, raises its cancellation flag
    /// (the model sees `request.is_cancelled()`).
    pub fn cancel(&self, ticket: &LaneTicket) -> Result<bool, CoreError> {
        if self.source.cancel(ticket)? {
            return Ok(true);
        }
        for running in self.running.lock().iter().flatten() {
            let position = running.tickets.iter().position(|t| ticket.is(t));
            if let Some(index) = position {
                running.flags.raise(index);
            }
        }
        Ok(false)
    }

    /// The instance and stream token of the open stream of `ticket`'s request (a decoupled
    /// request whose batch returned before its final response): the worker is told its
    /// consumer went away by the server's Python, over the worker's pipe.
    pub fn stream_of(&self, ticket: &LaneTicket) -> Option<(usize, u64)> {
        self.streams.find(ticket)
    }

    /// Ends every open stream with `error` (the model is unloading, and its time is up).
    pub fn end_streams(&self, error: &CoreError) {
        let ended = self.streams.end_where(|_, _| true);
        self.fail_streams(ended, error);
    }

    fn fail_streams(&self, ended: Vec<OpenStream<E>>, error: &CoreError) {
        if ended.is_empty() {
            return;
        }
        let mut parts = Vec::with_capacity(ended.len());
        for stream in ended {
            let (sink, direct) = (stream.sink.sink(), stream.sink.direct());
            hand_on(sink, direct, Some(Err(error.clone())), true, &mut parts);
        }
        self.deliver.stream(parts);
    }

    /// Closes the queue: submits fail from now on; drivers run what is queued, then return.
    pub fn close(&self) {
        self.source.close();
    }

    /// Runs instance `instance`'s batches on the worker behind `link` until the queue is
    /// closed and empty (and, for a decoupled model, its streams have ended), or the worker
    /// goes away.
    pub fn drive(&self, instance: usize, link: &mut WorkerLink) -> DriveEnd {
        name_this_thread(c"tritonfast-lane");
        let channel = match &link.exchange {
            Exchange::Worker(channel) if self.decoupled => Arc::clone(channel),
            _ => return self.drive_batches(instance, link, None),
        };
        // A decoupled model's worker sends at any time: a reader thread takes what it sends.
        // Its workers may run flat out while their streams are busy: this thread and the
        // reader, which a new request's first response passes, take the CPU when they wake.
        crate::slice::ask_short_slice();
        let Ok(replies) = Replies::new() else {
            return DriveEnd::Died; // (no descriptors left: as good as a dead worker)
        };
        let died = link.died_message.clone();
        std::thread::scope(|scope| {
            scope.spawn(|| self.read_worker(instance, &channel, &replies, &died));
            let end = self.drive_batches(instance, link, Some(&replies));
            if end == DriveEnd::Closed {
                // The streams still open get their responses until they end (or are ended).
                self.streams
                    .wait_ended(instance, IDLE_POLL, || replies.is_gone());
            }
            replies.stop();
            end
        })
    }

    /// Reads what a decoupled model's worker sends until it goes away or the driver stops
    /// reading: responses to their streams, calls to their targets, batch replies to the
    /// driver. A worker gone ends its open streams with `died`.
    ///
    /// Responses are handed over once nothing more is there to read at once (at most
    /// [`STREAMED_AT_ONCE`] together): under load one hand-over to the server's Python takes
    /// many, where one each would have the reader and the event loop trade the GIL per
    /// response.
    fn read_worker(&self, instance: usize, channel: &Arc<Channel>, replies: &Replies, died: &str) {
        name_this_thread(c"tritonfast-read");
        crate::slice::ask_short_slice();
        let mut pending = Vec::new();
        // Writers whose clients have too much unsent (see Behind).
        let mut held: Vec<Behind> = Vec::new();
        // What is pending must reach the server's Python before more is read (see Handed).
        let mut now = false;
        let error = loop {
            if !held.is_empty() {
                if !pending.is_empty() {
                    self.deliver.stream(std::mem::take(&mut pending));
                }
                for writer in held.drain(..) {
                    writer.hold(&|| self.source.is_closed());
                }
            }
            if pending.len() >= STREAMED_AT_ONCE
                || (!pending.is_empty() && (now || !channel.readable_now()))
            {
                self.deliver.stream(std::mem::take(&mut pending));
                now = false;
            }
            if pending.is_empty() {
                match channel.wait(replies.stop_fd()) {
                    Ok(true) if !replies.is_stopping() => {}
                    Ok(_) => break None,
                    Err(error) => break Some(error),
                }
            }
            let message = match channel.recv() {
                Ok(message) => message,
                Err(error) => break Some(error),
            };
            if message.first() == Some(&STREAM_TAG) {
                now |= self.collect_streamed(&message, &mut pending, &mut held);
                continue;
            }
            // (What came before it reaches its sinks first.)
            if !pending.is_empty() {
                self.deliver.stream(std::mem::take(&mut pending));
            }
            if message.first() == Some(&CALL_TAG) {
                if let Some(answer) = self.serve_call(instance, &message, channel)
                    && let Err(error) = channel.send(&answer.encode())
                {
                    break Some(error);
                }
            } else {
                replies.put(message);
            }
        };
        if !pending.is_empty() {
            self.deliver.stream(pending);
        }
        replies.end(
            error
                .clone()
                .unwrap_or_else(|| CoreError::disconnected("the worker's reader stopped")),
        );
        if error.is_some() {
            let ended = self
                .streams
                .end_where(|_, stream| stream.instance == instance);
            self.fail_streams(ended, &CoreError::internal(died));
        }
    }

    /// A worker's streamed responses, each with its request's sink, added to `parts` (those
    /// an event writer or a call's queue takes, handed to it; the writers that must wait
    /// added to `held`): whether `parts` must reach the server's Python at once.
    fn collect_streamed(
        &self,
        message: &[u8],
        parts: &mut Vec<Streamed<E>>,
        held: &mut Vec<Behind>,
    ) -> bool {
        let Ok(message) = StreamMessage::decode(message) else {
            return false; // (the worker's side is ours: a bug, which its streams' ends would show)
        };
        let mut now = false;
        for part in &message.parts {
            let answered = self.streams.with(part.token, part.last, |stream| {
                let answer = match &part.outcome {
                    Some(outcome) => Some(stream_answer(stream, outcome, &message.data, part.last)),
                    None => empty_final(stream),
                };
                (stream.sink.sink(), stream.sink.direct(), answer)
            });
            if let Some((sink, direct, answer)) = answered {
                match hand_on(sink, direct, answer, part.last, parts) {
                    Handed::Done => {}
                    Handed::Now => now = true,
                    Handed::Hold(writer) => held.push(writer),
                }
            }
        }
        now
    }

    fn drive_batches(
        &self,
        instance: usize,
        link: &mut WorkerLink,
        replies: Option<&Replies>,
    ) -> DriveEnd {
        loop {
            if replies.is_some_and(Replies::is_gone) {
                return DriveEnd::Died; // between batches: no batch to hold
            }
            // (A lone request's batch: under load, when batches hold more, the worker is
            // seldom asleep long, and polling would take the CPU others need.)
            let mut forming = |_, staged| {
                if staged == 1 {
                    link.get_ready(replies.is_none());
                }
            };
            match self
                .source
                .pop(instance, IDLE_POLL, GET_READY_AHEAD, &mut forming)
            {
                Popped::Closed => return DriveEnd::Closed,
                Popped::TimedOut => {}
                Popped::Rejected(items, error) => self.answer_items(items, &error),
                Popped::Batch(entries) => {
                    if let Err(items) = self.run(instance, entries, link, replies) {
                        let mut held = self.held.lock();
                        if held.len() <= instance {
                            held.resize_with(instance + 1, || None);
                        }
                        held[instance] = Some(items);
                        return DriveEnd::Died;
                    }
                }
            }
        }
    }

    /// Answers the batch instance `instance`'s worker died in with `error`.
    pub fn fail_held(&self, instance: usize, error: &CoreError) {
        let items = self.held.lock().get_mut(instance).and_then(Option::take);
        if let Some(items) = items {
            self.answer_all(items, error, true);
        }
    }

    /// Waits up to `timeout` for instance `instance`'s next batch and answers it with `error`
    /// (no worker to run it): whether a batch was answered so; None once the queue is closed
    /// and empty.
    pub fn fail_next(&self, instance: usize, error: &CoreError, timeout: Duration) -> Option<bool> {
        match self
            .source
            .pop(instance, timeout, Duration::ZERO, &mut |_, _| {})
        {
            Popped::Closed => None,
            Popped::TimedOut => Some(false),
            Popped::Rejected(items, rejected) => {
                self.answer_items(items, &rejected);
                Some(false)
            }
            Popped::Batch(entries) => {
                self.answer_all(entries, error, true);
                Some(true)
            }
        }
    }

    /// Closes the queue and answers everything still in it, and every held batch, with
    /// `error`.
    pub fn abandon(&self, error: &CoreError) {
        let left = self.source.abandon();
        let held: Vec<_> = self
            .held
            .lock()
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        let held = held.into_iter().flatten().filter_map(|entry| entry.item);
        self.answer_items(left.into_iter().chain(held), error);
    }

    /// Answers a batch's requests with `error`; `executed`: they count as a failed execution.
    fn answer_all(&self, entries: Vec<Entry<E>>, error: &CoreError, executed: bool) {
        if executed {
            let now = Instant::now();
            let timings = entries
                .iter()
                .filter(|entry| entry.item.is_some())
                .map(|entry| (entry.timing, false))
                .collect::<Vec<_>>();
            self.source
                .stats()
                .record_execution(timings, now, ComputeTimes::default());
        }
        self.answer_items(entries.into_iter().filter_map(|entry| entry.item), error);
    }

    /// Answers `items` with `error`, not counted as executed.
    fn answer_items(&self, items: impl IntoIterator<Item = LaneItem<E>>, error: &CoreError) {
        let mut externals = Vec::new();
        let mut tokens = Vec::new();
        for item in items {
            answer_error(item.sink, error, &mut externals, &mut tokens);
        }
        self.finish_answers(externals, Vec::new(), &tokens);
    }

    fn finish_answers(
        &self,
        externals: Vec<(E, Result<Answer, CoreError>)>,
        extra: Vec<u8>,
        tokens: &[u64],
    ) {
        if !externals.is_empty() || !extra.is_empty() {
            self.deliver.deliver(externals, extra, [0; 4]);
        }
        self.completions.add(tokens);
    }

    /// Runs one batch on the worker and answers it; the batch back when the worker is gone.
    fn run(
        &self,
        instance: usize,
        mut items: Vec<Entry<E>>,
        link: &mut WorkerLink,
        replies: Option<&Replies>,
    ) -> Result<(), Vec<Entry<E>>> {
        let dequeued_at = Instant::now();
        let started_ns = monotonic_ns();
        let mut message = match self.write_inputs(instance, &items, link) {
            Ok(message) => message,
            Err(error) => {
                self.answer_all(items, &error, true);
                return Ok(());
            }
        };
        link.cancel.clear(items.len());
        let tickets = items
            .iter_mut()
            .map(|entry| std::mem::replace(&mut entry.ticket, RunTicket::None))
            .collect::<Vec<_>>();
        let tokens = self
            .decoupled
            .then(|| self.open_streams(instance, &mut items, &mut message, &tickets));
        self.set_running(
            instance,
            Some(Running {
                tickets,
                flags: Arc::clone(&link.cancel),
            }),
        );
        let exchanged = self.exchange(instance, link, message, replies);
        self.set_running(instance, None);
        let Ok((sent_ns, reply)) = exchanged else {
            return Err(items); // (a decoupled batch's streams end with the worker's reader)
        };
        let replied_ns = monotonic_ns();
        if let Some(tokens) = tokens {
            let marks = [started_ns, sent_ns, replied_ns, monotonic_ns()];
            self.settle_streamed(&items, &tokens, reply, dequeued_at, marks);
            return Ok(());
        }
        let mut reply = match reply {
            Ok(reply) if reply.results.len() == items.len() => reply,
            failed => {
                let error = failed.err().unwrap_or_else(|| self.answered_wrongly());
                self.answer_all(items, &error, true);
                return Ok(());
            }
        };
        let inline = std::mem::take(&mut reply.data);
        let segment = match link
            .outputs
            .of_reply(&reply.segment, reply.segment_len, &inline)
        {
            Ok(bytes) => bytes,
            Err(error) => {
                self.answer_all(items, &error, true);
                return Ok(());
            }
        };
        self.keep_states(instance, &items, &mut reply.results, segment);
        let bodies = bodies_answered_from(&mut items);
        let mut successes = Vec::with_capacity(items.len());
        let mut externals = Vec::new();
        let mut answers: Vec<(HttpReply, HttpAnswer<'_>)> = Vec::new();
        let mut steps = Vec::new();
        for (index, (entry, outcome)) in items.into_iter().zip(&reply.results).enumerate() {
            let Some(item) = entry.item else {
                continue; // a null request: its answer goes nowhere
            };
            let ok = matches!(outcome, Outcome::Response { .. });
            let timing = entry.timing;
            let queued_for = dequeued_at.saturating_duration_since(timing.enqueued_at);
            successes.push((timing, ok));
            let LaneItem { request, sink, .. } = item;
            match sink {
                Sink::Http(reply) => {
                    let body = body_at(&bodies, index);
                    let answer = if reply.generate {
                        generate_outcome(outcome, segment, reply.framing)
                    } else {
                        http_outcome(&request, outcome, segment, body, reply.framing)
                    };
                    answers.push((reply, answer));
                }
                // (Replies: only on decoupled lanes, see submit_grpc_replies)
                Sink::External(sink) | Sink::Events(sink, _) | Sink::Replies(sink, _) => {
                    externals.push((sink, owned_outcome(outcome, segment).map(Answer::Response)));
                }
                Sink::Grpc(sink, form) => {
                    externals.push((sink, grpc_outcome(&request, outcome, segment, form, true)));
                }
                Sink::Step(sink) => {
                    steps.push((sink, owned_outcome(outcome, segment), queued_for));
                }
                Sink::Call(sink) => sink.answer(&CallAnswer::of(owned_outcome(outcome, segment))),
            }
        }
        // The statistics and the phases of requests made by others (an ensemble's steps)
        // count the same nanoseconds.
        let marks = [started_ns, sent_ns, replied_ns, monotonic_ns()];
        let compute = compute_times(marks);
        answer_steps(steps, compute, &mut answers, &mut externals);
        // Counted before anyone is answered: a client that asks for the statistics once it
        // has its answer finds its request in them.
        self.source
            .stats()
            .record_execution(successes, dequeued_at, compute);
        self.deliver_and_write(externals, reply.extra, answers, marks);
        Ok(())
    }

    /// Hands `message` to the instance: when it was handed over, and the reply (or why there
    /// is none to read); an error when the worker went away.
    fn exchange(
        &self,
        instance: usize,
        link: &WorkerLink,
        message: BatchMessage,
        replies: Option<&Replies>,
    ) -> Result<(u64, Result<ReplyMessage, CoreError>), CoreError> {
        match &link.exchange {
            Exchange::Worker(channel) => {
                let lone = message.requests.len() == 1;
                channel.send(&message.encode())?;
                let sent = monotonic_ns();
                let reply = match replies {
                    Some(replies) => replies.take()?, // (the reader serves the calls)
                    None => self.reply_of_batch(instance, channel, lone)?,
                };
                let reply = ReplyMessage::decode(&reply).map_err(|_| self.answered_wrongly());
                Ok((sent, reply))
            }
            Exchange::InProcess(runner) => Ok((monotonic_ns(), runner.run(message))),
        }
    }

    fn answered_wrongly(&self) -> CoreError {
        CoreError::internal(format!(
            "the worker of model '{}' answered a batch wrongly",
            self.model_name
        ))
    }

    /// The worker's reply to the batch it runs; the calls its model makes meanwhile are
    /// served as they come.
    fn reply_of_batch(
        &self,
        instance: usize,
        channel: &Arc<Channel>,
        lone: bool,
    ) -> Result<Vec<u8>, CoreError> {
        // A lone request's first message comes soon after its batch (polled for: see
        // `Lane::drive_batches` for why only a lone one's); one after a call waits for the
        // call's answer from another model first (a lone request's driver is poked as the
        // answer leaves, and polls for the message from then on).
        let mut message = if lone {
            channel.recv_soon()?
        } else {
            channel.recv()?
        };
        loop {
            if message.first() != Some(&CALL_TAG) {
                return Ok(message);
            }
            let answer = self.serve_call(instance, &message, channel);
            if let Some(answer) = answer {
                channel.send(&answer.encode())?;
            }
            message = if lone {
                channel.recv_after_call()?
            } else {
                channel.recv()?
            };
        }
    }

    /// Queues a call instance `instance`'s model made, in its target's lane; the answer now
    /// when there is one already (refused, or not the core's to take).
    fn serve_call(
        &self,
        instance: usize,
        message: &[u8],
        channel: &Arc<Channel>,
    ) -> Option<CallAnswer> {
        let call = match CallMessage::decode(message) {
            Ok(call) => call,
            Err(error) => return Some(CallAnswer::Error(error.code, error.message)),
        };
        let target = self
            .registry
            .as_ref()
            .and_then(|registry| registry.find(&call.model_name, &call.model_version));
        let Some(target) = target.filter(|target| !target.is_sequence() && !target.decoupled)
        else {
            // (A sequence's calls go through Python, which keeps their correlation IDs; a
            // decoupled model's responses are streamed to the caller by Python.)
            return Some(CallAnswer::Reroute);
        };
        // The caller waits from before its call is checked: of two calls that would close a
        // cycle, the second is refused.
        let waiting = self.calls_of(instance);
        waiting.fetch_add(1, Ordering::AcqRel);
        let refused = |error: CoreError| {
            waiting.fetch_sub(1, Ordering::AcqRel);
            Some(CallAnswer::NotRun(error.code, error.message))
        };
        if target.stuck() {
            return refused(CoreError::unavailable(stuck_message(&call.model_name)));
        }
        let (request, parameters) = match call_request(call) {
            Ok(taken) => taken,
            Err(error) => return refused(error),
        };
        let batch_size = match target.signature.check(&request) {
            Ok(size) => size,
            Err(error) => return refused(error),
        };
        let item = LaneItem {
            request,
            body: no_body(),
            parameters,
            sink: Sink::Call(CallSink {
                channel: Arc::clone(channel),
                waiting: Arc::clone(&waiting),
            }),
        };
        match target.submit(item, batch_size) {
            Ok(_) => None,
            Err(error) => refused(error),
        }
    }

    /// Gives each request of a decoupled batch a stream token (by position; 0 for a null
    /// request) and moves its sink into the open streams, before the batch goes out: its
    /// first response may come before the batch's reply.
    fn open_streams(
        &self,
        instance: usize,
        items: &mut [Entry<E>],
        message: &mut BatchMessage,
        tickets: &[RunTicket],
    ) -> Vec<u64> {
        let mut tokens = vec![0; items.len()];
        let mut refused = Vec::new();
        for (index, entry) in items.iter_mut().enumerate() {
            let Some(item) = entry.item.take() else {
                continue;
            };
            let LaneItem { request, sink, .. } = item;
            let sink = match sink {
                Sink::External(sink) => StreamSink::External(Arc::new(sink)),
                Sink::Grpc(sink, _) => StreamSink::Grpc(Arc::new(sink)),
                Sink::Replies(sink, replies) => StreamSink::Replies(Arc::new(sink), replies),
                Sink::Events(sink, writer) => StreamSink::Events(Arc::new(sink), writer),
                other => {
                    // (Such requests never reach a decoupled lane: see submit_http, serve_call.)
                    refused.push(other);
                    continue;
                }
            };
            let token = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
            tokens[index] = token;
            message.requests[index].stream = token;
            let ticket = tickets.get(index).cloned().unwrap_or(RunTicket::None);
            let stream = OpenStream {
                instance,
                sink,
                request,
                ticket,
            };
            self.streams.open(token, stream);
        }
        if !refused.is_empty() {
            let error = CoreError::internal(format!(
                "model '{}' is decoupled: its responses are streamed",
                self.model_name
            ));
            let (mut externals, mut done) = (Vec::new(), Vec::new());
            for sink in refused {
                answer_error(sink, &error, &mut externals, &mut done);
            }
            self.finish_answers(externals, Vec::new(), &done);
        }
        tokens
    }

    /// A decoupled batch's reply: its responses went through its requests' streams; a request
    /// that failed (its inputs, or the whole batch) ends its stream with the error.
    fn settle_streamed(
        &self,
        items: &[Entry<E>],
        tokens: &[u64],
        reply: Result<ReplyMessage, CoreError>,
        dequeued_at: Instant,
        marks: Marks,
    ) {
        let reply = match reply {
            Ok(reply) if reply.results.len() == items.len() => Ok(reply),
            Ok(_) => Err(self.answered_wrongly()),
            Err(error) => Err(error),
        };
        let mut successes = Vec::with_capacity(items.len());
        let mut ended = Vec::new();
        for (index, entry) in items.iter().enumerate() {
            let token = tokens[index];
            if token == 0 {
                continue; // a null request
            }
            let failure = match &reply {
                Ok(reply) => match &reply.results[index] {
                    Outcome::Streamed => None,
                    Outcome::Error(code, message) => Some(CoreError::new(*code, message.clone())),
                    Outcome::Response { .. } => Some(self.answered_wrongly()),
                },
                Err(error) => Some(error.clone()),
            };
            successes.push((entry.timing, failure.is_none()));
            if let Some(error) = failure
                && let Some((sink, direct)) = self
                    .streams
                    .with(token, true, |s| (s.sink.sink(), s.sink.direct()))
            {
                hand_on(sink, direct, Some(Err(error)), true, &mut ended);
            }
        }
        if !ended.is_empty() {
            self.deliver.stream(ended);
        }
        if let Ok(reply) = reply
            && !reply.extra.is_empty()
        {
            self.deliver.deliver(Vec::new(), reply.extra, marks);
        }
        self.source
            .stats()
            .record_execution(successes, dequeued_at, compute_times(marks));
    }

    /// Whether instance `instance` runs a batch now.
    pub fn running(&self, instance: usize) -> bool {
        self.running
            .lock()
            .get(instance)
            .is_some_and(Option::is_some)
    }

    fn set_running(&self, instance: usize, running: Option<Running>) {
        let mut all = self.running.lock();
        if all.len() <= instance {
            all.resize_with(instance + 1, || None);
        }
        all[instance] = running;
    }

    fn deliver_and_write(
        &self,
        externals: Vec<(E, Result<Answer, CoreError>)>,
        extra: Vec<u8>,
        answers: Vec<(HttpReply, HttpAnswer<'_>)>,
        marks: Marks,
    ) {
        if !externals.is_empty() || !extra.is_empty() {
            self.deliver.deliver(externals, extra, marks);
        }
        let tokens: Vec<u64> = answers
            .into_iter()
            .map(|(reply, answer)| {
                // A connection gone meanwhile takes nothing: its client left.
                let _ = answer.write_now(&reply.stream);
                reply.token
            })
            .collect();
        self.completions.add(&tokens);
    }

    /// Writes the batch's inputs into the link's input segment and describes the batch: each
    /// request's own inputs, then its control inputs (a sequence's); a null request's inputs
    /// are zeros shaped like the batch's first request's.
    fn write_inputs(
        &self,
        instance: usize,
        entries: &[Entry<E>],
        link: &mut WorkerLink,
    ) -> Result<BatchMessage, CoreError> {
        let added = self.added_inputs(instance, entries);
        let no_body: &[u8] = &[];
        let inputs_of = |index: usize| {
            let entry = &entries[index];
            let own = entry
                .item
                .as_ref()
                .map_or(&[][..], |item| &item.request.inputs[..]);
            let body = entry
                .item
                .as_ref()
                .map_or(no_body, |item| (*item.body).as_ref());
            own.iter().map(move |input| (input, body)).chain(
                added
                    .get(index)
                    .into_iter()
                    .flatten()
                    .map(move |input| (input, no_body)),
            )
        };
        let mut total = 0;
        for index in 0..entries.len() {
            for (input, body) in inputs_of(index) {
                total = aligned(total + input.data.len(body));
            }
        }
        let (segment, name) = link.inputs.reserve(total)?;
        let base = segment.start();
        let mut offset = 0;
        let mut requests = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let mut inputs = Vec::new();
            for (input, body) in inputs_of(index) {
                let size = input.data.len(body);
                // SAFETY: `offset + size` <= `total` <= the segment's length, which no one else
                // touches meanwhile: the worker reads the segment only after the batch is sent,
                // and one batch is in flight.
                let destination = unsafe { std::slice::from_raw_parts_mut(base.add(offset), size) };
                input.data.copy_into(body, destination)?;
                let (len, place) = match &input.data {
                    TensorData::Placed(place, len) => (*len, Some(place.clone())),
                    _ => (size as u64, None),
                };
                inputs.push(Slot {
                    name: input.name.clone(),
                    datatype: input.datatype.name().to_owned(),
                    shape: input
                        .shape
                        .iter()
                        .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
                        .collect(),
                    offset: offset as u64,
                    len,
                    place,
                });
                offset = aligned(offset + size);
            }
            let mut request = batch_request(entry.item.as_ref(), inputs);
            if let Some(outputs) = &mut request.outputs {
                outputs.extend(self.states.output_names().map(str::to_owned));
            }
            requests.push(request);
        }
        Ok(BatchMessage {
            model_name: self.model_name.clone(),
            model_version: self.model_version.clone(),
            segment: name.to_owned(),
            segment_len: segment.len() as u64,
            cancel_segment: link.cancel.name().to_owned(),
            cancel_len: link.cancel.len() as u64,
            requests,
        })
    }
}

impl<E: Send + Sync> Lane<E> {
    /// Keeps the next implicit states the responses of a batch of instance `instance` carry,
    /// taking them out of the responses (see [`state`]); a response whose state output is
    /// not where the worker says becomes an error.
    fn keep_states(
        &self,
        instance: usize,
        entries: &[Entry<E>],
        results: &mut [Outcome],
        segment: &[u8],
    ) {
        if self.states.is_empty() {
            return;
        }
        for (entry, outcome) in entries.iter().zip(results) {
            let (Some(flags), Some(_)) = (entry.sequence, &entry.item) else {
                continue;
            };
            if let Outcome::Response { outputs, .. } = outcome
                && let Err(error) = self.states.keep(instance, flags, outputs, segment)
            {
                *outcome = Outcome::Error(error.code, error.message);
            }
        }
    }

    /// What each position of a batch of instance `instance` adds to its own inputs: a
    /// sequence's controls and implicit states, and a null request's inputs (zeros shaped
    /// like the batch's first request's). Nothing (no allocation) for a lane without
    /// sequences.
    fn added_inputs(&self, instance: usize, entries: &[Entry<E>]) -> Vec<Vec<CoreInput>> {
        let Some(controls) = self.source.controls() else {
            return Vec::new();
        };
        let template = entries
            .iter()
            .find_map(|entry| entry.item.as_ref())
            .map_or(&[][..], |item| &item.request.inputs[..]);
        entries
            .iter()
            .map(|entry| {
                let Some(flags) = entry.sequence else {
                    return Vec::new();
                };
                let mut inputs = if let Some(item) = &entry.item {
                    let id = item.request.sequence.as_ref().map(|s| &s.id);
                    controls.inputs(flags, id.unwrap_or(&CorrelationId::Number(0)))
                } else {
                    let mut inputs = null_inputs(template);
                    inputs.extend(controls.inputs(flags, &CorrelationId::Number(0)));
                    inputs
                };
                if !self.states.is_empty() {
                    inputs.extend(self.states.inputs(instance, flags));
                }
                inputs
            })
            .collect()
    }
}

/// A batch position's description for the worker: its request's, or a null request's.
fn batch_request<E>(item: Option<&LaneItem<E>>, inputs: Vec<Slot>) -> BatchRequest {
    match item {
        Some(item) => BatchRequest {
            id: item.request.id.clone(),
            parameters: item.parameters.clone(),
            outputs: item
                .request
                .outputs
                .as_ref()
                .map(|outputs| outputs.iter().map(|o| o.name.clone()).collect()),
            inputs,
            output_places: item.request.output_places.clone(),
            trace: item.request.trace,
            stream: 0,
        },
        None => BatchRequest {
            id: String::new(),
            parameters: String::new(),
            outputs: None,
            inputs,
            output_places: Vec::new(),
            trace: 0,
            stream: 0,
        },
    }
}

/// Names the calling thread (as `top` and `/proc` show it).
fn name_this_thread(name: &std::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which `name` is.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// A call's request as the core holds it (its tensors moved, not copied), and its parameters.
fn call_request(call: CallMessage) -> Result<(CoreRequest, String), CoreError> {
    let inputs = call
        .inputs
        .into_iter()
        .map(|t| {
            let datatype = DataType::from_name(&t.datatype).ok_or_else(|| {
                CoreError::invalid_arg(format!("unknown datatype '{}'", t.datatype))
            })?;
            let shape = t
                .shape
                .iter()
                .map(|&d| u64::try_from(d))
                .collect::<Result<_, _>>()
                .map_err(|_| CoreError::invalid_arg("a negative dimension"))?;
            Ok(CoreInput {
                name: t.name,
                datatype,
                shape,
                data: TensorData::Owned(t.data),
            })
        })
        .collect::<Result<_, CoreError>>()?;
    let request = CoreRequest {
        id: call.id,
        inputs,
        outputs: call.outputs.map(CoreOutput::named),
        priority: (call.priority > 0).then_some(call.priority),
        timeout_us: (call.timeout_us > 0).then_some(call.timeout_us),
        ..CoreRequest::default()
    };
    Ok((request, call.parameters))
}

/// Hands ensemble steps' results to their runs; the answers of the runs they finish join the
/// batch's.
fn answer_steps<E: Send + Sync>(
    steps: Vec<(StepSink<E>, Result<OwnedResponse, CoreError>, Duration)>,
    compute: ComputeTimes,
    answers: &mut Vec<(HttpReply, HttpAnswer<'_>)>,
    externals: &mut Vec<(E, Result<Answer, CoreError>)>,
) {
    for (sink, result, queued_for) in steps {
        let spent = Spent {
            queue: nanos(queued_for),
            compute_input: nanos(compute.input),
            compute_infer: nanos(compute.infer),
            compute_output: nanos(compute.output),
        };
        match sink.answered(result, &spent) {
            Some(Ended::Http(reply, answer)) => answers.push((reply, HttpAnswer::whole(answer))),
            Some(Ended::External(sink, result)) => externals.push((sink, result)),
            None => {}
        }
    }
}

/// A batch's compute phases from its marks.
fn compute_times(marks: Marks) -> ComputeTimes {
    let between = |a: u64, b: u64| Duration::from_nanos(b.saturating_sub(a));
    ComputeTimes {
        input: between(marks[0], marks[1]),
        infer: between(marks[1], marks[2]),
        output: between(marks[2], marks[3]),
    }
}

pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The parameters the reference path hands the model's worker for a request, as JSON text
/// (empty for none): those the core's decoders take on, `priority`, `timeout` and a sequence's
/// (the worker gives the model its correlation ID and keeps them out of its parameters).
fn reference_parameters(request: &CoreRequest) -> String {
    let mut fields = Vec::new();
    if let Some(priority) = request.priority {
        fields.push(format!("\"priority\":{priority}"));
    }
    if let Some(timeout) = request.timeout_us {
        fields.push(format!("\"timeout\":{timeout}"));
    }
    if let Some(sequence) = &request.sequence {
        let id = match &sequence.id {
            CorrelationId::Number(id) => id.to_string(),
            CorrelationId::Text(text) => {
                let mut quoted = Vec::new();
                response::json_string(&mut quoted, text.as_bytes());
                String::from_utf8_lossy(&quoted).into_owned()
            }
        };
        fields.push(format!("\"sequence_id\":{id}"));
        fields.push(format!("\"sequence_start\":{}", sequence.start));
        fields.push(format!("\"sequence_end\":{}", sequence.end));
    }
    if fields.is_empty() {
        return String::new();
    }
    format!("{{{}}}", fields.join(","))
}

fn answer_error<E: Send + Sync>(
    sink: Sink<E>,
    error: &CoreError,
    externals: &mut Vec<(E, Result<Answer, CoreError>)>,
    tokens: &mut Vec<u64>,
) {
    match sink {
        Sink::Http(reply) => {
            let answer = if reply.generate {
                generate_error(error, reply.framing)
            } else {
                error_answer(error, reply.framing)
            };
            let _ = reply.stream.write_now(&answer);
            tokens.push(reply.token);
        }
        Sink::Events(_, writer) if writer.is_whole() => {
            writer.write(Some(&Err(error.clone())), true);
        }
        Sink::External(sink)
        | Sink::Grpc(sink, _)
        | Sink::Replies(sink, _)
        | Sink::Events(sink, _) => {
            externals.push((sink, Err(error.clone())));
        }
        Sink::Call(sink) => sink.answer(&CallAnswer::Error(error.code, error.message.clone())),
        Sink::Step(sink) => match sink.answered(Err(error.clone()), &Spent::default()) {
            Some(Ended::Http(reply, answer)) => {
                let _ = reply.stream.write_now(&answer);
                tokens.push(reply.token);
            }
            Some(Ended::External(sink, result)) => externals.push((sink, result)),
            None => {}
        },
    }
}

/// The bodies of `items` that outputs may lie in (see `regions::in_body`), taken from them,
/// by position: they must outlive the answers sent from them. Empty (nothing allocated) for a
/// batch with none, the usual one.
fn bodies_answered_from<E>(items: &mut [Entry<E>]) -> Vec<Option<Body>> {
    let in_objects = |entry: &Entry<E>| {
        entry
            .item
            .as_ref()
            .is_some_and(|item| item.request.body_object.is_some())
    };
    if !items.iter().any(in_objects) {
        return Vec::new();
    }
    items
        .iter_mut()
        .map(|entry| {
            let item = entry.item.as_mut()?;
            item.request.body_object.as_ref()?;
            Some(std::mem::replace(&mut item.body, no_body()))
        })
        .collect()
}

/// The body at `index` of those [`bodies_answered_from`] took (empty for one it did not).
fn body_at(bodies: &[Option<Body>], index: usize) -> &[u8] {
    bodies
        .get(index)
        .and_then(Option::as_ref)
        .map_or(&[][..], |body| (**body).as_ref())
}

/// An HTTP request's answer, written out.
fn http_outcome<'a>(
    request: &CoreRequest,
    outcome: &'a Outcome,
    segment: &'a [u8],
    body: &'a [u8],
    framing: Framing,
) -> HttpAnswer<'a> {
    let answer = parts_of(outcome, segment).and_then(|mut parts| {
        parts.body = body;
        regions::write_outputs(request, &parts)?;
        response_answer(request, &parts, framing)
    });
    answer.unwrap_or_else(|error| HttpAnswer::whole(error_answer(&error, framing)))
}

/// A `generate` request's answer: the response as the generate extension's JSON object, or
/// its error (status 400, whatever the error, as the reference path answers a response that
/// is an error).
fn generate_outcome(outcome: &Outcome, segment: &[u8], framing: Framing) -> HttpAnswer<'static> {
    let json = owned_outcome(outcome, segment).and_then(|response| response_json(&response));
    HttpAnswer::whole(match json {
        Ok(json) => json_answer(200, &json, framing),
        Err(error) => generate_error(&error, framing),
    })
}

fn generate_error(error: &CoreError, framing: Framing) -> Vec<u8> {
    json_answer(400, &error_json(&error.message), framing)
}

/// A worker's response and the segment its outputs lie in; or its error.
fn parts_of<'a>(outcome: &'a Outcome, segment: &'a [u8]) -> Result<ResponseParts<'a>, CoreError> {
    match outcome {
        Outcome::Response {
            model_name,
            model_version,
            id,
            parameters,
            outputs,
        } => Ok(ResponseParts {
            model_name,
            model_version,
            id,
            parameters,
            outputs,
            segment,
            body: &[],
        }),
        Outcome::Error(code, message) => Err(CoreError::new(*code, message.clone())),
        Outcome::Streamed => Err(CoreError::internal(
            "a worker answered a request through a stream it does not have",
        )),
    }
}

/// A gRPC call's answer: its reply serialized here, or the response for the reference
/// encoder when it carries parameters. `last`: a stream's reply is its request's last.
fn grpc_outcome(
    request: &CoreRequest,
    outcome: &Outcome,
    segment: &[u8],
    form: GrpcForm,
    last: bool,
) -> Result<Answer, CoreError> {
    if let Ok(parts) = parts_of(outcome, segment) {
        regions::write_outputs(request, &parts)?;
        if let Some(encoded) = grpc_answer(request, &parts, form, last)? {
            return Ok(Answer::Encoded(encoded));
        }
    }
    let mut response = owned_outcome(outcome, segment)?;
    for output in &mut response.outputs {
        if request
            .output(&output.name)
            .is_some_and(|o| o.region.is_some())
        {
            output.in_place = true; // in the client's region now: the encoder says so
            output.data = Vec::new();
        }
    }
    Ok(Answer::Response(response))
}

/// A writer whose client has too much unsent: the reader thread waits on it (once what it
/// has is handed on) before it reads more of the worker's responses, and so the worker's
/// sends wait too.
enum Behind {
    Events(Arc<EventWriter>),
    Call(Arc<CallReplies>),
}

impl Behind {
    fn hold(&self, stop: &dyn Fn() -> bool) {
        match self {
            Behind::Events(writer) => writer.hold(stop),
            Behind::Call(call) => call.hold(stop),
        }
    }
}

/// What handing a streamed response on asks of the reader thread.
enum Handed {
    Done,
    /// The parts must reach the server's Python before anything more is handed on: a call
    /// to start sending on (its first reply waits on it), or a reply the server's Python
    /// encodes, queued on its call behind those handed on before it, not after those that
    /// follow.
    Now,
    Hold(Behind),
}

/// A streamed response on its way to its request: written by the request's event writer, or
/// queued on its gRPC call, when it has one that takes it (the server's Python then hears
/// only of the end, and of a call to start sending on: a part with no answer that is not
/// the last), else added to `parts`.
fn hand_on<E>(
    sink: Arc<E>,
    direct: Direct,
    answer: Option<Result<Answer, CoreError>>,
    last: bool,
    parts: &mut Vec<Streamed<E>>,
) -> Handed {
    match direct {
        Direct::Events(writer) if writer.write(answer.as_ref(), last) => {
            if last {
                if !writer.is_whole() {
                    parts.push((sink, None, true));
                }
                return Handed::Done;
            }
            if writer.over_bound() {
                Handed::Hold(Behind::Events(writer))
            } else {
                Handed::Done
            }
        }
        Direct::Replies(replies) => queue_reply(sink, &replies, answer, last, parts),
        Direct::Events(_) | Direct::None => {
            parts.push((sink, answer, last));
            Handed::Done
        }
    }
}

/// [`hand_on`] for a request whose replies are queued on its gRPC call.
fn queue_reply<E>(
    sink: Arc<E>,
    replies: &RequestReplies,
    answer: Option<Result<Answer, CoreError>>,
    last: bool,
    parts: &mut Vec<Streamed<E>>,
) -> Handed {
    let reply = match answer {
        Some(Ok(Answer::Encoded(reply))) => reply,
        None => {
            // A bare final flag (no empty final response asked for).
            if last {
                parts.push((sink, None, true));
            }
            return Handed::Done;
        }
        encoded_by_python => {
            parts.push((sink, encoded_by_python, last));
            return Handed::Now;
        }
    };
    // (A call that was idle: its sending starts from the server's Python, at once.)
    let idle = replies.push(reply) == Pushed::Idle;
    if idle {
        parts.push((Arc::clone(&sink), None, false));
    }
    if last {
        parts.push((sink, None, true));
    } else if replies.call.is_full() {
        return Handed::Hold(Behind::Call(Arc::clone(&replies.call)));
    }
    if idle { Handed::Now } else { Handed::Done }
}

/// What a bare final flag sends a gRPC stream's request that asked for an empty final
/// response; None otherwise (the flag only ends the stream).
fn empty_final<E>(stream: &OpenStream<E>) -> Option<Result<Answer, CoreError>> {
    let (StreamSink::Grpc(_) | StreamSink::Replies(..)) = stream.sink else {
        return None;
    };
    let named = stream.request.empty_final.as_ref()?;
    Some(Ok(Answer::Encoded(grpc_empty_final(
        &stream.request,
        named,
    ))))
}

/// One streamed response as its request's sink takes it; its outputs' bytes in `data`.
fn stream_answer<E>(
    stream: &OpenStream<E>,
    outcome: &Outcome,
    data: &[u8],
    last: bool,
) -> Result<Answer, CoreError> {
    match stream.sink {
        StreamSink::External(_) | StreamSink::Events(..) => {
            owned_outcome(outcome, data).map(Answer::Response)
        }
        StreamSink::Grpc(_) | StreamSink::Replies(..) => {
            grpc_outcome(&stream.request, outcome, data, GrpcForm::Stream, last)
        }
    }
}

fn owned_outcome(outcome: &Outcome, segment: &[u8]) -> Result<OwnedResponse, CoreError> {
    let parts = parts_of(outcome, segment)?;
    let outputs = parts
        .outputs
        .iter()
        .map(|slot| {
            let in_place = slot.place.is_some();
            Ok(OwnedOutput {
                name: slot.name.clone(),
                datatype: slot.datatype.clone(),
                shape: slot.shape.clone(),
                data: if in_place {
                    Vec::new()
                } else {
                    slot_bytes(segment, slot)?.to_vec()
                },
                in_place,
            })
        })
        .collect::<Result<_, CoreError>>()?;
    Ok(OwnedResponse {
        model_name: parts.model_name.to_owned(),
        model_version: parts.model_version.to_owned(),
        id: parts.id.to_owned(),
        parameters: parts.parameters.to_owned(),
        outputs,
    })
}
