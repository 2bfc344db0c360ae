//! The replies a gRPC stream's call has yet to send, in order.
//!
//! grpc lets a call have one send in flight, and only the server's Python can start one
//! (grpcio). A decoupled model's responses used to reach the call one by one through Python
//! on the core's reader threads, which then held the GIL for most of a burst and kept the
//! completion-queue thread, which sends them, waiting for it. Here the reader threads queue
//! the serialized replies without the GIL; the server's Python takes the next one each time a
//! send completes ([`CallReplies::next`]), and is called from a reader thread only to start
//! sending on a call that was idle ([`Pushed::Idle`]). The server's Python queues the replies
//! it encodes itself on the same queue, so each call's replies leave in the order queued.
//!
//! The queue does not look into its replies: the reader threads queue serialized bytes
//! (`Vec<u8>`), the server's Python its own objects, each taken out as it was queued.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::monotonic_ns;

/// How long a held thread sleeps before it looks at its `stop` again.
const HOLD_POLL: Duration = Duration::from_millis(5);

/// A queued reply (see the module's documentation).
pub type Reply = Box<dyn Any + Send>;

/// What queuing a reply did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued behind a send in flight: that send's completion takes it on.
    Queued,
    /// Queued on an idle call: the caller must start sending ([`CallReplies::next`]).
    Idle,
    /// Dropped: the call is over.
    Over,
}

#[derive(Debug, Default)]
struct State {
    queued: VecDeque<Reply>,
    /// A send is in flight, or about to be started by whoever was told [`Pushed::Idle`].
    sending: bool,
    over: bool,
}

/// One call's queue of serialized replies (see the module's documentation).
#[derive(Debug)]
pub struct CallReplies {
    state: Mutex<State>,
    /// Signalled when a full queue is down to half, or the call is over.
    room: Condvar,
    /// How many queued replies make the queue full (producers then wait).
    ahead: usize,
}

impl CallReplies {
    /// A queue that is full at `ahead` replies.
    pub fn new(ahead: usize) -> Self {
        CallReplies {
            state: Mutex::new(State::default()),
            room: Condvar::new(),
            ahead: ahead.max(2),
        }
    }

    /// Queues `reply`.
    pub fn push(&self, reply: Reply) -> Pushed {
        let mut state = self.state.lock();
        if state.over {
            return Pushed::Over;
        }
        state.queued.push_back(reply);
        if state.sending {
            Pushed::Queued
        } else {
            state.sending = true;
            Pushed::Idle
        }
    }

    /// The next reply to send and how many wait behind it; None when the queue is empty
    /// (the call is idle from then on) or the call is over.
    pub fn next(&self) -> Option<(Reply, usize)> {
        let mut state = self.state.lock();
        let reply = if state.over {
            None
        } else {
            state.queued.pop_front()
        };
        let Some(reply) = reply else {
            state.sending = false;
            drop(state);
            self.room.notify_all();
            return None;
        };
        let left = state.queued.len();
        drop(state);
        if left == self.ahead / 2 {
            self.room.notify_all();
        }
        Some((reply, left))
    }

    /// Nothing more will be sent (a send failed, the client went away): what is queued is
    /// dropped, and so is whatever comes.
    pub fn end(&self) {
        let mut state = self.state.lock();
        state.over = true;
        state.queued.clear();
        state.sending = false;
        drop(state);
        self.room.notify_all();
    }

    pub fn is_over(&self) -> bool {
        self.state.lock().over
    }

    /// Replies queued and not yet taken.
    pub fn len(&self) -> usize {
        self.state.lock().queued.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_full(&self) -> bool {
        self.len() >= self.ahead
    }

    /// Whether a send is in flight (or about to start).
    pub fn is_sending(&self) -> bool {
        self.state.lock().sending
    }

    /// Waits (once the queue was full) until it is down to half, the call is over, or
    /// `stop()` (the lane closing: its requests must be able to end).
    pub fn hold(&self, stop: &dyn Fn() -> bool) {
        let mut state = self.state.lock();
        while state.queued.len() > self.ahead / 2 && !state.over && !stop() {
            self.room.wait_for(&mut state, HOLD_POLL);
        }
    }
}

/// One request's replies on its call's queue, and when its first was queued.
#[derive(Debug)]
pub struct RequestReplies {
    pub call: std::sync::Arc<CallReplies>,
    /// `CLOCK_MONOTONIC` nanoseconds of the first reply queued (0 before).
    first_at: AtomicU64,
}

impl RequestReplies {
    pub fn new(call: std::sync::Arc<CallReplies>) -> Self {
        RequestReplies {
            call,
            first_at: AtomicU64::new(0),
        }
    }

