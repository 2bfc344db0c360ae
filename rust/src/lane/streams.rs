//! Decoupled models on a lane: a request's responses come from the worker at any time, from
//! `execute` or from the model's own threads after it returned, any number of them, the last
//! one marked final.
//!
//! Each request of a decoupled batch gets a stream token (in [`super::message::BatchRequest`]),
//! and its sink waits in the lane's [`OpenStreams`] until its final response. The worker sends
//! responses as [`StreamMessage`]s over the same channel as its batches' replies (tensors in
//! the message: a stream's responses outlive the batch whose output segment would hold them);
//! a reader thread per worker reads the channel for as long as the worker lives, hands each
//! response to its request's sink, serves the calls the model makes and passes each batch's
//! reply to the driver thread that waits for it ([`Replies`]).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::call::STREAM_TAG;
use super::callreplies::RequestReplies;
use super::events::EventWriter;
use super::message::{Outcome, Reader, Writer};
use super::source::RunTicket;
use super::{Answer, LaneTicket};
use crate::error::CoreError;
use crate::infer::CoreRequest;

/// One response of a stream (or, with no outcome, only its final flag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPart {
    pub token: u64,
    pub outcome: Option<Outcome>,
    pub last: bool,
}

/// Responses a worker sends together; their outputs' slots lie in `data`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StreamMessage {
    pub data: Vec<u8>,
    pub parts: Vec<StreamPart>,
}

impl StreamMessage {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(STREAM_TAG);
        w.bytes(&self.data);
        w.count(self.parts.len());
        for part in &self.parts {
            w.u64(part.token);
            w.u8(u8::from(part.last));
            match &part.outcome {
                None => w.u8(0),
                Some(outcome) => {
                    w.u8(1);
                    w.outcome(outcome);
                }
            }
        }
        w.buf
    }

    /// Decodes a message that starts with [`STREAM_TAG`].
    pub fn decode(b: &[u8]) -> Result<Self, CoreError> {
        let mut r = Reader::new(b);
        if r.u8()? != STREAM_TAG {
            return Err(CoreError::internal("not a stream message"));
        }
        let data = r.bytes()?.to_vec();
        let n = r.count(10)?;
        let mut parts = Vec::with_capacity(n);
        for _ in 0..n {
            let token = r.u64()?;
            let last = r.u8()? != 0;
            let outcome = if r.u8()? == 0 {
                None
            } else {
                Some(r.outcome()?)
            };
            parts.push(StreamPart {
                token,
                outcome,
                last,
            });
        }
        r.done()?;
        Ok(StreamMessage { data, parts })
    }
}

/// Who waits for a stream's responses.
#[derive(Debug)]
pub enum StreamSink<E> {
    /// The server's Python: each response handed to [`super::Deliver::stream`].
    External(Arc<E>),
    /// A gRPC stream's request: each response serialized as a `ModelStreamInferResponse`.
    Grpc(Arc<E>),
    /// The same, its replies queued on its call by the core ([`super::callreplies`]); the
    /// server's Python hears of its end, of a call to start sending on, and of the replies
    /// it must encode itself.
    Replies(Arc<E>, Arc<RequestReplies>),
    /// A `generate_stream` request whose events the core writes ([`super::events`]); the
    /// server's Python hears of its end (and of every response once the writer declines).
    Events(Arc<E>, Arc<EventWriter>),
}

/// Who takes a stream's responses before the server's Python does.
#[derive(Debug)]
pub enum Direct {
    None,
    Events(Arc<EventWriter>),
    Replies(Arc<RequestReplies>),
}

impl<E> StreamSink<E> {
    pub fn sink(&self) -> Arc<E> {
        match self {
            StreamSink::External(sink)
            | StreamSink::Grpc(sink)
            | StreamSink::Replies(sink, _)
            | StreamSink::Events(sink, _) => Arc::clone(sink),
        }
    }

    pub fn direct(&self) -> Direct {
        match self {
            StreamSink::Events(_, writer) => Direct::Events(Arc::clone(writer)),
            StreamSink::Replies(_, replies) => Direct::Replies(Arc::clone(replies)),
            StreamSink::External(_) | StreamSink::Grpc(_) => Direct::None,
        }
    }
}

/// A request whose final response has not come yet.
#[derive(Debug)]
pub struct OpenStream<E> {
    pub instance: usize,
    pub sink: StreamSink<E>,
    pub request: CoreRequest,
    pub(crate) ticket: RunTicket,
}

/// What [`super::Deliver::stream`] hands on: a request's sink, its response (None with a
/// bare final flag), and whether it is the last.
pub type Streamed<E> = (Arc<E>, Option<Result<Answer, CoreError>>, bool);

/// The lane's open streams, by token.
#[derive(Debug)]
pub struct OpenStreams<E> {
    open: Mutex<HashMap<u64, OpenStream<E>>>,
    /// Signalled whenever a stream ends (a driver waits for its instance's to end).
    ended: Condvar,
}

impl<E> Default for OpenStreams<E> {
    fn default() -> Self {
        OpenStreams {
            open: Mutex::new(HashMap::new()),
            ended: Condvar::new(),
        }
    }
}

impl<E> OpenStreams<E> {
    pub fn open(&self, token: u64, stream: OpenStream<E>) {
        self.open.lock().insert(token, stream);
    }

