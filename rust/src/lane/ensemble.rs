//! Ensembles whose steps all run on lanes, run by the core: a request to such an ensemble is
//! decoded against the ensemble's signature, each step whose inputs exist goes into its model's
//! lane as a request of its own (checked against the step model's signature first), and each
//! step's outputs, arriving on that lane's driver thread, start the steps that waited for them.
//! Once the outputs the client asked for all exist, the driver thread that produced the last of
//! them answers the client, as it answers its own model's requests: no Python runs between the
//! ensemble's request and its answer.
//!
//! The rules are the reference scheduler's (`backends/ensemble/scheduler.py`): steps no wanted
//! output depends on never run; a step that fails fails the request with the step's code and
//! message, prefixed `in ensemble '<name>', `; the steps still queued are cancelled; a batch
//! dimension of 1 is added to a step's inputs (and taken off its outputs) when the step batches
//! and the ensemble does not, and the other way round. A request the core cannot start whole
//! (its decoder leaves it to the reference path, or a step refuses it at the start) goes to the
//! reference path, which words the error.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::LaneTicket;
use super::call::LaneRegistry;
use super::grpcreply::{GrpcForm, grpc_answer};
use super::message::Slot;
use super::response::{HttpAnswer, ResponseParts, error_answer, response_answer};
use super::segment::aligned;
use super::{
    Answer, HttpReply, Lane, LaneItem, OwnedResponse, Sink, nanos, no_body, reference_parameters,
};
use crate::error::{Code, CoreError};
use crate::infer::{
    CoreInput, CoreOutput, CoreRequest, DataType, Decoded, Signature, TensorData, decode_grpc,
    decode_http,
};

/// One step of an ensemble: its model, found in the server's [`LaneRegistry`] when a request
/// starts (so a step model reloaded is the new version's lane from the next request on).
#[derive(Debug, Clone)]
pub struct EnsembleStep {
    pub model: String,
    /// Empty for the model's default version.
    pub version: String,
    /// (the step model's input, the ensemble tensor it takes)
    pub inputs: Vec<(String, String)>,
    /// (the step model's output, the ensemble tensor it becomes)
    pub outputs: Vec<(String, String)>,
}

/// The lane a request's step runs on.
struct StepLane<E> {
    lane: Arc<Lane<E>>,
    /// +1: a batch dimension of 1 is added to the step's inputs and taken off its outputs (the
    /// step batches, the ensemble does not); -1: the other way round; 0: alike.
    change: i8,
}

/// An ensemble's own statistics, in the reference scheduler's terms.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub success: u64,
    pub success_ns: u64,
    pub fail: u64,
    pub fail_ns: u64,
    /// Requests' batch sizes, summed.
    pub inferences: u64,
    /// When a request last succeeded, milliseconds since the epoch.
    pub last_ms: u64,
    /// The successful requests' steps' times, summed.
    pub spent: Spent,
}

/// Time a request's steps spent queued and computing, in nanoseconds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    pub queue: u64,
    pub compute_input: u64,
    pub compute_infer: u64,
    pub compute_output: u64,
}

impl Spent {
    fn add(&mut self, other: &Spent) {
        self.queue += other.queue;
        self.compute_input += other.compute_input;
        self.compute_infer += other.compute_infer;
        self.compute_output += other.compute_output;
    }
}

/// The counts of an ensemble's core runs.
#[derive(Debug, Default)]
struct EnsembleCounts(Mutex<Counts>);

impl EnsembleCounts {
    pub fn snapshot(&self) -> Counts {
        *self.0.lock()
    }

    fn succeeded(&self, elapsed: Duration, batch_size: u64, spent: &Spent) {
        let mut counts = self.0.lock();
        counts.success += 1;
        counts.success_ns += nanos(elapsed);
        counts.inferences += batch_size.max(1);
        counts.last_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        counts.spent.add(spent);
    }

    fn failed(&self, elapsed: Duration) {
        let mut counts = self.0.lock();
        counts.fail += 1;
        counts.fail_ns += nanos(elapsed);
    }
}

/// An ensemble version whose steps all run on lanes.
pub struct Ensemble<E> {
    name: String,
    version: String,
    signature: Signature,
    /// Its outputs, in the configuration's order (a request naming none gets these).
    outputs: Vec<String>,
    steps: Vec<EnsembleStep>,
    registry: Arc<LaneRegistry<E>>,
    counts: EnsembleCounts,
}

/// What [`Ensemble::submit_http`] and [`Ensemble::submit_grpc`] did with a request.
#[derive(Debug)]
pub enum Started<E> {
    Running(Arc<EnsembleRun<E>>),
    /// Not one the core takes on whole: the reference path decides.
    Reference,
}

