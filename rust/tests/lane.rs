//! A lane driven end to end against a stand-in worker (a thread speaking the worker's side of
//! the channel, as the worker process's Python does): requests from Python and from HTTP
//! connections answered, statistics counted, a worker that goes away failing only its batch,
//! a closed lane ending its driver, a stateful model's requests handed over with their
//! controls.

// Sizes here are small, and the test runs on 64-bit Linux only.
#![allow(clippy::cast_possible_truncation)]

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tritonfast_core::error::{Code, CoreError};
use tritonfast_core::infer::{
    CoreInput, CoreRequest, DataType, SequenceFields, Signature, TensorData, TensorSpec,
};
use tritonfast_core::lane::call::{CallAnswer, CallMessage, CallTensor, LaneRegistry};
use tritonfast_core::lane::channel::Channel;
use tritonfast_core::lane::completions::Completions;
use tritonfast_core::lane::message::{BatchMessage, Outcome, ReplyMessage, Slot};
use tritonfast_core::lane::response::Framing;
use tritonfast_core::lane::sequence::{Controls, FlagControl, FlagKind};
use tritonfast_core::lane::streams::Streamed;
use tritonfast_core::lane::{
    Answer, Batching, Deliver, DriveEnd, HttpReply, Lane, LaneItem, Marks, Scheduling, Sink,
    Submitted, WorkerLink,
};
use tritonfast_core::outbox::{Outbox, Stream};
use tritonfast_core::queue::QueueConfig;
use tritonfast_core::sequence::{CorrelationId, SequenceConfig, Strategy};
use tritonfast_core::shm::{AttachedSegment, OwnedSegment};

/// Numbers the stand-in workers' segments (tests run side by side in one process).
static SERIALS: AtomicU64 = AtomicU64::new(1);

type Delivered = Arc<Mutex<Vec<(u32, Result<Answer, CoreError>)>>>;

struct Collect(Delivered);

impl Deliver<u32> for Collect {
    fn deliver(&self, results: Vec<(u32, Result<Answer, CoreError>)>, _: Vec<u8>, _: Marks) {
        self.0.lock().extend(results);
    }

    fn stream(&self, parts: Vec<Streamed<u32>>) {
        panic!(
            "a lane that is not decoupled streamed {} responses",
            parts.len()
        );
    }
}

/// The signature of an identity model: FP32 `INPUT0` of any length -> `OUTPUT0`, batching up
/// to `max_batch_size`.
fn fp32_identity(model: &str, max_batch_size: u64) -> Signature {
    let spec = TensorSpec {
        name: "INPUT0".into(),
        datatype: "FP32".into(),
        dims: vec![-1],
        optional: false,
    };
    Signature::new(model, max_batch_size, vec![spec], vec!["OUTPUT0".into()])
}

fn lane() -> (Arc<Lane<u32>>, Delivered, Arc<Completions>) {
    let signature = fp32_identity("identity", 8);
    let delivered = Delivered::default();
    let completions = Arc::new(Completions::new().unwrap());
    let lane = Lane::new(
        "1".into(),
        signature,
        Scheduling::Queue(QueueConfig::default(), Batching::default()),
        Arc::clone(&completions),
        Box::new(Collect(Arc::clone(&delivered))),
    )
    .unwrap();
    (Arc::new(lane), delivered, completions)
}

