//! A decoupled model's lane driven end to end against a stand-in worker: each request's
//! responses arrive after its batch's reply, as the model's threads would send them; a
//! consumer that goes away is named to the caller; a worker that goes away ends the streams
//! still open; a closed lane's driver waits for the open streams to end.

// Sizes here are small, and the test runs on 64-bit Linux only.
#![allow(clippy::cast_possible_truncation)]

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tritonfast_core::error::{Code, CoreError};
use tritonfast_core::infer::{CoreInput, CoreRequest, DataType, Signature, TensorData, TensorSpec};
use tritonfast_core::lane::channel::Channel;
use tritonfast_core::lane::completions::Completions;
use tritonfast_core::lane::message::{BatchMessage, Outcome, ReplyMessage, Slot};
use tritonfast_core::lane::streams::{StreamMessage, StreamPart, Streamed};
use tritonfast_core::lane::{
    Answer, Batching, Deliver, DriveEnd, GrpcForm, Lane, LaneItem, Marks, Scheduling, Sink,
    Submitted, WorkerLink,
};
use tritonfast_core::queue::QueueConfig;
use tritonfast_core::shm::AttachedSegment;

/// What reached each sink: its responses (None: a bare final flag) and final flags.
type Parts = Arc<Mutex<Vec<(u32, Option<Result<Answer, CoreError>>, bool)>>>;

struct CollectStreams(Parts);

impl Deliver<u32> for CollectStreams {
    fn deliver(&self, results: Vec<(u32, Result<Answer, CoreError>)>, _: Vec<u8>, _: Marks) {
        assert!(
            results.is_empty(),
            "a decoupled lane answered {results:?} whole"
        );
    }

    fn stream(&self, parts: Vec<Streamed<u32>>) {
        let mut all = self.0.lock();
        for (sink, answer, last) in parts {
            all.push((*sink, answer, last));
        }
    }
}

fn decoupled_lane() -> (Arc<Lane<u32>>, Parts) {
    let spec = TensorSpec {
        name: "IN".into(),
        datatype: "INT32".into(),
        dims: vec![-1],
        optional: false,
    };
    let signature = Signature::new("repeat", 0, vec![spec], vec!["OUT".into()]);
    let parts = Parts::default();
    let lane = Lane::new(
        "1".into(),
        signature,
        Scheduling::Queue(QueueConfig::default(), Batching::default()),
        Arc::new(Completions::new().unwrap()),
        Box::new(CollectStreams(Arc::clone(&parts))),
    )
    .unwrap()
    .decoupled();
    (Arc::new(lane), parts)
}

fn int32s(sink: u32, values: &[i32]) -> LaneItem<u32> {
    LaneItem {
        request: CoreRequest {
            inputs: vec![CoreInput {
                name: "IN".into(),
                datatype: DataType::Int32,
                shape: vec![values.len() as u64],
                data: TensorData::Owned(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            }],
            ..CoreRequest::default()
        },
        body: tritonfast_core::lane::no_body(),
        parameters: String::new(),
        sink: Sink::External(sink),
    }
}

/// A decoupled batch's reply: its `count` requests all answered through their streams.
fn streamed_reply(count: usize) -> Vec<u8> {
    let reply = ReplyMessage {
        segment: String::new(),
        segment_len: 0,
        data: Vec::new(),
        results: vec![Outcome::Streamed; count],
        extra: Vec::new(),
    };
    reply.encode()
}

/// A stream's bare final flag, as the worker sends it.
fn final_flag(token: u64) -> Vec<u8> {
    let last = StreamMessage {
        data: Vec::new(),
        parts: vec![StreamPart {
            token,
            outcome: None,
            last: true,
        }],
    };
    last.encode()
}

/// Instance 0's driver on its own thread.
fn drive(lane: &Arc<Lane<u32>>, mut link: WorkerLink) -> thread::JoinHandle<DriveEnd> {
    let lane = Arc::clone(lane);
    thread::spawn(move || lane.drive(0, &mut link))
}

/// The worker's side of a repeat model: replies to each batch at once (every request
/// streamed), then sends each request's values one response each, then a bare final flag;
/// with `die_early`, goes away after the first response instead.
fn repeat_worker(end: UnixStream, die_early: bool) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let channel = Channel::new(end.into());
        while let Ok(message) = channel.recv() {
            let batch = BatchMessage::decode(&message).unwrap();
            let inputs =
                AttachedSegment::attach(&batch.segment, batch.segment_len as usize).unwrap();
            // The requests outlive the batch: their values are read before the reply.
            let requests: Vec<(u64, Vec<u8>)> = batch
                .requests
                .iter()
                .map(|request| {
                    let slot = &request.inputs[0];
                    // SAFETY: the segment is mapped and holds the slot's range.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            inputs.start().add(slot.offset as usize),
                            slot.len as usize,
                        )
                    };
                    (request.stream, bytes.to_vec())
                })
                .collect();
            assert!(requests.iter().all(|(token, _)| *token != 0));
            channel.send(&streamed_reply(requests.len())).unwrap();
            for (token, bytes) in requests {
                for value in bytes.chunks(4) {
                    let response = StreamMessage {
                        data: value.to_vec(),
                        parts: vec![StreamPart {
                            token,
                            outcome: Some(Outcome::Response {
                                model_name: batch.model_name.clone(),
                                model_version: batch.model_version.clone(),
                                id: String::new(),
                                parameters: String::new(),
                                outputs: vec![Slot {
                                    name: "OUT".into(),
                                    datatype: "INT32".into(),
                                    shape: vec![1],
                                    offset: 0,
                                    len: 4,
                                    place: None,
                                }],
                            }),
                            last: false,
                        }],
                    };
                    channel.send(&response.encode()).unwrap();
                    if die_early {
                        return;
                    }
                }
                channel.send(&final_flag(token)).unwrap();
            }
        }
    })
}

fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        thread::sleep(Duration::from_millis(1));
    }
}

fn values(parts: &Parts, sink: u32) -> Vec<i32> {
    parts
        .lock()
        .iter()
        .filter(|(s, answer, _)| *s == sink && matches!(answer, Some(Ok(_))))
        .map(|(_, answer, _)| {
            let Some(Ok(Answer::Response(response))) = answer else {
                panic!("not a response: {answer:?}")
            };
            i32::from_le_bytes(response.outputs[0].data[..4].try_into().unwrap())
        })
        .collect()
}

fn finals(parts: &Parts, sink: u32) -> usize {
    parts
        .lock()
        .iter()
        .filter(|(s, _, last)| *s == sink && *last)
        .count()
}

fn proto_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn proto_bytes(out: &mut Vec<u8>, number: u64, payload: &[u8]) {
    proto_varint(out, (number << 3) | 2);
    proto_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

/// A stream's `ModelInferRequest` to `repeat` version "1", id "s", `IN` = `values`; with
/// `empty_final`, asking for the empty final response.
fn stream_request(values: &[i32], empty_final: bool) -> Vec<u8> {
    let mut tensor = Vec::new();
    proto_bytes(&mut tensor, 1, b"IN");
    proto_bytes(&mut tensor, 2, b"INT32");
    let mut dims = Vec::new();
    proto_varint(&mut dims, values.len() as u64);
    proto_bytes(&mut tensor, 3, &dims);
    let mut m = Vec::new();
    proto_bytes(&mut m, 1, b"repeat");
    proto_bytes(&mut m, 2, b"1");
    proto_bytes(&mut m, 3, b"s");
    if empty_final {
        let mut entry = Vec::new();
        proto_bytes(&mut entry, 1, b"triton_enable_empty_final_response");
        proto_bytes(&mut entry, 2, &[0x08, 0x01]);
        proto_bytes(&mut m, 4, &entry);
    }
    proto_bytes(&mut m, 5, &tensor);
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    proto_bytes(&mut m, 7, &raw);
    m
}

#[test]
fn a_grpc_stream_request_gets_the_empty_final_response_it_asked_for() {
    let (lane, parts) = decoupled_lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let stand_in = repeat_worker(worker_end, false);
    let link = WorkerLink::new(server_end.into(), "streamtest").unwrap();
    let driver = drive(&lane, link);
    for (sink, asks) in [(1, true), (2, false)] {
        let body = Box::new(stream_request(&[5, 6], asks));
        let submitted = lane.submit_grpc(body, sink, GrpcForm::Stream);
        assert!(matches!(submitted, Submitted::Queued(_)), "{submitted:?}");
    }
    wait_until(|| finals(&parts, 1) == 1 && finals(&parts, 2) == 1);
    let encoded = |sink: u32| -> Vec<(Option<Vec<u8>>, bool)> {
        let parts = parts.lock();
        let of_sink = parts.iter().filter(|(s, ..)| *s == sink);
        of_sink
            .map(|(_, answer, last)| match answer {
                None => (None, *last),
                Some(Ok(Answer::Encoded(bytes))) => (Some(bytes.clone()), *last),
                Some(other) => panic!("not a serialized reply: {other:?}"),
            })
            .collect()
    };
    // Two responses each; then the empty final response, which names the model as the
    // request did, its id and `triton_final_response` true; without the flag, a bare end.
    let asked = encoded(1);
    assert_eq!(asked.len(), 3);
    let mut empty = Vec::new();
    proto_bytes(&mut empty, 1, b"repeat");
    proto_bytes(&mut empty, 2, b"1");
    proto_bytes(&mut empty, 3, b"s");
    let mut entry = Vec::new();
    proto_bytes(&mut entry, 1, b"triton_final_response");
    proto_bytes(&mut entry, 2, &[0x08, 0x01]);
    proto_bytes(&mut empty, 4, &entry);
    let mut reply = Vec::new();
    proto_bytes(&mut reply, 2, &empty);
    assert_eq!(asked[2], (Some(reply), true));
    let bare = encoded(2);
    assert_eq!(bare.len(), 3);
    assert_eq!(bare[2], (None, true));
    lane.close();
    assert_eq!(driver.join().unwrap(), DriveEnd::Closed);
    drop(lane);
    stand_in.join().unwrap();
}

#[test]
fn every_response_reaches_its_stream_after_the_batch_returned() {
    let (lane, parts) = decoupled_lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let stand_in = repeat_worker(worker_end, false);
    let link = WorkerLink::new(server_end.into(), "streamtest").unwrap();
    let driver = drive(&lane, link);
    lane.submit(int32s(1, &[7, 8, 9]), 1).unwrap();
    lane.submit(int32s(2, &[4]), 1).unwrap();
    wait_until(|| finals(&parts, 1) == 1 && finals(&parts, 2) == 1);
    assert_eq!(values(&parts, 1), [7, 8, 9]);
    assert_eq!(values(&parts, 2), [4]);
    // The final flag came last, alone.
    let last_of_1 = parts.lock().iter().rev().find(|(s, ..)| *s == 1).cloned();
    assert!(matches!(last_of_1, Some((1, None, true))));
    let stats = lane.stats().snapshot();
    assert_eq!(stats.success.count, 2);
    lane.close();
    assert_eq!(driver.join().unwrap(), DriveEnd::Closed);
    drop(lane);
    stand_in.join().unwrap();
}

#[test]
fn a_worker_that_goes_away_ends_its_open_streams() {
    let (lane, parts) = decoupled_lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let stand_in = repeat_worker(worker_end, true);
    let link = WorkerLink::new(server_end.into(), "streamtest")
        .unwrap()
        .with_died_message("the worker of repeat_0 exited".into());
    lane.submit(int32s(3, &[5, 6]), 1).unwrap();
    let driver = drive(&lane, link);
    wait_until(|| finals(&parts, 3) == 1);
    stand_in.join().unwrap();
    assert_eq!(values(&parts, 3), [5]);
    let ended = parts.lock().last().cloned().unwrap();
    let (3, Some(Err(error)), true) = ended else {
        panic!("not ended with an error: {ended:?}")
    };
    assert_eq!(
        (error.code, error.message.as_str()),
        (Code::Internal, "the worker of repeat_0 exited")
    );
    // Between batches, the driver sees the worker gone too.
    assert_eq!(driver.join().unwrap(), DriveEnd::Died);
}

/// A worker that replies to each batch and then streams nothing: its requests' streams stay
/// open. The stream tokens it got go to `tokens`.
fn silent_worker(end: UnixStream, tokens: Arc<Mutex<Vec<u64>>>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let channel = Channel::new(end.into());
        while let Ok(message) = channel.recv() {
            let batch = BatchMessage::decode(&message).unwrap();
            tokens
                .lock()
                .extend(batch.requests.iter().map(|r| r.stream));
            channel.send(&streamed_reply(batch.requests.len())).unwrap();
        }
    })
}

