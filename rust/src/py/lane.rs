//! [`crate::lane`] for the server's Python: a model version's lane, the links to its workers,
//! the completions the HTTP frontend watches, and the worker's end of the channel.

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::callreplies::PyRequestReplies;
use super::error::to_py_err;
use super::gil::without_gil;
use super::infer::PyInferSignature;
use super::outbox::PyOutStream;
use super::pool::{borrowed_bytes, contiguous_bytes};
use super::queue::{PyRequestQueue, summaries_dict};
use super::sequence::{PySequenceBatcher, correlation_id_of};
use super::shm::PySharedMemoryRegistry;
use super::stats::snapshot_dict;
use crate::error::{Code, CoreError};
use crate::infer::{
    BodyObject, CoreInput, CoreOutput, CoreRequest, DataType, ObjectPlace, SequenceFields,
    TensorData,
};
use crate::lane::call::{CallAnswer, CallMessage, CallTensor, LaneRegistry};
use crate::lane::channel::{Channel, GET_READY, GET_READY_POLL};
use crate::lane::completions::Completions;
use crate::lane::events::EventWriter;
use crate::lane::message::{BatchMessage, Outcome, ReplyMessage, Slot};
use crate::lane::response::Framing;
use crate::lane::sequence::{Controls, FlagControl, FlagKind};
use crate::lane::state::{StateSpec, StateValue};
use crate::lane::streams::{StreamMessage, StreamPart, Streamed};
use crate::lane::{
    Answer, BatchRunner, Batching, Body, Deliver, DriveEnd, GrpcForm, HttpReply, Lane, LaneItem,
    LaneTicket, Marks, Scheduling, Sink, Submitted, WorkerLink, no_body,
};

/// A duplicate of `fd`, owned by the core.
fn duplicate(fd: i32) -> PyResult<OwnedFd> {
    // SAFETY: dup takes any integer and returns a new descriptor or -1.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if copy < 0 {
        return Err(CoreError::system(&std::io::Error::last_os_error()).into());
    }
    // SAFETY: `copy` was just returned by fcntl and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

fn code_named(name: &str) -> PyResult<Code> {
    Code::ALL
        .into_iter()
        .find(|code| code.name() == name)
        .ok_or_else(|| CoreError::bad_value(format!("unknown code '{name}'")).into())
}

/// A `generate_stream` request's events, written by the core on its connection's writer
/// stream (see `Lane.submit`).
#[pyclass(name = "EventWriter", module = "tritonfast._core", frozen)]
pub(crate) struct PyEventWriter(Arc<EventWriter>);

#[pymethods]
impl PyEventWriter {
    #[new]
    fn new(stream: &Bound<'_, PyOutStream>) -> Self {
        Self(Arc::new(EventWriter::new(Arc::clone(&stream.get().0))))
    }

    /// Whether the answer's head and first event were written.
    #[getter]
    fn started(&self) -> bool {
        self.0.started()
    }

    /// When the first event was written (`time.perf_counter_ns()`); 0 before.
    #[getter]
    fn first_at(&self) -> u64 {
        self.0.first_at()
    }
}

/// The HTTP frontend's view of answered requests (one per server).
#[pyclass(name = "LaneCompletions", module = "tritonfast._core", frozen)]
pub(crate) struct PyLaneCompletions(pub(super) Arc<Completions>);

#[pymethods]
impl PyLaneCompletions {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(Self(Arc::new(
            Completions::new().map_err(|e| CoreError::system(&e))?,
        )))
    }

    /// The descriptor to watch for readability.
    fn fileno(&self) -> i32 {
        self.0.fd()
    }

    /// The tokens of the requests answered since the last call.
    fn take(&self) -> Vec<u64> {
        self.0.take()
    }
}

/// Answers external requests by calling the server's Python: `deliver` a batch's answers,
/// `streamed` (a decoupled model's lane) its streams' responses.
struct PyDeliver {
    deliver: Py<PyAny>,
    streamed: Option<Py<PyAny>>,
}

/// An answer as Python reads it: `("bytes", reply)`, `("ok", model_name, model_version, id,
/// parameters_json, [(name, datatype, shape, bytes, in_place)])` or `("error", code,
/// message)`.
fn described_answer(
    py: Python<'_>,
    result: Result<Answer, CoreError>,
) -> PyResult<Bound<'_, PyAny>> {
    Ok(match result {
        Ok(Answer::Encoded(reply)) => ("bytes", PyBytes::new(py, &reply))
            .into_pyobject(py)?
            .into_any(),
        Ok(Answer::Response(response)) => {
            let outputs = response
                .outputs
                .into_iter()
                .map(|o| {
                    let shape = PyTuple::new(py, o.shape)?;
                    let data = PyBytes::new(py, &o.data);
                    Ok((o.name, o.datatype, shape, data, o.in_place))
                })
                .collect::<PyResult<Vec<_>>>()?;
            (
                "ok",
                response.model_name,
                response.model_version,
                response.id,
                response.parameters,
                outputs,
            )
                .into_pyobject(py)?
                .into_any()
        }
        Err(error) => ("error", error.code.name(), error.message)
            .into_pyobject(py)?
            .into_any(),
    })
}