/// A request's answer, ready for the driver thread that finished it to send.
#[derive(Debug)]
pub enum Ended<E> {
    /// An HTTP answer to write on its connection.
    Http(HttpReply, Vec<u8>),
    /// A gRPC call's result, for the lane's [`super::Deliver`].
    External(E, Result<Answer, CoreError>),
}

/// A tensor between steps.
#[derive(Debug, Clone)]
struct Tensor {
    datatype: DataType,
    shape: Vec<u64>,
    data: Arc<Vec<u8>>,
}

/// One request running through an ensemble.
pub struct EnsembleRun<E> {
    ensemble: Arc<Ensemble<E>>,
    /// Per step, the lane it runs on (found as the request started).
    lanes: Vec<StepLane<E>>,
    /// The client's request, its inputs moved into the run's tensors.
    request: CoreRequest,
    batch_size: u64,
    /// The parameters each step's model sees (the request's `priority` and `timeout`).
    parameters: String,
    /// The outputs the request wants, in the order they are answered.
    wanted: Vec<String>,
    begun: Instant,
    state: Mutex<RunState<E>>,
}

struct RunState<E> {
    /// Where the answer goes; None once the request is answered (or never will be).
    sink: Option<Sink<E>>,
    tensors: HashMap<String, Tensor>,
    /// Per step: started already (or never to run: no wanted output depends on it).
    started: Vec<bool>,
    /// Per step: its ticket while it is in its lane.
    running: Vec<Option<LaneTicket>>,
    spent: Spent,
    cancelled: bool,
}

/// A step's request in a lane: answered to its run.
pub struct StepSink<E> {
    run: Arc<EnsembleRun<E>>,
    step: usize,
}

impl<E> std::fmt::Debug for Ensemble<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ensemble")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<E> std::fmt::Debug for EnsembleRun<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnsembleRun")
            .field("ensemble", &self.ensemble.name)
            .field("id", &self.request.id)
            .finish_non_exhaustive()
    }
}

impl<E> std::fmt::Debug for StepSink<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepSink")
            .field("ensemble", &self.run.ensemble.name)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl<E: Send + Sync> StepSink<E> {
    /// The step's result, on the driver thread that ran it (or failed it): the run's answer
    /// when this was what it waited for.
    pub fn answered(
        self,
        result: Result<OwnedResponse, CoreError>,
        spent: &Spent,
    ) -> Option<Ended<E>> {
        self.run.step_answered(self.step, result, spent)
    }
}

impl<E: Send + Sync> Ensemble<E> {
    /// `outputs`: the ensemble's outputs in its configuration's order; `steps`: every step,
    /// their models looked up in `registry`.
    pub fn new(
        version: String,
        signature: Signature,
        outputs: Vec<String>,
        steps: Vec<EnsembleStep>,
        registry: Arc<LaneRegistry<E>>,
    ) -> Self {
        Ensemble {
            name: signature.model().to_owned(),
            version,
            signature,
            outputs,
            steps,
            registry,
            counts: EnsembleCounts::default(),
        }
    }

    /// What its requests that the core ran came to.
    pub fn counts(&self) -> Counts {
        self.counts.snapshot()
    }