#[test]
fn a_closed_lane_reads_its_open_streams_until_they_are_ended() {
    let (lane, parts) = decoupled_lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let tokens = Arc::default();
    let silent = silent_worker(worker_end, Arc::clone(&tokens));
    let link = WorkerLink::new(server_end.into(), "streamtest").unwrap();
    lane.submit(int32s(4, &[1]), 1).unwrap();
    let driver = drive(&lane, link);
    wait_until(|| lane.stats().snapshot().success.count == 1);
    lane.close();
    lane.end_streams(&CoreError::unavailable("the model stopped"));
    assert_eq!(driver.join().unwrap(), DriveEnd::Closed);
    let ended = parts.lock().clone();
    assert_eq!(ended.len(), 1);
    assert!(matches!(&ended[0], (4, Some(Err(e)), true) if e.code == Code::Unavailable));
    assert_eq!(tokens.lock().len(), 1);
    drop(lane);
    silent.join().unwrap();
}

#[test]
fn a_stream_finished_after_its_lane_closed_still_reaches_its_sink() {
    let (lane, parts) = decoupled_lane();
    let (server_end, worker_end) = UnixStream::pair().unwrap();
    let tokens = Arc::<Mutex<Vec<u64>>>::default();
    // The test speaks for the worker after its batch: the final flag, through a second end
    // of the worker's socket.
    let speaker = Channel::new(worker_end.try_clone().unwrap().into());
    let silent = silent_worker(worker_end, Arc::clone(&tokens));
    let link = WorkerLink::new(server_end.into(), "streamtest").unwrap();
    lane.submit(int32s(5, &[1]), 1).unwrap();
    let driver = drive(&lane, link);
    wait_until(|| lane.stats().snapshot().success.count == 1);
    lane.close();
    let token = tokens.lock()[0];
    speaker.send(&final_flag(token)).unwrap();
    assert_eq!(driver.join().unwrap(), DriveEnd::Closed);
    assert_eq!(parts.lock().clone(), [(5, None, true)]);
    drop((lane, speaker));
    silent.join().unwrap();
}