impl Deliver<Py<PyAny>> for PyDeliver {
    fn deliver(
        &self,
        results: Vec<(Py<PyAny>, Result<Answer, CoreError>)>,
        extra: Vec<u8>,
        marks: Marks,
    ) {
        Python::attach(|py| {
            let call = || -> PyResult<()> {
                let items = PyList::empty(py);
                for (sink, result) in results {
                    items.append((sink, described_answer(py, result)?))?;
                }
                self.deliver
                    .call1(py, (items, PyBytes::new(py, &extra), marks))?;
                Ok(())
            };
            if let Err(err) = call() {
                err.write_unraisable(py, None);
            }
        });
    }

    fn stream(&self, parts: Vec<Streamed<Py<PyAny>>>) {
        let Some(streamed) = &self.streamed else {
            return; // (a lane made without it is not decoupled: it streams nothing)
        };
        Python::attach(|py| {
            let call = || -> PyResult<()> {
                let items = PyList::empty(py);
                for (sink, answer, last) in parts {
                    let described = match answer {
                        Some(answer) => Some(described_answer(py, answer)?),
                        None => None,
                    };
                    items.append((sink.clone_ref(py), described, last))?;
                }
                streamed.call1(py, (items,))?;
                Ok(())
            };
            if let Err(err) = call() {
                err.write_unraisable(py, None);
            }
        });
    }
}

/// An HTTP request's body as Python hands it over: `bytes`, or a C-contiguous numpy array
/// of bytes (a large body received into a buffer of its own). Both stay alive and unwritten
/// for as long as the caller holds the object.
pub(super) fn request_body<'a>(body: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(bytes) = body.cast::<PyBytes>() {
        return Ok(bytes.as_bytes());
    }
    let (address, len) = contiguous_bytes(body)?;
    // SAFETY: the array is alive while `body` is borrowed, and its bytes are a received
    // request body that nothing writes to.
    Ok(unsafe { borrowed_bytes(address, len) })
}

/// What a submit of a request the core decodes gives Python: a `Ticket` once queued, None
/// when the reference path must take it, Triton's error raised for a refused one.
fn handed(py: Python<'_>, submitted: Submitted) -> PyResult<Option<PyLaneTicket>> {
    match submitted {
        Submitted::Queued(queued) => Ok(Some(ticket(queued))),
        Submitted::Reference => Ok(None),
        Submitted::Refused(error) => Err(to_py_err(py, &error)),
    }
}

/// Where the answer to an HTTP request handed over on `stream` goes.
pub(super) fn http_reply(
    stream: &Bound<'_, PyOutStream>,
    minor: u8,
    keep_alive: bool,
    token: u64,
) -> HttpReply {
    HttpReply {
        stream: Arc::clone(&stream.get().0),
        framing: Framing { minor, keep_alive },
        token,
        generate: false,
    }
}

/// A request body the core reads where Python holds it, keeping the object alive.
struct LentBody {
    _owner: Py<PyAny>,
    address: usize,
    len: usize,
}

impl AsRef<[u8]> for LentBody {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `_owner` (bytes, or an array over a received body nothing writes to any
        // more) keeps these bytes alive and unchanged for as long as this lives.
        unsafe { borrowed_bytes(self.address, self.len) }
    }
}

/// An HTTP request's body lent to the core (see [`request_body`]): not copied.
fn lent_body(body: &Bound<'_, PyAny>) -> PyResult<Body> {
    let bytes = request_body(body)?;
    Ok(Box::new(LentBody {
        _owner: body.clone().unbind(),
        address: bytes.as_ptr() as usize,
        len: bytes.len(),
    }))
}

/// A model version's lane: its queue, batches formed for its workers, answers written by the
/// core.
#[pyclass(name = "Lane", module = "tritonfast._core", frozen)]
pub(crate) struct PyLane {
    pub(super) inner: Arc<Lane<Py<PyAny>>>,
    /// A decoupled model's lane: `cancel_stream(instance, token)` tells a worker that the
    /// consumer of an open stream went away.
    cancel_stream: Option<Py<PyAny>>,
}

/// An input handed over from Python: `(name, datatype, shape, data)`, `data` a C-contiguous
/// numpy array of the tensor's wire bytes.
type PyInput<'py> = (String, String, Vec<u64>, Bound<'py, PyAny>, Option<PyPlace>);

/// A client's object place as Python describes it: `(path, device, inode, offset, byte_size)`.
type PyPlace = (String, u64, u64, u64, u64);

fn object_place((path, device, inode, offset, byte_size): PyPlace) -> ObjectPlace {
    ObjectPlace {
        path,
        device,
        inode,
        offset,
        byte_size,
    }
}

fn py_place(place: ObjectPlace) -> PyPlace {
    (
        place.path,
        place.device,
        place.inode,
        place.offset,
        place.byte_size,
    )
}

/// A request's handle, for `Lane.cancel`.
#[pyclass(
    name = "LaneTicket",
    module = "tritonfast._core",
    frozen,
    freelist = 256
)]
pub(crate) struct PyLaneTicket {
    inner: LaneTicket,
}

