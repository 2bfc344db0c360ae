//! Framed messages over a stream socket between the server and a worker process: each
//! message is its length (4 bytes, little end first) and its bytes. Both ends block in the
//! kernel while they wait, the GIL released by their callers.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::CoreError;
use crate::spin::Spin;
use crate::wake::WakeFd;

/// The largest message either side sends (a batch's description, not its tensors).
const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// One end of a worker's channel.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
    /// Held while a message is written: the server's end is written by the driver thread
    /// that runs the worker's batches and by those answering its calls (see `super::call`).
    sending: Mutex<()>,
    /// How long [`recv_soon`](Self::recv_soon) polls before it blocks (see there).
    poll: Mutex<Spin>,
    /// What [`poke`](Self::poke) raises for a thread in
    /// [`recv_after_call`](Self::recv_after_call) (None: no eventfd to be had; it sleeps on).
    poked: Option<WakeFd>,
    poke_wanted: AtomicBool,
}

/// The message that tells a worker a batch leaves soon (no batch message is empty).
pub const GET_READY: &[u8] = b"";
/// How long a worker told to get ready polls for its batch before it blocks again.
pub const GET_READY_POLL: Duration = Duration::from_micros(150);

/// The longest [`Channel::recv_soon`] polls: about what a worker takes for a small batch.
const POLL_WINDOW: Duration = Duration::from_micros(60);
/// How long a thread poked in [`Channel::recv_after_call`] polls: about what a worker takes
/// from a call's answer to its batch's reply.
const AFTER_CALL_POLL: Duration = Duration::from_micros(150);

fn gone(err: &io::Error) -> CoreError {
    CoreError::disconnected(format!("the worker's channel closed: {err}"))
}

impl Channel {
    /// Takes over `fd`, one end of a stream socket pair.
    pub fn new(fd: OwnedFd) -> Self {
        Channel {
            stream: UnixStream::from(fd),
            sending: Mutex::new(()),
            poll: Mutex::new(Spin::new(POLL_WINDOW)),
            poked: WakeFd::new().ok(),
            poke_wanted: AtomicBool::new(false),
        }
    }

    pub fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Sends one message (in one `write` for the usual small one).
    pub fn send(&self, message: &[u8]) -> Result<(), CoreError> {
        let length = u32::try_from(message.len())
            .ok()
            .filter(|&n| n as usize <= MAX_MESSAGE_BYTES)
            .ok_or_else(|| CoreError::internal("message to a worker too large"))?;
        let mut framed = Vec::with_capacity(4 + message.len());
        framed.extend_from_slice(&length.to_le_bytes());
        framed.extend_from_slice(message);
        let _sending = self.sending.lock();
        (&self.stream).write_all(&framed).map_err(|e| gone(&e))
    }

    /// Waits for and reads one message; `Disconnected` once the other end is closed.
    pub fn recv(&self) -> Result<Vec<u8>, CoreError> {
        let mut head = [0u8; 4];
        (&self.stream).read_exact(&mut head).map_err(|e| gone(&e))?;
        let length = u32::from_le_bytes(head) as usize;
        if length > MAX_MESSAGE_BYTES {
            return Err(CoreError::internal("message from a worker too large"));
        }
        let mut message = vec![0; length];
        (&self.stream)
            .read_exact(&mut message)
            .map_err(|e| gone(&e))?;
        Ok(message)
    }

    /// Like [`recv`](Self::recv) for a message expected soon (a batch's reply): first polls
    /// for it, giving way to any other thread ready to run, then blocks. How long it polls
    /// adapts (up to [`POLL_WINDOW`]) as the driver's queue wait does ([`crate::spin`]).
    pub fn recv_soon(&self) -> Result<Vec<u8>, CoreError> {
        let start = Instant::now();
        let window = self.poll.lock().window();
        self.poll_for(window);
        let message = self.recv()?;
        self.poll.lock().learn(start.elapsed());
        Ok(message)
    }