    /// The lanes of its steps now; None when one of them is not on a lane (not loaded,
    /// answered from the response cache, or not a model the core drives): found before a
    /// request is decoded, so that one the core cannot run is decoded only by the reference
    /// path.
    fn lanes(&self) -> Option<Vec<StepLane<E>>> {
        let batches = self.signature.max_batch_size() > 0;
        let mut lanes = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            // (A sequence model's requests need the ensemble's correlation ID: Python's; a
            // decoupled model's streamed responses are Python's to route.)
            let lane = self
                .registry
                .find(&step.model, &step.version)
                .filter(|lane| !lane.is_sequence() && !lane.is_decoupled())?;
            let change = match (lane.signature().max_batch_size() > 0, batches) {
                (true, false) => 1,
                (false, true) => -1,
                _ => 0,
            };
            lanes.push(StepLane { lane, change });
        }
        Some(lanes)
    }

    /// Decodes an HTTP request's body (its JSON header `json_length` bytes) and starts it.
    pub fn submit_http(
        self: &Arc<Self>,
        body: &[u8],
        json_length: usize,
        reply: HttpReply,
    ) -> Started<E> {
        let Some(lanes) = self.lanes() else {
            return Started::Reference;
        };
        match decode_http(body, json_length, &self.signature) {
            Decoded::Request(request, batch_size) => {
                self.start(request, body, batch_size, lanes, Sink::Http(reply))
            }
            Decoded::Refused(_) | Decoded::Reference => Started::Reference,
        }
    }

    /// Decodes a gRPC `ModelInferRequest` (as received) and starts it; its serialized reply
    /// goes to the [`super::Deliver`] of the lane whose step finishes it, with `sink`.
    pub fn submit_grpc(self: &Arc<Self>, message: &[u8], sink: E) -> Started<E> {
        let Some(lanes) = self.lanes() else {
            return Started::Reference;
        };
        match decode_grpc(message, &self.signature, false) {
            Decoded::Request(request, batch_size) => {
                let sink = Sink::Grpc(sink, GrpcForm::Unary);
                self.start(request, message, batch_size, lanes, sink)
            }
            Decoded::Refused(_) | Decoded::Reference => Started::Reference,
        }
    }

    fn start(
        self: &Arc<Self>,
        mut request: CoreRequest,
        body: &[u8],
        batch_size: u64,
        lanes: Vec<StepLane<E>>,
        sink: Sink<E>,
    ) -> Started<E> {
        if request.uses_regions() {
            return Started::Reference; // shared memory: the reference path's
        }
        let mut tensors = HashMap::with_capacity(request.inputs.len());
        for input in request.inputs.drain(..) {
            let data = match input.data {
                TensorData::Owned(bytes) => Arc::new(bytes),
                TensorData::Shared(bytes) => bytes,
                TensorData::Body(range) => Arc::new(body[range].to_vec()),
                TensorData::Placed(..) | TensorData::Region(_) | TensorData::Window(_) => {
                    return Started::Reference;
                }
            };
            let tensor = Tensor {
                datatype: input.datatype,
                shape: input.shape,
                data,
            };
            tensors.insert(input.name, tensor);
        }
        let wanted: Vec<String> = match &request.outputs {
            Some(outputs) => outputs.iter().map(|o| o.name.clone()).collect(),
            None => self.outputs.clone(),
        };
        let needed = self.needed_for(&wanted);
        let parameters = if request.priority.is_some() || request.timeout_us.is_some() {
            reference_parameters(&request)
        } else {
            String::new()
        };
        let run = Arc::new(EnsembleRun {
            ensemble: Arc::clone(self),
            lanes,
            request,
            batch_size,
            parameters,
            wanted,
            begun: Instant::now(),
            state: Mutex::new(RunState {
                sink: Some(sink),
                tensors,
                started: needed.iter().map(|n| !n).collect(),
                running: vec![None; self.steps.len()],
                spent: Spent::default(),
                cancelled: false,
            }),
        });
        let mut state = run.state.lock();
        // Unless a step is under way now (nothing to run, or a step refused), the reference
        // path answers it; steps that did start run for nothing: their answers find the run
        // over.
        if !matches!(run.advance(&mut state), Ok(false)) {
            state.sink = None;
            run.cancel_steps(&mut state);
            return Started::Reference;
        }
        drop(state);
        Started::Running(run)
    }

    /// The steps the tensors `wanted` depend on (the others need not run).
    fn needed_for(&self, wanted: &[String]) -> Vec<bool> {
        let mut needed = vec![false; self.steps.len()];
        let mut open: Vec<&str> = wanted.iter().map(String::as_str).collect();
        while let Some(tensor) = open.pop() {
            let producer = self
                .steps
                .iter()
                .position(|s| s.outputs.iter().any(|(_, t)| t == tensor));
            if let Some(index) = producer
                && !needed[index]
            {
                needed[index] = true;
                open.extend(self.steps[index].inputs.iter().map(|(_, t)| t.as_str()));
            }
        }
        needed
    }

    fn step_error(&self, error: &CoreError) -> CoreError {
        CoreError::new(
            error.code,
            format!("in ensemble '{}', {}", self.name, error.message),
        )
    }

    /// Stops `run`'s steps that have not started; true when it will not be answered (none of
    /// its steps was running), false when it will be (cancelled) once its running steps end.
    pub fn cancel(run: &Arc<EnsembleRun<E>>) -> bool {
        let mut state = run.state.lock();
        if state.sink.is_none() {
            return false;
        }
        state.cancelled = true;
        run.cancel_steps(&mut state);
        if state.running.iter().all(Option::is_none) {
            state.sink = None;
            return true;
        }
        false
    }
}