fn ticket(inner: LaneTicket) -> PyLaneTicket {
    PyLaneTicket { inner }
}

/// A START, END or READY control as Python describes it: its input's name, its kind
/// (`"start"`, `"end"`, `"ready"`), datatype, and its false and true values' bytes.
type PyFlagControl = (String, String, String, Vec<u8>, Vec<u8>);

/// An implicit state as Python describes it: its input's and output's names, datatype, and
/// its initial value's shape and bytes.
type PyStateSpec = (String, String, String, Vec<u64>, Vec<u8>);

/// The controls of a stateful model's requests: its flag controls, its CORRID control (name,
/// datatype), whether it batches, and its implicit states.
type PyControls = (
    Vec<PyFlagControl>,
    Option<(String, String)>,
    bool,
    Vec<PyStateSpec>,
);

fn datatype_named(name: &str) -> PyResult<DataType> {
    DataType::from_name(name)
        .ok_or_else(|| CoreError::bad_value(format!("unknown datatype '{name}'")).into())
}

fn controls_of((flags, corrid, batched, states): PyControls) -> PyResult<Controls> {
    let flags = flags
        .into_iter()
        .map(|(name, kind, datatype, off, on)| {
            let kind = match kind.as_str() {
                "start" => FlagKind::Start,
                "end" => FlagKind::End,
                "ready" => FlagKind::Ready,
                _ => return Err(CoreError::bad_value(format!("no control kind '{kind}'")).into()),
            };
            Ok(FlagControl {
                name,
                kind,
                datatype: datatype_named(&datatype)?,
                off,
                on,
            })
        })
        .collect::<PyResult<_>>()?;
    let corrid = match corrid {
        Some((name, datatype)) => Some((name, datatype_named(&datatype)?)),
        None => None,
    };
    let states = states
        .into_iter()
        .map(|(input, output, datatype, shape, bytes)| {
            Ok(StateSpec {
                input,
                output,
                datatype: datatype_named(&datatype)?,
                initial: StateValue {
                    shape,
                    bytes: Arc::new(bytes),
                },
            })
        })
        .collect::<PyResult<_>>()?;
    Ok(Controls {
        flags,
        corrid,
        batched,
        states,
    })
}

#[pymethods]
impl PyLane {
    /// `queue`: a queue made with the rules this lane's queue follows (its configuration is
    /// copied), or for a stateful model a `SequenceBatcher` (likewise) with its requests'
    /// `controls`; `deliver(items, extra, marks)` answers requests submitted from Python,
    /// called with a batch's `[(sink, result)]`, what its worker sent besides, and its compute
    /// marks (`perf_counter_ns` values: start, inputs handed over, outputs back, end);
    /// `regions`: the system shared-memory regions its requests may name (without, such
    /// requests take the reference path); `streamed(items)`: a decoupled model's lane, whose
    /// requests' responses are handed over as the worker sends them, `[(sink, result,
    /// final)]` (result None: a bare final flag), and `cancel_stream(instance, token)` tells
    /// a worker that the consumer of one of its open streams went away.
    #[new]
    #[pyo3(signature = (signature, model_version, queue, completions, deliver, *, dynamic, keyed_inputs, keyed_by_names, instances=0, registry=None, controls=None, regions=None, streamed=None, cancel_stream=None))]
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    fn new(
        signature: &Bound<'_, PyInferSignature>,
        model_version: String,
        queue: &Bound<'_, PyAny>,
        completions: &Bound<'_, PyLaneCompletions>,
        deliver: Py<PyAny>,
        dynamic: bool,
        keyed_inputs: Vec<String>,
        keyed_by_names: bool,
        instances: usize,
        registry: Option<&Bound<'_, PyLaneRegistry>>,
        controls: Option<PyControls>,
        regions: Option<&Bound<'_, PySharedMemoryRegistry>>,
        streamed: Option<Py<PyAny>>,
        cancel_stream: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let signature = signature.get().inner.clone();
        let completions = Arc::clone(&completions.get().0);
        let decoupled = streamed.is_some();
        let deliver = Box::new(PyDeliver { deliver, streamed });
        let scheduling = if let Ok(batcher) = queue.cast::<PySequenceBatcher>() {
            let controls = controls_of(controls.unwrap_or_default())?;
            Scheduling::Sequences(batcher.get().inner.config().clone(), controls)
        } else {
            let batching = Batching {
                dynamic,
                keyed_inputs,
                keyed_by_names,
            };
            let queue = queue.cast::<PyRequestQueue>()?.get().inner.config().clone();
            Scheduling::Queue(queue, batching)
        };
        let lane = Lane::new(model_version, signature, scheduling, completions, deliver)?;
        let lane = match registry {
            Some(registry) => lane.with_calls(instances, Arc::clone(&registry.get().0)),
            None => lane,
        };
        let lane = match regions {
            Some(regions) => lane.with_regions(regions.get().regions()),
            None => lane,
        };
        let lane = if decoupled { lane.decoupled() } else { lane };
        Ok(Self {
            inner: Arc::new(lane),
            cancel_stream,
        })
    }