    /// Like [`recv`](Self::recv) for the message a worker sends once a call it made has its
    /// answer (another call, or its batch's reply): sleeps, but asks whoever sends the
    /// answer to [`poke`](Self::poke) it as the answer leaves, and then polls for the message
    /// (up to [`AFTER_CALL_POLL`]): its wake-up overlaps the worker's work on the answer
    /// instead of following it.
    pub fn recv_after_call(&self) -> Result<Vec<u8>, CoreError> {
        let Some(poked) = &self.poked else {
            return self.recv();
        };
        poked.drain(); // (a poke that came after an earlier wait ended)
        self.poke_wanted.store(true, Ordering::Release);
        let readable = self.wait(poked.fd())?;
        self.poke_wanted.store(false, Ordering::Release);
        if !readable {
            poked.drain();
            self.poll_for(AFTER_CALL_POLL);
        }
        self.recv()
    }

    /// Wakes a thread waiting in [`recv_after_call`](Self::recv_after_call) on this
    /// channel; nothing when none waits.
    pub fn poke(&self) {
        if self.poke_wanted.swap(false, Ordering::AcqRel)
            && let Some(poked) = &self.poked
        {
            poked.signal();
        }
    }

    /// Polls (giving way to any other thread ready to run) until bytes are there to read or
    /// `window` has passed.
    pub fn poll_for(&self, window: Duration) {
        let start = Instant::now();
        while !self.readable_now() && start.elapsed() < window {
            // SAFETY: sched_yield takes no arguments and touches no memory.
            unsafe { libc::sched_yield() };
        }
    }

    /// Whether bytes (or the end) are there to read now, without waiting.
    pub fn readable_now(&self) -> bool {
        let mut fd = libc::pollfd {
            fd: self.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `fd` is one valid pollfd structure for the call's duration.
        unsafe { libc::poll(&raw mut fd, 1, 0) > 0 }
    }

    /// Waits until this channel has bytes to read (or is closed), or `other` has: true for
    /// this channel. `other` is the worker's pipe, which carries what is not a batch.
    pub fn wait(&self, other: RawFd) -> Result<bool, CoreError> {
        let mut fds = [
            libc::pollfd {
                fd: self.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: other,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: `fds` is a valid array of two pollfd structures for the call's duration.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if ready >= 0 {
                return Ok(fds[0].revents != 0);
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(CoreError::system(&err));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn messages_arrive_whole_and_a_closed_end_is_seen() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Channel::new(a.into()), Channel::new(b.into()));
        a.send(b"hello").unwrap();
        a.send(b"").unwrap();
        assert!(b.wait(a.raw_fd()).unwrap());
        assert_eq!(b.recv().unwrap(), b"hello");
        assert_eq!(b.recv().unwrap(), b"");
        drop(a);
        assert!(b.recv().is_err());
    }

    #[test]
    fn a_poked_wait_polls_for_the_message_and_an_unwanted_poke_is_nothing() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Channel::new(a.into()), Arc::new(Channel::new(b.into())));
        b.poke(); // nobody waits: nothing is raised
        assert!(!b.poke_wanted.load(Ordering::Acquire));
        let waiter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.recv_after_call().unwrap())
        };
        while !b.poke_wanted.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        b.poke(); // as a call's answer leaves for the worker ...
        std::thread::sleep(Duration::from_millis(1));
        a.send(b"reply").unwrap(); // ... whose reply comes after the poke
        assert_eq!(waiter.join().unwrap(), b"reply");
        // A message that comes unpoked is read as ever.
        a.send(b"unpoked").unwrap();
        assert_eq!(b.recv_after_call().unwrap(), b"unpoked");
    }

    #[test]
    fn a_message_expected_soon_is_polled_for_and_the_poll_adapts() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (Channel::new(a.into()), Channel::new(b.into()));
        // Nothing comes: polling gives up after its window.
        let start = Instant::now();
        b.poll_for(Duration::from_millis(5));
        assert!(start.elapsed() >= Duration::from_millis(5));
        // A reply that comes late halves the poll window; one that comes at once doubles it.
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            a.send(b"late").unwrap();
            a
        });
        assert_eq!(b.recv_soon().unwrap(), b"late");
        let halved = b.poll.lock().window();
        assert_eq!(halved, POLL_WINDOW / 2);
        let a = late.join().unwrap();
        a.send(b"soon").unwrap();
        assert_eq!(b.recv_soon().unwrap(), b"soon");
        assert_eq!(b.poll.lock().window(), halved * 2);
    }
}