impl<E: Send + Sync> EnsembleRun<E> {
    /// Starts every step whose inputs exist: true when none runs and none can start (the
    /// request is complete, or stuck); an error when a step's request is refused.
    fn advance(self: &Arc<Self>, state: &mut RunState<E>) -> Result<bool, CoreError> {
        let ensemble = &self.ensemble;
        let ready: Vec<usize> = (0..ensemble.steps.len())
            .filter(|&i| {
                !state.started[i]
                    && ensemble.steps[i]
                        .inputs
                        .iter()
                        .all(|(_, tensor)| state.tensors.contains_key(tensor))
            })
            .collect();
        // Every ready step's request is checked before any is queued.
        let mut requests = Vec::with_capacity(ready.len());
        for &index in &ready {
            state.started[index] = true;
            requests.push((index, self.step_request(index, state)?));
        }
        for (index, (request, batch_size)) in requests {
            let item = LaneItem {
                request,
                body: no_body(),
                parameters: self.parameters.clone(),
                sink: Sink::Step(StepSink {
                    run: Arc::clone(self),
                    step: index,
                }),
            };
            let ticket = self.lanes[index]
                .lane
                .submit(item, batch_size)
                .map_err(|error| ensemble.step_error(&error))?;
            state.running[index] = Some(ticket);
        }
        Ok(state.running.iter().all(Option::is_none))
    }

    /// Step `index`'s request with the tensors there are, and its batch size; the step model's
    /// refusal, as the ensemble's.
    fn step_request(
        &self,
        index: usize,
        state: &RunState<E>,
    ) -> Result<(CoreRequest, u64), CoreError> {
        let step = &self.ensemble.steps[index];
        let StepLane { lane, change } = &self.lanes[index];
        let inputs = step
            .inputs
            .iter()
            .map(|(model_input, tensor)| {
                let tensor = &state.tensors[tensor];
                CoreInput {
                    name: model_input.clone(),
                    datatype: tensor.datatype,
                    shape: rebatched(&tensor.shape, *change),
                    data: TensorData::Shared(Arc::clone(&tensor.data)),
                }
            })
            .collect();
        let request = CoreRequest {
            id: self.request.id.clone(),
            inputs,
            outputs: Some(
                step.outputs
                    .iter()
                    .map(|(name, _)| CoreOutput {
                        name: name.clone(),
                        binary: false,
                        region: None,
                    })
                    .collect(),
            ),
            binary_default: false,
            priority: self.request.priority,
            timeout_us: self.request.timeout_us,
            output_places: Vec::new(),
            body_object: None,
            trace: 0,
            sequence: None,
            empty_final: None,
        };
        let batch_size = lane
            .signature()
            .check(&request)
            .map_err(|error| self.ensemble.step_error(&error))?;
        Ok((request, batch_size))
    }

    fn step_answered(
        self: &Arc<Self>,
        index: usize,
        result: Result<OwnedResponse, CoreError>,
        spent: &Spent,
    ) -> Option<Ended<E>> {
        let mut state = self.state.lock();
        state.running[index] = None;
        state.sink.as_ref()?;
        if state.cancelled {
            if state.running.iter().any(Option::is_some) {
                return None;
            }
            let error = CoreError::new(Code::Cancelled, "Request was cancelled");
            return self.answer(&mut state, Err(self.ensemble.step_error(&error)));
        }
        let advanced = result
            .map_err(|error| self.ensemble.step_error(&error))
            .and_then(|response| self.take_outputs(index, response, &mut state))
            .and_then(|()| {
                state.spent.add(spent);
                self.advance(&mut state)
            });
        match advanced {
            Ok(false) => None,
            Ok(true) => self.finish(&mut state),
            Err(error) => {
                self.cancel_steps(&mut state);
                self.answer(&mut state, Err(error))
            }
        }
    }

    /// A step's outputs, under their ensemble names from now on.
    fn take_outputs(
        &self,
        index: usize,
        response: OwnedResponse,
        state: &mut RunState<E>,
    ) -> Result<(), CoreError> {
        let step = &self.ensemble.steps[index];
        let change = self.lanes[index].change;
        let mut produced: HashMap<String, _> = response
            .outputs
            .into_iter()
            .map(|o| (o.name.clone(), o))
            .collect();
        for (model_output, tensor) in &step.outputs {
            let missing = || {
                CoreError::internal(format!(
                    "in ensemble '{}', model '{}' did not produce output '{model_output}'",
                    self.ensemble.name, step.model
                ))
            };
            let output = produced.remove(model_output).ok_or_else(missing)?;
            let datatype = DataType::from_name(&output.datatype).ok_or_else(missing)?;
            let shape = output
                .shape
                .iter()
                .map(|&d| u64::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| missing())?;
            let tensor_value = Tensor {
                datatype,
                shape: rebatched(&shape, -change),
                data: Arc::new(output.data),
            };
            state.tensors.insert(tensor.clone(), tensor_value);
        }
        Ok(())
    }