    /// An HTTP request for this model: decoded, checked and queued without the GIL; its answer
    /// is written on `stream` and `token` handed to the completions. `body_object`: the
    /// shared-memory object `(path, device, inode)` the body was received into, from its
    /// start, where the worker reads its large inputs. A `Ticket` once queued; None when the
    /// reference path must take it; raises Triton's error for a refused one.
    #[pyo3(signature = (body, json_length, stream, minor, keep_alive, token, body_object=None))]
    #[allow(clippy::too_many_arguments)]
    fn submit_http(
        &self,
        py: Python<'_>,
        body: &Bound<'_, PyAny>,
        json_length: usize,
        stream: &Bound<'_, PyOutStream>,
        minor: u8,
        keep_alive: bool,
        token: u64,
        body_object: Option<(String, u64, u64)>,
    ) -> PyResult<Option<PyLaneTicket>> {
        let body = lent_body(body)?;
        let reply = http_reply(stream, minor, keep_alive, token);
        let object = body_object.map(|(path, device, inode)| BodyObject {
            path,
            device,
            inode,
        });
        let lane = &self.inner;
        handed(
            py,
            py.detach(|| lane.submit_http(body, json_length, reply, object.as_ref())),
        )
    }

    /// A `generate` body (bytes, or a C-contiguous numpy array of bytes) for this model,
    /// decoded, checked and queued without the GIL; its answer (the generate extension's JSON)
    /// is written on `stream` and `token` handed to the completions. A `Ticket` once queued;
    /// None when the reference path must take it; raises Triton's error for a refused one.
    fn submit_generate_http(
        &self,
        py: Python<'_>,
        body: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyOutStream>,
        minor: u8,
        keep_alive: bool,
        token: u64,
    ) -> PyResult<Option<PyLaneTicket>> {
        let body = lent_body(body)?;
        let reply = HttpReply {
            generate: true,
            ..http_reply(stream, minor, keep_alive, token)
        };
        let lane = &self.inner;
        handed(
            py,
            py.detach(move || lane.submit_generate_http((*body).as_ref(), reply)),
        )
    }

    /// A gRPC `ModelInferRequest` as received, decoded and queued without the GIL; its reply,
    /// serialized (`stream`: as the `ModelStreamInferResponse` of a stream's request), is
    /// handed to `deliver` with `sink`, or, with `replies`, a decoupled model's replies are
    /// queued on the stream's call by the core (`deliver` hears of the end, of replies it
    /// must encode, and of the call to start sending on: a response None that is not the
    /// last). A `Ticket` once queued; None when the reference path must take it; raises
    /// Triton's error when it cannot be queued.
    #[pyo3(signature = (message, sink, stream=false, replies=None))]
    fn submit_grpc(
        &self,
        py: Python<'_>,
        message: &Bound<'_, PyBytes>,
        sink: Py<PyAny>,
        stream: bool,
        replies: Option<&Bound<'_, PyRequestReplies>>,
    ) -> PyResult<Option<PyLaneTicket>> {
        let message = lent_body(message)?;
        let lane = &self.inner;
        if let Some(replies) = replies {
            let replies = Arc::clone(&replies.get().0);
            return handed(
                py,
                py.detach(|| lane.submit_grpc_replies(message, sink, replies)),
            );
        }
        let form = if stream {
            GrpcForm::Stream
        } else {
            GrpcForm::Unary
        };
        handed(py, py.detach(|| lane.submit_grpc(message, sink, form)))
    }

    /// A `generate_stream` body the connection hands over whole (bytes, or a C-contiguous
    /// numpy array of bytes), for a decoupled model: decoded, checked and queued without the
    /// GIL, its answer written on `stream` (keep-alive HTTP/1.1) by the core alone, `token`
    /// handed to the completions once it is. A `Ticket` once queued; None when the reference
    /// path must take it; raises Triton's error for a refused one.
    fn submit_generate_events(
        &self,
        py: Python<'_>,
        body: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyOutStream>,
        token: u64,
    ) -> PyResult<Option<PyLaneTicket>> {
        let body = lent_body(body)?;
        let stream = Arc::clone(&stream.get().0);
        let nobody = py.None();
        let lane = &self.inner;
        handed(
            py,
            py.detach(move || lane.submit_generate_events((*body).as_ref(), stream, token, nobody)),
        )
    }