/// The worker's side: answers each batch with its inputs as outputs named `OUTPUT0` (in its
/// segment, and every other batch's in the reply itself), until the channel closes or
/// `batches` batches are answered (then it goes away without replying to the next one).
fn worker(end: UnixStream, batches: usize) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let channel = Channel::new(end.into());
        let mut answered = 0;
        // The last reply's segment: the server maps it by name, and reads it before it sends
        // the next batch.
        let mut kept: Option<OwnedSegment> = None;
        while let Ok(message) = channel.recv() {
            if answered == batches {
                return;
            }
            let batch = BatchMessage::decode(&message).unwrap();
            let inputs =
                AttachedSegment::attach(&batch.segment, batch.segment_len as usize).unwrap();
            let total: u64 = batch
                .requests
                .iter()
                .flat_map(|r| &r.inputs)
                .map(|s| s.len)
                .sum();
            let serial = SERIALS.fetch_add(1, Ordering::Relaxed);
            let name = format!("tritonfast-out-lanetest-{}-{serial}", std::process::id());
            let outputs = OwnedSegment::create(&name, (total as usize).max(64)).unwrap();
            let inline = answered % 2 == 1;
            let mut data = Vec::new();
            let mut offset = 0;
            let mut results = Vec::new();
            for request in &batch.requests {
                let mut slots = Vec::new();
                for slot in &request.inputs {
                    // SAFETY: both segments are mapped and hold these ranges.
                    unsafe {
                        let from = inputs.start().add(slot.offset as usize);
                        if inline {
                            data.extend_from_slice(std::slice::from_raw_parts(
                                from,
                                slot.len as usize,
                            ));
                        } else {
                            std::ptr::copy_nonoverlapping(
                                from,
                                outputs.start().add(offset),
                                slot.len as usize,
                            );
                        }
                    }
                    slots.push(Slot {
                        name: "OUTPUT0".into(),
                        offset: offset as u64,
                        ..slot.clone()
                    });
                    offset += slot.len as usize;
                }
                results.push(Outcome::Response {
                    model_name: batch.model_name.clone(),
                    model_version: batch.model_version.clone(),
                    id: request.id.clone(),
                    parameters: String::new(),
                    outputs: slots,
                });
            }
            let (segment, segment_len) = if inline {
                (String::new(), 0)
            } else {
                let name = outputs.name().trim_start_matches('/').to_owned();
                (name, outputs.len() as u64)
            };
            let reply = ReplyMessage {
                segment,
                segment_len,
                data,
                results,
                extra: Vec::new(),
            };
            channel.send(&reply.encode()).unwrap();
            answered += 1;
            kept = Some(outputs);
        }
        drop(kept);
    })
}

fn fp32(values: &[f32]) -> LaneItem<u32> {
    LaneItem {
        request: CoreRequest {
            inputs: vec![CoreInput {
                name: "INPUT0".into(),
                datatype: DataType::Fp32,
                shape: vec![1, values.len() as u64],
                data: TensorData::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            }],
            ..CoreRequest::default()
        },
        body: tritonfast_core::lane::no_body(),
        parameters: String::new(),
        sink: Sink::External(values.len() as u32),
    }
}

fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Where an HTTP request's answer goes: `stream`, keep-alive HTTP/1.1.
fn reply_on(stream: Arc<Stream>, token: u64, generate: bool) -> HttpReply {
    HttpReply {
        stream,
        framing: Framing {
            minor: 1,
            keep_alive: true,
        },
        token,
        generate,
    }
}