    /// Queues one of the request's replies, serialized.
    pub fn push(&self, reply: Vec<u8>) -> Pushed {
        if self.first_at.load(Ordering::Relaxed) == 0 {
            self.first_at.store(monotonic_ns(), Ordering::Relaxed);
        }
        self.call.push(Box::new(reply))
    }

    pub fn first_at(&self) -> u64 {
        self.first_at.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn bytes(reply: &[u8]) -> Reply {
        Box::new(reply.to_vec())
    }

    /// The next reply as bytes, and whether more wait.
    fn next_bytes(call: &CallReplies) -> Option<(Vec<u8>, bool)> {
        call.next()
            .map(|(reply, left)| (*reply.downcast::<Vec<u8>>().unwrap(), left > 0))
    }

    #[test]
    fn the_first_reply_on_an_idle_call_asks_for_a_send_and_the_rest_follow_in_order() {
        let call = CallReplies::new(4);
        assert_eq!(call.push(bytes(b"a")), Pushed::Idle);
        assert_eq!(call.push(bytes(b"b")), Pushed::Queued);
        assert!(call.is_sending());
        assert_eq!(next_bytes(&call), Some((b"a".to_vec(), true)));
        assert_eq!(call.push(bytes(b"c")), Pushed::Queued);
        assert_eq!(next_bytes(&call), Some((b"b".to_vec(), true)));
        assert_eq!(next_bytes(&call), Some((b"c".to_vec(), false)));
        assert_eq!(next_bytes(&call), None);
        assert!(!call.is_sending());
        assert_eq!(call.push(bytes(b"d")), Pushed::Idle);
    }

    #[test]
    fn an_ended_call_drops_what_is_queued_and_what_comes() {
        let call = CallReplies::new(4);
        call.push(bytes(b"a"));
        call.push(bytes(b"b"));
        call.end();
        assert!(call.is_over());
        assert!(call.is_empty());
        assert_eq!(next_bytes(&call), None);
        assert_eq!(call.push(bytes(b"c")), Pushed::Over);
    }

    #[test]
    fn a_producer_waits_while_the_queue_is_full_until_half_is_sent() {
        let call = Arc::new(CallReplies::new(4));
        for _ in 0..4 {
            call.push(bytes(&[0]));
        }
        assert!(call.is_full());
        let released = Arc::new(AtomicBool::new(false));
        let holder = {
            let (call, released) = (Arc::clone(&call), Arc::clone(&released));
            std::thread::spawn(move || {
                call.hold(&|| false);
                released.store(true, Ordering::SeqCst);
                call.len()
            })
        };
        call.next().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !released.load(Ordering::SeqCst),
            "three left: still more than half"
        );
        call.next().unwrap();
        assert_eq!(holder.join().unwrap(), 2);
    }

    #[test]
    fn a_held_producer_is_let_go_when_the_call_ends_or_it_must_stop() {
        let call = Arc::new(CallReplies::new(2));
        call.push(bytes(&[0]));
        call.push(bytes(&[1]));
        let holder = {
            let call = Arc::clone(&call);
            std::thread::spawn(move || call.hold(&|| false))
        };
        call.end();
        holder.join().unwrap();
        let call = CallReplies::new(2);
        call.push(bytes(&[0]));
        call.push(bytes(&[1]));
        call.hold(&|| true); // returns at once
    }

    #[test]
    fn a_request_remembers_when_its_first_reply_was_queued() {
        let call = Arc::new(CallReplies::new(4));
        let request = RequestReplies::new(Arc::clone(&call));
        assert_eq!(request.first_at(), 0);
        request.push(vec![0]);
        let first = request.first_at();
        assert!(first > 0);
        request.push(vec![1]);
        assert_eq!(request.first_at(), first);
        assert_eq!(call.len(), 2);
    }
}