    /// The sink of `token`'s stream and its request, with `f`; the stream ends when `last`.
    pub fn with<R>(
        &self,
        token: u64,
        last: bool,
        f: impl FnOnce(&OpenStream<E>) -> R,
    ) -> Option<R> {
        let mut open = self.open.lock();
        if last {
            let stream = open.remove(&token)?;
            drop(open);
            self.ended.notify_all();
            Some(f(&stream))
        } else {
            open.get(&token).map(f)
        }
    }

    /// Ends the streams of `instance` (every instance's: None) that `chosen` picks, returning
    /// them.
    pub fn end_where(
        &self,
        mut chosen: impl FnMut(u64, &OpenStream<E>) -> bool,
    ) -> Vec<OpenStream<E>> {
        let mut open = self.open.lock();
        let tokens: Vec<u64> = open
            .iter()
            .filter(|(token, stream)| chosen(**token, stream))
            .map(|(token, _)| *token)
            .collect();
        let ended: Vec<_> = tokens.iter().filter_map(|t| open.remove(t)).collect();
        drop(open);
        if !ended.is_empty() {
            self.ended.notify_all();
        }
        ended
    }

    /// The instance and token of the stream `ticket`'s request opened, if still open.
    pub fn find(&self, ticket: &LaneTicket) -> Option<(usize, u64)> {
        let open = self.open.lock();
        open.iter()
            .find(|(_, stream)| ticket.is(&stream.ticket))
            .map(|(token, stream)| (stream.instance, *token))
    }

    /// Waits until instance `instance` has no open stream or `stop` says so (checked at
    /// least every `poll`).
    pub fn wait_ended(&self, instance: usize, poll: Duration, stop: impl Fn() -> bool) {
        let mut open = self.open.lock();
        while open.values().any(|s| s.instance == instance) && !stop() {
            self.ended.wait_for(&mut open, poll);
        }
    }
}

/// Where a worker's reader thread leaves its batches' replies for the driver thread, and
/// how the driver stops the reader.
#[derive(Debug)]
pub struct Replies {
    reply: Mutex<Option<Result<Vec<u8>, CoreError>>>,
    arrived: Condvar,
    /// The reader is done: the worker went away (or the reader was stopped).
    gone: AtomicBool,
    /// The driver stopped the reader.
    stopping: AtomicBool,
    /// Readable once the reader must stop (its write end dropped).
    stop_read: OwnedFd,
    stop_write: Mutex<Option<OwnedFd>>,
}

impl Replies {
    pub fn new() -> Result<Self, CoreError> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`, which has room for them.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(CoreError::system(&std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just made by pipe2 and nothing else owns them.
        let (read, write) = unsafe {
            use std::os::fd::FromRawFd;
            (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
        };
        Ok(Replies {
            reply: Mutex::new(None),
            arrived: Condvar::new(),
            gone: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            stop_read: read,
            stop_write: Mutex::new(Some(write)),
        })
    }

    /// What the reader polls besides the channel.
    pub fn stop_fd(&self) -> i32 {
        self.stop_read.as_raw_fd()
    }

    /// Tells the reader to stop (it sees the stop descriptor readable).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.stop_write.lock().take();
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// From the reader: a batch's reply.
    pub fn put(&self, reply: Vec<u8>) {
        *self.reply.lock() = Some(Ok(reply));
        self.arrived.notify_all();
    }

    /// From the reader: it is done, `error` why.
    pub fn end(&self, error: CoreError) {
        self.gone.store(true, Ordering::Release);
        let mut reply = self.reply.lock();
        if reply.is_none() {
            *reply = Some(Err(error));
        }
        drop(reply);
        self.arrived.notify_all();
    }

    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Waits for the reply to the batch sent last; an error once the reader is done.
    pub fn take(&self) -> Result<Vec<u8>, CoreError> {
        let mut reply = self.reply.lock();
        loop {
            if let Some(taken) = reply.take() {
                if taken.is_err() {
                    // (Every later wait sees the reader gone too.)
                    *reply = Some(Err(CoreError::disconnected("the worker's channel closed")));
                }
                return taken;
            }
            self.arrived.wait(&mut reply);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use crate::lane::message::Slot;

    #[test]
    fn stream_messages_round_trip() {
        let message = StreamMessage {
            data: vec![1, 2, 3, 4],
            parts: vec![
                StreamPart {
                    token: 7,
                    outcome: Some(Outcome::Response {
                        model_name: "m".into(),
                        model_version: "1".into(),
                        id: "a".into(),
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
                },
                StreamPart {
                    token: 7,
                    outcome: Some(Outcome::Error(Code::Internal, "no".into())),
                    last: true,
                },
                StreamPart {
                    token: 8,
                    outcome: None,
                    last: true,
                },
            ],
        };
        assert_eq!(StreamMessage::decode(&message.encode()), Ok(message));
        assert!(StreamMessage::decode(&[STREAM_TAG, 1]).is_err());
    }

    #[test]
    fn a_reply_reaches_its_driver_and_a_gone_reader_is_seen() {
        let replies = Replies::new().unwrap();
        replies.put(vec![9]);
        assert_eq!(replies.take(), Ok(vec![9]));
        replies.end(CoreError::disconnected("gone"));
        assert!(replies.is_gone());
        assert!(replies.take().is_err());
        assert!(replies.take().is_err());
    }
}