fn read_answer(client: &mut UnixStream) -> String {
    let mut answer = vec![0; 4096];
    let n = client.read(&mut answer).unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[test]
fn requests_from_python_and_http_are_answered_by_the_worker() {
    let (lane, delivered, completions) = lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let stand_in = worker(worker_end, usize::MAX);
    let mut link = WorkerLink::new(server_end.into(), "lanetest").unwrap();
    let driver = {
        let lane = Arc::clone(&lane);
        thread::spawn(move || lane.drive(0, &mut link))
    };

    lane.submit(fp32(&[1.0, 2.0]), 1).unwrap();
    wait_until(|| !delivered.lock().is_empty());
    let (sink, response) = delivered.lock().pop().unwrap();
    assert_eq!(sink, 2);
    let Ok(Answer::Response(response)) = response else {
        panic!("no response")
    };
    let output = &response.outputs[0];
    assert_eq!(
        output.data,
        [1f32, 2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>()
    );

    // An HTTP request: decoded from its body, answered on its connection.
    let outbox = Outbox::new().unwrap();
    let (mut client, connection) = UnixStream::pair().unwrap();
    let stream = outbox.open(connection.as_fd()).unwrap();
    let body =
        br#"{"id":"a","inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,2],"data":[3,4]}]}"#;
    let reply = reply_on(stream, 7, false);
    assert!(matches!(
        lane.submit_http(Box::new(body.to_vec()), body.len(), reply, None),
        Submitted::Queued(_)
    ));
    wait_until(|| completions.take() == [7]);
    let answer = read_answer(&mut client);
    assert!(
        answer.starts_with("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"),
        "{answer}"
    );
    assert!(answer.ends_with(
        r#"{"id":"a","model_name":"identity","model_version":"1","outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[1,2],"data":[3.0,4.0]}]}"#
    ), "{answer}");

    // A request its model refuses is answered by the decoder, never queued.
    let wrong = br#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[3,4]}]}"#;
    let (_, other) = UnixStream::pair().unwrap();
    let reply = reply_on(outbox.open(other.as_fd()).unwrap(), 8, false);
    assert!(matches!(
        lane.submit_http(Box::new(wrong.to_vec()), wrong.len(), reply, None),
        Submitted::Refused(_)
    ));

    // A `generate` request: its body decoded by the generate extension's rules, its answer
    // that extension's flat object (parameters go to the model, not into the answer).
    let body = br#"{"INPUT0":[5,6],"id":"g","max_tokens":2}"#;
    let reply = reply_on(outbox.open(connection.as_fd()).unwrap(), 9, true);
    assert!(matches!(
        lane.submit_generate_http(body, reply),
        Submitted::Queued(_)
    ));
    wait_until(|| completions.take() == [9]);
    let answer = read_answer(&mut client);
    assert!(
        answer.starts_with("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with(
            r#"{"OUTPUT0":[5.0,6.0],"id":"g","model_name":"identity","model_version":"1"}"#
        ),
        "{answer}"
    );

    let stats = lane.stats().snapshot();
    assert_eq!(stats.success.count, 3);
    lane.close();
    assert_eq!(driver.join().unwrap(), DriveEnd::Closed);
    drop(lane);
    stand_in.join().unwrap();
}

#[test]
fn a_worker_that_goes_away_fails_only_its_batch() {
    let (lane, delivered, _) = lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let stand_in = worker(worker_end, 1); // answers one batch, then goes away
    let mut link = WorkerLink::new(server_end.into(), "lanetest").unwrap();
    lane.submit(fp32(&[1.0]), 1).unwrap();
    let driver = {
        let lane = Arc::clone(&lane);
        thread::spawn(move || {
            let end = lane.drive(0, &mut link);
            (end, link)
        })
    };
    wait_until(|| delivered.lock().len() == 1);
    lane.submit(fp32(&[1.0, 2.0, 3.0]), 1).unwrap();
    let (end, _link) = driver.join().unwrap();
    assert_eq!(end, DriveEnd::Died);
    stand_in.join().unwrap();
    lane.fail_held(0, &CoreError::new(Code::Internal, "the worker exited"));
    let results = std::mem::take(&mut *delivered.lock());
    assert_eq!(results.len(), 2);
    assert!(results[0].1.is_ok());
    let (sink, failed) = &results[1];
    assert_eq!(*sink, 3);
    assert_eq!(failed.as_ref().unwrap_err().message, "the worker exited");
    // With no worker to run them, later batches fail with why, until the lane is closed.
    lane.submit(fp32(&[5.0]), 1).unwrap();
    let error = CoreError::new(Code::Internal, "could not be started again");
    assert_eq!(
        lane.fail_next(0, &error, Duration::from_secs(5)),
        Some(true)
    );
    lane.close();
    assert_eq!(lane.fail_next(0, &error, Duration::from_secs(5)), None);
    assert_eq!(delivered.lock().len(), 1);
    let stats = lane.stats().snapshot();
    assert_eq!((stats.success.count, stats.fail.count), (1, 2));
}

/// A lane of `identity` (FP32 in, FP32 out) named `model`, taking calls through `registry`.
fn calling_lane(model: &str, registry: &Arc<LaneRegistry<u32>>) -> (Arc<Lane<u32>>, Delivered) {
    let signature = fp32_identity(model, 8);
    let delivered = Delivered::default();
    let lane = Lane::new(
        "1".into(),
        signature,
        Scheduling::Queue(QueueConfig::default(), Batching::default()),
        Arc::new(Completions::new().unwrap()),
        Box::new(Collect(Arc::clone(&delivered))),
    )
    .unwrap()
    .with_calls(1, Arc::clone(registry));
    (Arc::new(lane), delivered)
}

/// A worker whose model calls the model its request's id names, with the request's input,
/// and answers with what the call came to (as an error's text, which the test reads).
fn calling_worker(end: UnixStream) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let channel = Channel::new(end.into());
        while let Ok(message) = channel.recv() {
            let batch = BatchMessage::decode(&message).unwrap();
            let inputs =
                AttachedSegment::attach(&batch.segment, batch.segment_len as usize).unwrap();
            let mut results = Vec::new();
            for request in &batch.requests {
                let slot = &request.inputs[0];
                // SAFETY: the segment is mapped and holds the slot's range.
                let data = unsafe {
                    std::slice::from_raw_parts(
                        inputs.start().add(slot.offset as usize),
                        slot.len as usize,
                    )
                };
                let call = CallMessage {
                    model_name: request.id.clone(),
                    model_version: String::new(),
                    id: "call".into(),
                    parameters: String::new(),
                    priority: 0,
                    timeout_us: 0,
                    outputs: None,
                    inputs: vec![CallTensor {
                        name: "INPUT0".into(),
                        datatype: "FP32".into(),
                        shape: slot.shape.clone(),
                        data: data.to_vec(),
                    }],
                };
                channel.send(&call.encode()).unwrap();
                let answer = CallAnswer::decode(&channel.recv().unwrap()).unwrap();
                let text = match answer {
                    CallAnswer::Response { outputs, .. } => format!("ok {:?}", outputs[0].data),
                    CallAnswer::NotRun(code, message) => {
                        format!("not_run {} {message}", code.name())
                    }
                    CallAnswer::Error(code, message) => format!("error {} {message}", code.name()),
                    CallAnswer::Reroute => "reroute".into(),
                };
                results.push(Outcome::Error(Code::Internal, text));
            }
            let reply = ReplyMessage {
                segment: String::new(),
                segment_len: 0,
                data: Vec::new(),
                results,
                extra: Vec::new(),
            };
            channel.send(&reply.encode()).unwrap();
        }
    })
}