    /// Stops the steps still queued (those running end on their own; the run ignores them).
    fn cancel_steps(&self, state: &mut RunState<E>) {
        for (step, running) in self.lanes.iter().zip(state.running.iter_mut()) {
            if let Some(ticket) = running
                && step.lane.cancel(ticket).unwrap_or(false)
            {
                *running = None;
            }
        }
    }

    /// Nothing left to run: the wanted outputs are the answer.
    fn finish(&self, state: &mut RunState<E>) -> Option<Ended<E>> {
        if self
            .wanted
            .iter()
            .any(|name| !state.tensors.contains_key(name))
        {
            let error = CoreError::internal(format!(
                "in ensemble '{}', unexpected deadlock, at least one output is not set while no \
                 more ensemble steps can be made",
                self.ensemble.name
            ));
            return self.answer(state, Err(error));
        }
        self.answer(state, Ok(()))
    }

    /// Answers the request: with the wanted outputs, or `failed`.
    fn answer(&self, state: &mut RunState<E>, failed: Result<(), CoreError>) -> Option<Ended<E>> {
        let sink = state.sink.take()?;
        let counts = &self.ensemble.counts;
        let elapsed = self.begun.elapsed();
        let response = failed.map(|()| {
            counts.succeeded(elapsed, self.batch_size, &state.spent);
            self.response(&state.tensors)
        });
        if response.is_err() {
            counts.failed(elapsed);
        }

        match sink {
            Sink::Http(reply) => {
                let framing = reply.framing;
                let answer = response
                    .and_then(|built| {
                        response_answer(&self.request, &parts_of(&self.ensemble, &built), framing)
                            .map(HttpAnswer::into_bytes)
                    })
                    .unwrap_or_else(|error| error_answer(&error, framing));
                Some(Ended::Http(reply, answer))
            }
            Sink::Grpc(sink, _)
            | Sink::Replies(sink, _)
            | Sink::External(sink)
            | Sink::Events(sink, _) => {
                let answer = response.and_then(|built| {
                    grpc_answer(
                        &self.request,
                        &parts_of(&self.ensemble, &built),
                        GrpcForm::Unary,
                        true,
                    )?
                    .map(Answer::Encoded)
                    .ok_or_else(|| CoreError::internal("an ensemble answer with parameters"))
                });
                Some(Ended::External(sink, answer))
            }
            Sink::Step(_) | Sink::Call(_) => None,
        }
    }

    /// The wanted outputs laid out one after another, and where each lies.
    fn response(&self, tensors: &HashMap<String, Tensor>) -> (Vec<Slot>, Vec<u8>) {
        let mut segment = Vec::new();
        let mut slots = Vec::with_capacity(self.wanted.len());
        for name in &self.wanted {
            let tensor = &tensors[name];
            let offset = aligned(segment.len());
            segment.resize(offset, 0);
            segment.extend_from_slice(&tensor.data);
            slots.push(Slot {
                name: name.clone(),
                datatype: tensor.datatype.name().to_owned(),
                shape: tensor
                    .shape
                    .iter()
                    .map(|&d| i64::try_from(d).unwrap_or(i64::MAX))
                    .collect(),
                offset: offset as u64,
                len: tensor.data.len() as u64,
                place: None,
            });
        }
        (slots, segment)
    }
}

/// An ensemble's response with `built`'s outputs.
fn parts_of<'a, E>(
    ensemble: &'a Ensemble<E>,
    built: &'a (Vec<Slot>, Vec<u8>),
) -> ResponseParts<'a> {
    ResponseParts {
        model_name: &ensemble.name,
        model_version: &ensemble.version,
        id: "",
        parameters: "",
        outputs: &built.0,
        segment: &built.1,
        body: &[],
    }
}

/// `shape` with a batch dimension of 1 added (`change` +1) or taken off (-1, when it has one).
fn rebatched(shape: &[u64], change: i8) -> Vec<u64> {
    match change {
        1 => std::iter::once(1).chain(shape.iter().copied()).collect(),
        -1 if shape.first() == Some(&1) => shape[1..].to_vec(),
        _ => shape.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::rebatched;

    #[test]
    fn batch_dimensions_are_added_and_taken_off() {
        assert_eq!(rebatched(&[4], 1), vec![1, 4]);
        assert_eq!(rebatched(&[1, 4], -1), vec![4]);
        assert_eq!(rebatched(&[2, 4], -1), vec![2, 4]);
        assert_eq!(rebatched(&[2, 4], 0), vec![2, 4]);
    }
}