    /// A request the server's Python decoded and checked; `sink` is handed back to `deliver`
    /// with its result. `sequence`: a stateful model's request's correlation ID (int or str)
    /// and START and END flags. `events`: a `generate_stream` request's writer, which writes
    /// a decoupled model's responses as events (`deliver` then gets only the end).
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    #[pyo3(signature = (request_id, inputs, outputs, output_places, parameters, priority, timeout_us, batch_size, sink, trace=0, sequence=None, events=None))]
    fn submit(
        &self,
        request_id: String,
        inputs: Vec<PyInput<'_>>,
        outputs: Option<Vec<String>>,
        output_places: Option<Vec<(String, PyPlace)>>,
        parameters: String,
        priority: u64,
        timeout_us: u64,
        batch_size: u64,
        sink: Py<PyAny>,
        trace: u64,
        sequence: Option<(Bound<'_, PyAny>, bool, bool)>,
        events: Option<PyRef<'_, PyEventWriter>>,
    ) -> PyResult<PyLaneTicket> {
        let sequence = match sequence {
            Some((id, start, end)) => Some(SequenceFields {
                id: correlation_id_of(&id)?,
                start,
                end,
            }),
            None => None,
        };
        let inputs = inputs
            .into_iter()
            .map(|(name, datatype, shape, data, place)| {
                let (address, len) = contiguous_bytes(&data)?;
                let data = match place {
                    // Read by the worker where it lies.
                    Some(place) => TensorData::Placed(object_place(place), len as u64),
                    // SAFETY: `data` is alive and not written while it is copied here (the GIL
                    // is held).
                    None => TensorData::Owned(unsafe { borrowed_bytes(address, len) }.to_vec()),
                };
                Ok(CoreInput {
                    name,
                    datatype: datatype_named(&datatype)?,
                    shape,
                    data,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let request = CoreRequest {
            id: request_id,
            inputs,
            outputs: outputs.map(CoreOutput::named),
            binary_default: false,
            priority: Some(priority),
            timeout_us: Some(timeout_us),
            output_places: output_places
                .unwrap_or_default()
                .into_iter()
                .map(|(name, place)| (name, object_place(place)))
                .collect(),
            body_object: None,
            trace,
            sequence,
            empty_final: None,
        };
        let item = LaneItem {
            request,
            body: no_body(),
            parameters,
            sink: match events {
                Some(writer) => Sink::Events(sink, Arc::clone(&writer.0)),
                None => Sink::External(sink),
            },
        };
        Ok(ticket(self.inner.submit(item, batch_size)?))
    }

    /// Removes a queued request (True); or raises a running one's cancellation flag; or,
    /// for a decoupled request whose batch returned, has its worker told (`cancel_stream`).
    fn cancel(&self, py: Python<'_>, ticket: &Bound<'_, PyLaneTicket>) -> PyResult<bool> {
        let ticket = &ticket.get().inner;
        if self.inner.cancel(ticket)? {
            return Ok(true);
        }
        if let Some(cancel_stream) = &self.cancel_stream
            && let Some((instance, token)) = self.inner.stream_of(ticket)
        {
            cancel_stream.call1(py, (instance, token))?;
        }
        Ok(false)
    }

    /// Ends every open stream with the error.
    fn end_streams(&self, py: Python<'_>, code: &str, message: String) -> PyResult<()> {
        let error = CoreError::new(code_named(code)?, message);
        let lane = &self.inner;
        py.detach(|| lane.end_streams(&error));
        Ok(())
    }

    /// Whether its model's responses are streamed.
    #[getter]
    fn decoupled(&self) -> bool {
        self.inner.is_decoupled()
    }

    /// Submits fail from now on; drivers run what is queued, then return.
    fn close(&self) {
        self.inner.close();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Runs instance `instance`'s batches on the worker behind `link` (GIL released) until
    /// the queue is closed and empty (`"closed"`), or the worker goes away during a batch
    /// (`"died"`: answer that batch with `fail_held`).
    fn drive(
        &self,
        py: Python<'_>,
        instance: usize,
        link: &Bound<'_, PyLaneWorkerLink>,
    ) -> &'static str {
        let lane = &self.inner;
        let link = &link.get().0;
        let end = py.detach(|| lane.drive(instance, &mut link.lock()));
        match end {
            DriveEnd::Closed => "closed",
            DriveEnd::Died => "died",
        }
    }

    /// Whether instance `instance` runs a batch now.
    fn running(&self, instance: usize) -> bool {
        self.inner.running(instance)
    }

    /// A call instance `instance`'s model made through Python began (True) or ended.
    fn calling(&self, instance: usize, began: bool) {
        let calls = self.inner.calls_of(instance);
        if began {
            calls.fetch_add(1, Ordering::AcqRel);
        } else {
            calls.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether every instance runs a batch that waits on a call to the server.
    fn stuck(&self) -> bool {
        self.inner.stuck()
    }

    /// Answers the batch instance `instance`'s worker died in.
    fn fail_held(
        &self,
        py: Python<'_>,
        instance: usize,
        code: &str,
        message: String,
    ) -> PyResult<()> {
        let error = CoreError::new(code_named(code)?, message);
        let lane = &self.inner;
        py.detach(|| lane.fail_held(instance, &error));
        Ok(())
    }

    /// Waits up to `timeout_s` for instance `instance`'s next batch and answers it with the
    /// error: whether one was; None once the queue is closed and empty.
    fn fail_next(
        &self,
        py: Python<'_>,
        instance: usize,
        code: &str,
        message: String,
        timeout_s: f64,
    ) -> PyResult<Option<bool>> {
        let error = CoreError::new(code_named(code)?, message);
        let lane = &self.inner;
        let timeout = Duration::from_secs_f64(timeout_s.max(0.0));
        Ok(py.detach(|| lane.fail_next(instance, &error, timeout)))
    }

    /// Closes the queue and answers what is in it, and every held batch, with the error.
    fn abandon(&self, py: Python<'_>, code: &str, message: String) -> PyResult<()> {
        let error = CoreError::new(code_named(code)?, message);
        let lane = &self.inner;
        py.detach(|| lane.abandon(&error));
        Ok(())
    }

    /// The statistics, as `RequestQueue.statistics()`.
    fn statistics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        snapshot_dict(py, &self.inner.stats().snapshot())
    }

    #[allow(clippy::needless_pass_by_value)]
    fn latency_summaries<'py>(
        &self,
        py: Python<'py>,
        quantiles: Vec<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        summaries_dict(py, self.inner.stats(), &quantiles)
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }
}

/// The lanes of a server's models, by name and version, for calls its models make.
#[pyclass(name = "LaneRegistry", module = "tritonfast._core", frozen)]
pub(crate) struct PyLaneRegistry(pub(super) Arc<LaneRegistry<Py<PyAny>>>);

#[pymethods]
impl PyLaneRegistry {
    #[new]
    fn new() -> Self {
        Self(Arc::default())
    }

    /// `model`'s lanes from now on, `{version: lane}`, and its default version; an empty
    /// dict: calls to it go through Python.
    #[allow(clippy::needless_pass_by_value)]
    fn set(&self, model: &str, versions: HashMap<String, Bound<'_, PyLane>>, default: String) {
        let versions = versions
            .into_iter()
            .map(|(version, lane)| (version, Arc::clone(&lane.get().inner)))
            .collect();
        self.0.set(model, versions, default);
    }
}

/// The server's end of one worker's channel, and the segments its batches travel in.
#[pyclass(name = "LaneWorkerLink", module = "tritonfast._core", frozen)]
pub(crate) struct PyLaneWorkerLink(Mutex<WorkerLink>);

#[pymethods]
impl PyLaneWorkerLink {
    /// `fd`: the server's end of the channel (duplicated); the segments of its batches carry
    /// `tag` in their names; `died_message`: what a decoupled request's stream ends with when
    /// the worker goes away first.
    #[new]
    #[pyo3(signature = (fd, tag, died_message=None))]
    fn new(fd: i32, tag: &str, died_message: Option<String>) -> PyResult<Self> {
        let link = WorkerLink::new(duplicate(fd)?, tag)?;
        let link = match died_message {
            Some(message) => link.with_died_message(message),
            None => link,
        };
        Ok(Self(Mutex::new(link)))
    }

    /// An instance in this process: `runner(batch)` runs each batch (on the driver thread,
    /// with the GIL) and returns `(segment, segment_len, data, results)`, as a worker replies; an
    /// exception it raises fails the batch with INTERNAL and its text.
    #[staticmethod]
    fn in_process(runner: Py<PyAny>, tag: &str) -> PyResult<Self> {
        let link = WorkerLink::in_process(Box::new(PyRunner(runner)), tag)?;
        Ok(Self(Mutex::new(link)))
    }
}

/// The worker's end of its channel.
#[pyclass(name = "LaneWorkerChannel", module = "tritonfast._core", frozen)]
pub(crate) struct PyLaneWorkerChannel(Channel);

/// A slot as the worker's Python reads it: `(name, datatype, shape, offset, nbytes, place)`.
type PySlot<'py> = (
    String,
    String,
    Bound<'py, PyTuple>,
    u64,
    u64,
    Option<PyPlace>,
);

fn py_slot(py: Python<'_>, slot: Slot) -> PyResult<PySlot<'_>> {
    Ok((
        slot.name,
        slot.datatype,
        PyTuple::new(py, slot.shape)?,
        slot.offset,
        slot.len,
        slot.place.map(py_place),
    ))
}

#[pymethods]
impl PyLaneWorkerChannel {
    #[new]
    fn new(fd: i32) -> PyResult<Self> {
        Ok(Self(Channel::new(duplicate(fd)?)))
    }

    /// Waits (GIL released) for the next batch: `(model_name, model_version, segment,
    /// segment_len, cancel_segment, cancel_len, requests)`, each request `(id,
    /// parameters_json, output_names, slots, output_places, trace, stream)`; None when `pipe_fd` became
    /// readable first (something other than a batch came).
    fn next<'py>(&self, py: Python<'py>, pipe_fd: i32) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let channel = &self.0;
        let message = without_gil(py, || {
            loop {
                if !channel.wait(pipe_fd)? {
                    return Ok(None);
                }
                let message = channel.recv()?;
                if message == GET_READY {
                    channel.poll_for(GET_READY_POLL);
                    continue;
                }
                return Ok(Some(BatchMessage::decode(&message)?));
            }
        })?;
        let Some(message) = message else {
            return Ok(None);
        };
        Ok(Some(batch_tuple(py, message)?))
    }

    /// Makes a call to another model over the channel and waits for its answer (GIL
    /// released): `("ok", model_name, model_version, id, parameters_json, [(name, datatype,
    /// shape, bytes)])`, `("not_run" | "error", code, message)`, or `("reroute",)` (make it
    /// through the server's Python). Inputs as `(name, datatype, shape, data)`, `data` bytes
    /// or a C-contiguous uint8 array.
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    fn call<'py>(
        &self,
        py: Python<'py>,
        model_name: String,
        model_version: String,
        request_id: String,
        parameters: String,
        priority: u64,
        timeout_us: u64,
        outputs: Option<Vec<String>>,
        inputs: Vec<(String, String, Vec<i64>, Bound<'py, PyAny>)>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let inputs = inputs
            .iter()
            .map(|(name, datatype, shape, data)| {
                Ok(CallTensor {
                    name: name.clone(),
                    datatype: datatype.clone(),
                    shape: shape.clone(),
                    data: request_body(data)?.to_vec(),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let message = CallMessage {
            model_name,
            model_version,
            id: request_id,
            parameters,
            priority,
            timeout_us,
            outputs,
            inputs,
        }
        .encode();
        let channel = &self.0;
        let answer = without_gil(py, || {
            channel.send(&message)?;
            CallAnswer::decode(&channel.recv()?)
        })?;
        let described = match answer {
            CallAnswer::Response {
                model_name,
                model_version,
                id,
                parameters,
                outputs,
            } => {
                let outputs = outputs
                    .into_iter()
                    .map(|t| {
                        Ok((
                            t.name,
                            t.datatype,
                            PyTuple::new(py, t.shape)?,
                            PyBytes::new(py, &t.data),
                        ))
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                ("ok", model_name, model_version, id, parameters, outputs).into_pyobject(py)?
            }
            CallAnswer::NotRun(code, message) => {
                ("not_run", code.name(), message).into_pyobject(py)?
            }
            CallAnswer::Error(code, message) => {
                ("error", code.name(), message).into_pyobject(py)?
            }
            CallAnswer::Reroute => ("reroute",).into_pyobject(py)?,
        };
        Ok(described)
    }

    /// Sends a decoupled model's responses, `[(token, described, final)]`: `described` is
    /// `("ok", model_name, model_version, id, parameters_json, [(name, datatype, shape,
    /// data)])` (`data` bytes or a C-contiguous uint8 array), `("error", code, message)`, or
    /// None for a bare final flag. Any thread of the worker's may send (GIL released).
    fn stream(&self, py: Python<'_>, items: &Bound<'_, PyList>) -> PyResult<()> {
        let message = stream_message(items)?.encode();
        let channel = &self.0;
        without_gil(py, || channel.send(&message))
    }

    /// Sends a batch's reply: `results` holds `("ok", model_name, model_version, id,
    /// parameters_json, slots)` or `("error", code, message)` per request, slots as
    /// `(name, datatype, shape, offset, nbytes, ...)`; their offsets are in `segment`, or, with
    /// none, in `data`.
    fn reply(
        &self,
        py: Python<'_>,
        segment: String,
        segment_len: u64,
        data: &[u8],
        results: &Bound<'_, PyList>,
        extra: &[u8],
    ) -> PyResult<()> {
        let message = reply_message(segment, segment_len, data, results, extra)?.encode();
        let channel = &self.0;
        without_gil(py, || channel.send(&message))
    }
}

/// A batch as the worker's Python reads it: `(model_name, model_version, segment,
/// segment_len, cancel_segment, cancel_len, requests)`, each request `(id, parameters_json,
/// output_names, slots, output_places, trace, stream)` (`stream`: the token of a decoupled
/// request's responses, else 0).
fn batch_tuple(py: Python<'_>, message: BatchMessage) -> PyResult<Bound<'_, PyTuple>> {
    let requests = message
        .requests
        .into_iter()
        .map(|r| {
            let slots = r
                .inputs
                .into_iter()
                .map(|s| py_slot(py, s))
                .collect::<PyResult<Vec<_>>>()?;
            let places: Option<HashMap<String, PyPlace>> =
                (!r.output_places.is_empty()).then(|| {
                    let places = r.output_places.into_iter();
                    places
                        .map(|(name, place)| (name, py_place(place)))
                        .collect()
                });
            Ok((
                r.id,
                r.parameters,
                r.outputs,
                slots,
                places,
                r.trace,
                r.stream,
            ))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let fields = (
        message.model_name,
        message.model_version,
        message.segment,
        message.segment_len,
        message.cancel_segment,
        message.cancel_len,
        requests,
    );
    fields.into_pyobject(py)
}

/// A batch's reply from the worker's Python: `results` holds `("ok", model_name,
/// model_version, id, parameters_json, slots)`, `("error", code, message)` or
/// `("streamed",)` (answered through its stream) per request, slots as `(name, datatype,
/// shape, offset, nbytes, place)`; the outputs' bytes in `segment`, or, with none, in `data`.
fn reply_message(
    segment: String,
    segment_len: u64,
    data: &[u8],
    results: &Bound<'_, PyList>,
    extra: &[u8],
) -> PyResult<ReplyMessage> {
    // (Each result's tuple is read item by item in place: 0.38 µs a result, where PyO3's
    // generic indexing and tuple extraction take 0.65.)
    let mut outcomes = Vec::with_capacity(results.len());
    for result in results.iter() {
        let described = result.cast::<PyTuple>()?;
        let kind = described.get_borrowed_item(0)?;
        let kind = kind.cast::<PyString>()?;
        let kind = kind.to_str()?;
        outcomes.push(if kind == "streamed" {
            Outcome::Streamed
        } else if kind == "ok" {
            let outputs = described
                .get_borrowed_item(5)?
                .try_iter()?
                .map(|slot| reply_slot(&slot?))
                .collect::<PyResult<Vec<_>>>()?;
            Outcome::Response {
                model_name: text_at(described, 1)?,
                model_version: text_at(described, 2)?,
                id: text_at(described, 3)?,
                parameters: text_at(described, 4)?,
                outputs,
            }
        } else {
            error_outcome(&result)?
        });
    }
    Ok(ReplyMessage {
        segment,
        segment_len,
        data: data.to_vec(),
        results: outcomes,
        extra: extra.to_vec(),
    })
}

/// Item `index` of a tuple of the worker's Python, a `str`.
fn text_at(tuple: &Bound<'_, PyTuple>, index: usize) -> PyResult<String> {
    Ok(tuple
        .get_borrowed_item(index)?
        .cast::<PyString>()?
        .to_str()?
        .to_owned())
}

/// An output's slot as the worker's Python describes it: `(name, datatype, shape, offset,
/// nbytes, place)`.
fn reply_slot(slot: &Bound<'_, PyAny>) -> PyResult<Slot> {
    let slot = slot.cast::<PyTuple>()?;
    let shape = slot.get_borrowed_item(2)?;
    let shape = match shape.cast::<PyTuple>() {
        Ok(dims) => dims
            .iter_borrowed()
            .map(pyo3::Borrowed::extract::<i64>)
            .collect::<PyResult<Vec<_>>>()?,
        Err(_) => shape.extract()?,
    };
    let place = slot.get_borrowed_item(5)?;
    Ok(Slot {
        name: text_at(slot, 0)?,
        datatype: text_at(slot, 1)?,
        shape,
        offset: slot.get_borrowed_item(3)?.extract()?,
        len: slot.get_borrowed_item(4)?.extract()?,
        place: if place.is_none() {
            None
        } else {
            Some(object_place(place.extract::<PyPlace>()?))
        },
    })
}

/// A failed request's result as the worker's Python describes it: `("error", code, message)`.
fn error_outcome(described: &Bound<'_, PyAny>) -> PyResult<Outcome> {
    let (_, code, message): (String, String, String) = described.extract()?;
    Ok(Outcome::Error(code_named(&code)?, message))
}

/// A streamed response as the worker's Python describes it: `("ok", model_name,
/// model_version, id, parameters_json, [(name, datatype, shape, data)])`.
type PyStreamed<'py> = (
    String,
    String,
    String,
    String,
    String,
    Vec<(String, String, Vec<i64>, Bound<'py, PyAny>)>,
);

/// Streamed responses from the worker's Python (see `PyLaneWorkerChannel::stream`): their
/// tensors' bytes laid one after another in the message's data.
fn stream_message(items: &Bound<'_, PyList>) -> PyResult<StreamMessage> {
    let mut message = StreamMessage::default();
    for item in items.iter() {
        let (token, described, last): (u64, Option<Bound<'_, PyTuple>>, bool) = item.extract()?;
        let outcome = match described {
            None => None,
            Some(described) => {
                let kind: String = described.get_item(0)?.extract()?;
                Some(if kind == "ok" {
                    let (_, model_name, model_version, id, parameters, tensors): PyStreamed<'_> =
                        described.extract()?;
                    let mut outputs = Vec::with_capacity(tensors.len());
                    for (name, datatype, shape, data) in tensors {
                        let bytes = request_body(&data)?;
                        outputs.push(Slot {
                            name,
                            datatype,
                            shape,
                            offset: message.data.len() as u64,
                            len: bytes.len() as u64,
                            place: None,
                        });
                        message.data.extend_from_slice(bytes);
                    }
                    Outcome::Response {
                        model_name,
                        model_version,
                        id,
                        parameters,
                        outputs,
                    }
                } else {
                    error_outcome(&described)?
                })
            }
        };
        message.parts.push(StreamPart {
            token,
            outcome,
            last,
        });
    }
    Ok(message)
}

/// An instance in the server's process, run by a Python callable with the GIL: it gets each
/// batch as [`batch_tuple`] and returns `(segment, segment_len, data, results)` as
/// [`reply_message`] reads them.
struct PyRunner(Py<PyAny>);

impl BatchRunner for PyRunner {
    fn run(&self, batch: BatchMessage) -> Result<ReplyMessage, CoreError> {
        Python::attach(|py| {
            let reply = (|| {
                let returned = self.0.call1(py, (batch_tuple(py, batch)?,))?;
                let (segment, segment_len, data, results): (
                    String,
                    u64,
                    Bound<'_, PyBytes>,
                    Bound<'_, PyList>,
                ) = returned.extract(py)?;
                reply_message(segment, segment_len, data.as_bytes(), &results, &[])
            })();
            reply.map_err(|error| CoreError::internal(error.value(py).to_string()))
        })
    }
}