#[test]
fn calls_a_model_makes_are_queued_in_their_targets_lane_and_answered_on_its_channel() {
    let registry = Arc::new(LaneRegistry::<u32>::default());
    let (target, _) = calling_lane("identity", &registry);
    let (caller, delivered) = calling_lane("caller", &registry);
    let mut drivers = Vec::new();
    let mut workers = Vec::new();
    for (lane, calls) in [(&target, false), (&caller, true)] {
        let (server_end, worker_end) = UnixStream::pair().unwrap();
        workers.push(if calls {
            calling_worker(worker_end)
        } else {
            worker(worker_end, usize::MAX)
        });
        let mut link = WorkerLink::new(server_end.into(), "lanetest").unwrap();
        let lane = Arc::clone(lane);
        drivers.push(thread::spawn(move || lane.drive(0, &mut link)));
    }
    for (model, lane) in [("identity", &target), ("caller", &caller)] {
        let versions = [("1".to_owned(), Arc::clone(lane))].into_iter().collect();
        registry.set(model, versions, "1".into());
    }

    let mut answers = Vec::new();
    for (target_name, sink) in [("identity", 1), ("caller", 2), ("nope", 3)] {
        let mut item = fp32(&[1.5]);
        item.request.id = target_name.into();
        item.sink = Sink::External(sink);
        caller.submit(item, 1).unwrap();
        wait_until(|| !delivered.lock().is_empty());
        let (_, result) = delivered.lock().pop().unwrap();
        answers.push(result.unwrap_err().message);
    }
    assert_eq!(answers[0], format!("ok {:?}", 1.5f32.to_le_bytes()));
    // A model calling itself with its only instance waiting: refused, not left to hang.
    assert!(
        answers[1].starts_with("not_run UNAVAILABLE model 'caller' cannot take this call"),
        "{}",
        answers[1]
    );
    // Not a model on a lane: the worker makes the call through Python.
    assert_eq!(answers[2], "reroute");
    assert_eq!(target.stats().snapshot().success.count, 1);
    assert!(!caller.stuck());

    registry.set("identity", std::collections::HashMap::new(), String::new());
    registry.set("caller", std::collections::HashMap::new(), String::new());
    for lane in [&target, &caller] {
        lane.close();
    }
    for driver in drivers {
        assert_eq!(driver.join().unwrap(), DriveEnd::Closed);
    }
    drop((target, caller));
    for worker in workers {
        worker.join().unwrap();
    }
}

/// A stateful model's lane: INT32 START/END/READY controls and a UINT64 CORRID, direct
/// strategy, two slots on one instance.
fn sequence_lane() -> (Arc<Lane<u32>>, Delivered) {
    let signature = fp32_identity("counter", 2);
    let flag = |name: &str, kind| FlagControl {
        name: name.into(),
        kind,
        datatype: DataType::Int32,
        off: 0i32.to_le_bytes().to_vec(),
        on: 1i32.to_le_bytes().to_vec(),
    };
    let controls = Controls {
        flags: vec![
            flag("START", FlagKind::Start),
            flag("END", FlagKind::End),
            flag("READY", FlagKind::Ready),
        ],
        corrid: Some(("CORRID".into(), DataType::Uint64)),
        batched: true,
        states: Vec::new(),
    };
    let config = SequenceConfig {
        model: "counter".into(),
        instances: 1,
        max_batch_size: 2,
        strategy: Strategy::Direct {
            max_queue_delay: Duration::ZERO,
            minimum_slot_utilization: 0.0,
        },
        max_sequence_idle: Duration::from_mins(1),
        latency_summaries: false,
    };
    let delivered = Delivered::default();
    let lane = Lane::new(
        "1".into(),
        signature,
        Scheduling::Sequences(config, controls),
        Arc::new(Completions::new().unwrap()),
        Box::new(Collect(Arc::clone(&delivered))),
    )
    .unwrap();
    (Arc::new(lane), delivered)
}

fn in_sequence(value: f32, id: u64, start: bool, end: bool, sink: u32) -> LaneItem<u32> {
    let mut item = fp32(&[value]);
    item.request.sequence = Some(SequenceFields {
        id: CorrelationId::Number(id),
        start,
        end,
    });
    item.sink = Sink::External(sink);
    item
}

/// A request's tensors as the stand-in worker echoed them: its input, then its controls.
fn echoed(answer: &Result<Answer, CoreError>) -> Vec<Vec<u8>> {
    let Ok(Answer::Response(response)) = answer else {
        panic!("no response: {answer:?}")
    };
    response.outputs.iter().map(|o| o.data.clone()).collect()
}

#[test]
fn a_sequence_lane_adds_the_controls_and_answers_no_null_request() {
    let (lane, delivered) = sequence_lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let stand_in = worker(worker_end, usize::MAX);
    let mut link = WorkerLink::new(server_end.into(), "lanetest").unwrap();
    let driver = {
        let lane = Arc::clone(&lane);
        thread::spawn(move || lane.drive(0, &mut link))
    };
    let int32 = |v: i32| v.to_le_bytes().to_vec();
    // Sequence 5 takes slot 0, sequence 9 slot 1; once 5 ended, 9's requests run with a
    // null request in slot 0 (answered to nobody, not counted).
    for (item, answers) in [
        (in_sequence(1.0, 5, true, false, 1), 1),
        (in_sequence(2.0, 9, true, false, 2), 2),
        (in_sequence(3.0, 5, false, true, 3), 3),
        (in_sequence(4.0, 9, false, true, 4), 4),
    ] {
        lane.submit(item, 1).unwrap();
        wait_until(|| delivered.lock().len() == answers);
    }
    let answered = delivered.lock().clone();
    assert_eq!(
        answered.iter().map(|(sink, _)| *sink).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    let (start, end, ready) = (int32(1), int32(1), int32(1));
    let (off, id) = (int32(0), |n: u64| n.to_le_bytes().to_vec());
    assert_eq!(
        echoed(&answered[0].1)[1..],
        [start.clone(), off.clone(), ready.clone(), id(5)]
    );
    assert_eq!(
        echoed(&answered[2].1)[1..],
        [off.clone(), end, ready.clone(), id(5)]
    );
    assert_eq!(
        echoed(&answered[3].1)[1..],
        [off.clone(), int32(1), ready, id(9)]
    );
    assert_eq!(lane.stats().snapshot().success.count, 4);

    // A request of no live sequence is refused, and nothing is queued.
    let refused = lane
        .submit(in_sequence(5.0, 7, false, false, 5), 1)
        .unwrap_err();
    assert_eq!(refused.code, Code::InvalidArg);
    assert!(lane.is_empty());

    lane.close();
    assert_eq!(driver.join().unwrap(), DriveEnd::Closed);
    drop(lane);
    stand_in.join().unwrap();
}
