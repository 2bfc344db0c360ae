//! Writes answers to client sockets from a thread of its own.
//!
//! Why: the HTTP frontend runs on one event-loop thread that holds the GIL. Profiled at
//! concurrency 16 on small inference requests, a fifth of that thread's time went to `send`
//! (on loopback the sender also pays for the receiver's TCP processing). A `send` needs no
//! Python, so the loop hands the bytes here and goes on; this thread writes them without the
//! GIL, on the machine's other core.
//!
//! Each connection is a [`Stream`] over a duplicate of the socket's descriptor. The duplicate
//! keeps the socket open until this thread is done with it, even after the event loop has
//! closed its own descriptor (whose number the kernel may then give to a new connection), so
//! bytes can never reach the wrong client. Bytes written to a stream go out in order; a socket
//! whose buffer is full is waited on with `poll` while the other streams keep being served.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::CoreError;

/// What a stream still has to do; behind the stream's lock.
#[derive(Debug, Default)]
struct Pending {
    /// Bytes written and not yet sent, oldest first, from `skip` on.
    bytes: Vec<u8>,
    /// Bytes at the front of `bytes` already sent (a partial send is not copied down).
    skip: usize,
    /// On the writer's list (or being flushed by it): a write needs no wake-up.
    listed: bool,
    /// Close the descriptor once `bytes` is sent.
    closing: bool,
    /// Unsent bytes were dropped: close without sending more.
    aborted: bool,
    /// The duplicate descriptor; `None` once closed.
    fd: Option<OwnedFd>,
}

/// One client connection's outgoing bytes.
#[derive(Debug)]
pub struct Stream {
    pending: Mutex<Pending>,
    /// Bytes written and not yet handed to the kernel, readable without the lock.
    unsent: AtomicUsize,
    outbox: Arc<Shared>,
}

/// Why a write was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteError {
    /// The stream was closed or aborted, or its socket failed.
    Closed,
}

impl From<WriteError> for CoreError {
    fn from(err: WriteError) -> Self {
        match err {
            WriteError::Closed => CoreError::disconnected("connection closed"),
        }
    }
}

impl Stream {
    /// Queues `data` to be sent after everything written before it.
    pub fn write(self: &Arc<Self>, data: &[u8]) -> Result<(), WriteError> {
        self.queue(&[data], false)
    }

    /// Sends `data` on the caller's thread when nothing written before it is still waiting,
    /// queueing only what the socket does not take now; else queues it like [`write`].
    /// For a caller with nothing else to do: it saves the writer's wake-up (tens of µs on a
    /// lightly loaded machine) at the price of the `send` on its own thread.
    ///
    /// [`write`]: Self::write
    pub fn write_now(self: &Arc<Self>, data: &[u8]) -> Result<(), WriteError> {
        self.queue(&[data], true)
    }

    /// Like [`write_now`](Self::write_now) for the bytes of `parts` one after another, sent
    /// in one `sendmsg` from where they lie: only what the socket does not take now is
    /// copied (a large tensor is sent from its segment, not gathered into an answer first).
    pub fn write_parts_now(self: &Arc<Self>, parts: &[&[u8]]) -> Result<(), WriteError> {
        self.queue(parts, true)
    }

    fn queue(self: &Arc<Self>, parts: &[&[u8]], send_first: bool) -> Result<(), WriteError> {
        let wake = {
            let mut pending = self.pending.lock();
            let Some(fd) = pending.fd.as_ref().map(AsRawFd::as_raw_fd) else {
                return Err(WriteError::Closed);
            };
            if pending.closing {
                return Err(WriteError::Closed);
            }
            let total: usize = parts.iter().map(|part| part.len()).sum();
            let mut sent = 0;
            // Not listed means nothing is waiting and the writer is not sending for this
            // stream (it lists a stream before taking its bytes), so the socket is ours.
            if send_first && !pending.listed {
                let Ok(n) = send_parts(fd, parts) else {
                    pending.fd = None; // the peer is gone
                    return Err(WriteError::Closed);
                };
                sent = n;
                if sent == total {
                    return Ok(());
                }
            }
            pending.bytes.reserve(total - sent);
            let mut skip = sent;
            for part in parts {
                let skipped = skip.min(part.len());
                skip -= skipped;
                pending.bytes.extend_from_slice(&part[skipped..]);
            }
            self.unsent.fetch_add(total - sent, Ordering::Release);
            !std::mem::replace(&mut pending.listed, true)
        };
        if wake {
            self.outbox.list(Arc::clone(self));
        }
        Ok(())
    }

    /// Closes the socket (this stream's hold on it) once everything written is sent.
    pub fn close(self: &Arc<Self>) {
        let mut pending = self.pending.lock();
        pending.closing = true;
        if !pending.listed {
            pending.fd = None;
        }
    }

    /// Drops what is unsent and closes the stream's hold on the socket (now, or as soon as
    /// the writer is done with it: only the writer closes a listed stream's descriptor, so a
    /// `send` in progress never meets a number the kernel has given to another socket).
    pub fn abort(&self) {
        let mut pending = self.pending.lock();
        pending.closing = true;
        pending.aborted = true;
        pending.bytes = Vec::new();
        pending.skip = 0;
        self.unsent.store(0, Ordering::Release);
        if !pending.listed {
            pending.fd = None;
        } else if let Some(fd) = &pending.fd {
            // The writer may be waiting for this socket to take bytes from a peer that never
            // reads: shut it down now (the peer sees the connection end, and the writer's
            // poll wakes with an error and lets the descriptor go).
            // SAFETY: `fd` is open: only the writer closes a listed stream's descriptor, and
            // it needs the lock we hold.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }

    /// Bytes written and not yet handed to the kernel.
    pub fn unsent(&self) -> usize {
        self.unsent.load(Ordering::Acquire)
    }

    /// Whether the stream still holds its socket.
    pub fn is_open(&self) -> bool {
        self.pending.lock().fd.is_some()
    }

    fn raw_fd(&self) -> Option<RawFd> {
        self.pending.lock().fd.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Sends what is pending without blocking. Returns whether bytes are left because the
    /// socket's buffer is full (the stream stays listed and must be polled for writability).
    fn flush(&self) -> bool {
        loop {
            let (bytes, skip, fd) = {
                let mut pending = self.pending.lock();
                let Some(fd) = pending.fd.as_ref().map(AsRawFd::as_raw_fd) else {
                    pending.listed = false;
                    return false;
                };
                if pending.bytes.is_empty() {
                    pending.listed = false;
                    if pending.closing {
                        pending.fd = None;
                    }
                    return false;
                }
                let skip = std::mem::take(&mut pending.skip);
                (std::mem::take(&mut pending.bytes), skip, fd)
            };
            // The lock is not held while sending: the loop may write more meanwhile, which
            // lands in the emptied `bytes` and goes out after what is taken here.
            let outcome = send_some(fd, &bytes[skip..]);
            let mut pending = self.pending.lock();
            if pending.aborted {
                pending.fd = None;
                pending.listed = false;
                return false;
            }
            let Ok(sent) = outcome else {
                // The peer is gone (reset, broken pipe): nothing more can reach it.
                pending.fd = None;
                pending.bytes = Vec::new();
                pending.skip = 0;
                pending.listed = false;
                self.unsent.store(0, Ordering::Release);
                return false;
            };
            self.unsent.fetch_sub(sent, Ordering::Release);
            let done = skip + sent;
            if done < bytes.len() {
                if pending.bytes.is_empty() {
                    pending.bytes = bytes; // put back whole: no copy of a large remainder
                    pending.skip = done;
                } else {
                    let mut rest = bytes[done..].to_vec();
                    rest.append(&mut pending.bytes);
                    pending.bytes = rest;
                }
                return true;
            }
        }
    }
}

/// Sends as much of `bytes` as the socket takes now; `Ok(0)` when its buffer is full.
fn send_some(fd: RawFd, bytes: &[u8]) -> io::Result<usize> {
    send_parts(fd, &[bytes])
}

/// Sends as much of `parts`, one after another, as the socket takes now (in `sendmsg` calls
/// of at most [`MAX_PARTS`] pieces); `Ok(0)` when its buffer is full.
fn send_parts(fd: RawFd, parts: &[&[u8]]) -> io::Result<usize> {
    let total: usize = parts.iter().map(|part| part.len()).sum();
    let mut sent = 0;
    // (On the stack: every answer's send comes here, most of them of one piece.)
    let mut pieces = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_PARTS];
    while sent < total {
        // The pieces from `sent` on.
        let mut skip = sent;
        let mut count = 0;
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            let rest = &part[skip..];
            skip = 0;
            pieces[count] = libc::iovec {
                iov_base: rest.as_ptr().cast_mut().cast(),
                iov_len: rest.len(),
            };
            count += 1;
            if count == MAX_PARTS {
                break;
            }
        }
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = pieces.as_mut_ptr();
        message.msg_iovlen = count;
        // SAFETY: `message` points at `pieces`, each a live slice of `parts` for the call,
        // which the kernel only reads. `fd` is held open by the stream: the writer calls this
        // for a listed stream (whose descriptor only the writer closes), `queue` for an
        // unlisted one under the stream's lock.
        let n = unsafe {
            libc::sendmsg(
                fd,
                &raw const message,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            sent += n.unsigned_abs();
            continue;
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => return Ok(sent),
            _ => return Err(err),
        }
    }
    Ok(sent)
}

/// The most pieces one `sendmsg` of [`send_parts`] takes (Linux's `UIO_MAXIOV` is 1024).
const MAX_PARTS: usize = 64;

/// How often a busy writer looks again at sockets that were full.
const BLOCKED_CHECK: Duration = Duration::from_millis(1);

/// What the writer thread and the streams share.
#[derive(Debug)]
struct Shared {
    /// Streams with bytes to send, in the order they asked.
    listed: Mutex<Vec<Arc<Stream>>>,
    /// The writer is about to sleep (or sleeps) in `poll`: a new listing must wake it.
    sleeping: AtomicBool,
    stop: AtomicBool,
    /// Set by [`Outbox::finish`]: end once nothing is left to send, or at this instant.
    finish_by: Mutex<Option<Instant>>,
    /// Readable when the writer must wake up.
    wake: OwnedFd,
}

impl Shared {
    fn list(&self, stream: Arc<Stream>) {
        self.listed.lock().push(stream);
        if self.sleeping.swap(false, Ordering::SeqCst) {
            self.signal();
        }
    }

    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which lives for the call, to our own eventfd.
        unsafe {
            libc::write(self.wake.as_raw_fd(), (&raw const one).cast(), 8);
        }
    }

    fn drain_wake(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into `count`, which lives for the call, from our own
        // non-blocking eventfd; EAGAIN leaves `count` untouched.
        unsafe {
            libc::read(self.wake.as_raw_fd(), (&raw mut count).cast(), 8);
        }
    }
}

/// The writer thread and the streams it serves. [`finish`](Self::finish) lets it send what
/// is pending first; dropping it stops the thread after one last attempt.
#[derive(Debug)]
pub struct Outbox {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Outbox {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let shared = Arc::new(Shared {
            listed: Mutex::new(Vec::new()),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            finish_by: Mutex::new(None),
            // SAFETY: `fd` was just returned by eventfd, is valid and owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        });
        let writer = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("tritonfast-outbox".into())
            .spawn(move || run_writer(&writer))?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Ends the writer once everything written has been sent (or its peer has gone), or
    /// after `within` at the latest; returns when it has ended. For a server shutting down:
    /// its last answers are handed over just before.
    pub fn finish(&self, within: Duration) {
        *self.shared.finish_by.lock() = Some(Instant::now() + within);
        self.shared.signal();
        self.join();
    }

    fn join(&self) {
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }

    /// A stream over a duplicate of `fd` (a connected socket the caller keeps owning).
    pub fn open(&self, fd: BorrowedFd<'_>) -> io::Result<Arc<Stream>> {
        let own = fd.try_clone_to_owned()?;
        Ok(Arc::new(Stream {
            pending: Mutex::new(Pending {
                fd: Some(own),
                ..Pending::default()
            }),
            unsent: AtomicUsize::new(0),
            outbox: Arc::clone(&self.shared),
        }))
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.signal();
        self.join();
    }
}

/// The writer thread: flushes listed streams in order, polls the ones whose socket is full,
/// and sleeps in `poll` on the wake-up eventfd when there is nothing to do.
fn run_writer(shared: &Shared) {
    let mut writer = Writer::new(shared);
    loop {
        let worked = writer.flush_listed();
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let finish_by = *shared.finish_by.lock();
        if finish_by.is_some_and(|deadline| writer.finished(worked, deadline)) {
            return;
        }
        // Look for more before sleeping. While busy, sockets that were full are looked at
        // again only every BLOCKED_CHECK: each look costs a lock and a pollfd per such
        // socket, which must not be paid per answer when many clients have stopped reading.
        if worked && !writer.blocked_check_due() {
            continue;
        }
        writer.blocked_checked = Instant::now();
        let timeout = writer.sleep_timeout(worked, finish_by);
        if writer.poll(timeout) > 0 {
            writer.flush_ready();
        }
    }
}

/// The writer thread's own state.
struct Writer<'a> {
    shared: &'a Shared,
    /// Streams whose socket was full, waiting to take bytes again.
    blocked: Vec<Arc<Stream>>,
    /// The wake-up eventfd, then one entry per blocked stream (reused across polls).
    polls: Vec<libc::pollfd>,
    /// When the blocked streams were last polled.
    blocked_checked: Instant,
}

impl<'a> Writer<'a> {
    fn new(shared: &'a Shared) -> Self {
        Self {
            shared,
            blocked: Vec::new(),
            polls: Vec::new(),
            blocked_checked: Instant::now(),
        }
    }

    /// Flushes the streams listed since the last look, in order; those whose socket fills up
    /// become blocked. Returns whether there were any.
    fn flush_listed(&mut self) -> bool {
        let listed = std::mem::take(&mut *self.shared.listed.lock());
        let worked = !listed.is_empty();
        for stream in listed {
            if stream.flush() {
                self.blocked.push(stream);
            }
        }
        worked
    }

    /// Whether sockets that were full are due to be looked at again: there are some, and
    /// [`BLOCKED_CHECK`] has passed since the last look.
    fn blocked_check_due(&self) -> bool {
        !self.blocked.is_empty() && self.blocked_checked.elapsed() >= BLOCKED_CHECK
    }

    /// Whether a writer told to finish by `deadline` is done: nothing is left to send, or the
    /// deadline has passed.
    fn finished(&self, worked: bool, deadline: Instant) -> bool {
        let idle = !worked && self.blocked.is_empty() && self.shared.listed.lock().is_empty();
        idle || Instant::now() >= deadline
    }

    /// How long the next `poll` may sleep, in ms (-1: no limit). Sleep (or, with work just
    /// done, only look) until a listing or a blocked socket taking bytes again; when
    /// finishing, no later than the deadline. Before it may sleep, the writer says so: a
    /// listing from then on wakes it.
    fn sleep_timeout(&self, worked: bool, finish_by: Option<Instant>) -> libc::c_int {
        if worked {
            0
        } else {
            self.shared.sleeping.store(true, Ordering::SeqCst);
            if !self.shared.listed.lock().is_empty() {
                0
            } else if let Some(deadline) = finish_by {
                let left = deadline.saturating_duration_since(Instant::now());
                i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1)
            } else {
                -1
            }
        }
    }

    /// Polls the wake-up eventfd and the blocked streams' sockets for up to `timeout` ms
    /// (dropping blocked streams whose descriptor is gone); returns `poll`'s count of ready
    /// descriptors.
    fn poll(&mut self, timeout: libc::c_int) -> libc::c_int {
        self.polls.clear();
        self.polls.push(libc::pollfd {
            fd: self.shared.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        self.blocked.retain(|stream| {
            let Some(fd) = stream.raw_fd() else {
                stream.pending.lock().listed = false;
                return false;
            };
            self.polls.push(libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            });
            true
        });
        let polls = &mut self.polls;
        // SAFETY: `polls` is a live array of `polls.len()` pollfds for the call. The blocked
        // streams' descriptors stay open meanwhile: they are listed, and only this thread
        // closes a listed stream's descriptor.
        let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout) };
        self.shared.sleeping.store(false, Ordering::SeqCst);
        ready
    }

    /// After a `poll` that found descriptors ready: empties the eventfd if it woke us, and
    /// flushes the blocked streams whose socket is ready; those that empty stop being blocked.
    fn flush_ready(&mut self) {
        if self.polls[0].revents != 0 {
            self.shared.drain_wake();
        }
        let mut index = 1;
        self.blocked.retain(|stream| {
            let revents = self.polls[index].revents;
            index += 1;
            if revents == 0 {
                return true;
            }
            // Writable, failed or hung up: flush decides (an error drops the stream's bytes).
            if stream.flush() {
                return true;
            }
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    fn connected_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        (server, client)
    }

    /// A stream over a new connection whose only holder is the stream (the event loop has
    /// closed its own descriptor), and the connection's client end.
    fn stream_holding_its_socket(outbox: &Outbox) -> (Arc<Stream>, TcpStream) {
        let (server, client) = connected_pair();
        let stream = outbox.open(server.as_fd()).unwrap();
        drop(server);
        (stream, client)
    }

    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let end = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < end, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn bytes_arrive_in_the_order_written() {
        let outbox = Outbox::new().unwrap();
        let (server, mut client) = connected_pair();
        let stream = outbox.open(server.as_fd()).unwrap();
        let mut expected = Vec::new();
        for i in 0..1000u32 {
            let chunk = format!("answer {i};");
            stream.write(chunk.as_bytes()).unwrap();
            expected.extend_from_slice(chunk.as_bytes());
        }
        let mut got = vec![0; expected.len()];
        client.read_exact(&mut got).unwrap();
        assert_eq!(got, expected);
        wait_until("all is sent", || stream.unsent() == 0);
    }

    #[test]
    fn sends_now_only_when_nothing_waits_before() {
        let outbox = Outbox::new().unwrap();
        let (server, mut client) = connected_pair();
        let stream = outbox.open(server.as_fd()).unwrap();
        stream.write_now(b"first;").unwrap(); // nothing queued: sent on this thread
        assert_eq!(stream.unsent(), 0);
        let mut expected = b"first;".to_vec();
        for i in 0..500u32 {
            let chunk = format!("answer {i};");
            if i % 2 == 0 {
                stream.write(chunk.as_bytes()).unwrap();
            } else {
                stream.write_now(chunk.as_bytes()).unwrap();
            }
            expected.extend_from_slice(chunk.as_bytes());
        }
        let mut got = vec![0; expected.len()];
        client.read_exact(&mut got).unwrap();
        assert_eq!(got, expected);
    }

    #[test]
    fn parts_sent_from_where_they_lie_arrive_whole_and_in_order() {
        let outbox = Outbox::new().unwrap();
        let (server, mut client) = connected_pair();
        let stream = outbox.open(server.as_fd()).unwrap();
        // More than the socket takes at once while nobody reads: the rest is queued.
        let big: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
        let many: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 7]).collect();
        let mut expected = Vec::new();
        for round in 0..3 {
            stream
                .write_parts_now(&[b"head;", &big[round..], b";"])
                .unwrap();
            stream.write_now(b"small;").unwrap();
            let pieces: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
            stream.write_parts_now(&pieces).unwrap(); // more pieces than one sendmsg takes
            for part in [&b"head;"[..], &big[round..], b";", b"small;"] {
                expected.extend_from_slice(part);
            }
            expected.extend(many.iter().flatten());
        }
        stream.write_parts_now(&[]).unwrap();
        let mut got = vec![0; expected.len()];
        client.read_exact(&mut got).unwrap();
        assert!(got == expected, "the parts arrive whole and in order");
        wait_until("all is sent", || stream.unsent() == 0);
    }

    #[test]
    fn the_socket_stays_open_until_the_stream_closes_it_after_sending() {
        let outbox = Outbox::new().unwrap();
        let (stream, mut client) = stream_holding_its_socket(&outbox);
        stream.write(b"last answer").unwrap();
        stream.close();
        assert_eq!(stream.write(b"too late"), Err(WriteError::Closed));
        let mut got = Vec::new();
        client.read_to_end(&mut got).unwrap(); // ends only when the socket closes
        assert_eq!(got, b"last answer");
        wait_until("the stream lets go", || !stream.is_open());
    }

    #[test]
    fn a_client_that_does_not_read_holds_up_only_its_own_stream() {
        let outbox = Outbox::new().unwrap();
        let (slow_server, mut slow_client) = connected_pair();
        let (fast_server, mut fast_client) = connected_pair();
        let slow = outbox.open(slow_server.as_fd()).unwrap();
        let fast = outbox.open(fast_server.as_fd()).unwrap();
        // Far more than the socket buffers hold while nobody reads.
        let big: Vec<u8> = (0..32 << 20).map(|i: u32| (i % 251) as u8).collect();
        slow.write(&big).unwrap();
        wait_until("the slow socket is full", || {
            slow.unsent() > 0 && slow.unsent() < big.len()
        });
        fast.write(b"ping").unwrap();
        let mut got = [0; 4];
        fast_client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        let mut all = vec![0; big.len()];
        slow_client.read_exact(&mut all).unwrap();
        assert!(
            all == big,
            "the slow client's bytes arrive whole and in order"
        );
        wait_until("all is sent", || slow.unsent() == 0);
    }

    #[test]
    fn abort_drops_what_is_unsent_and_a_gone_peer_fails_later_writes() {
        let outbox = Outbox::new().unwrap();
        let (server, client) = connected_pair();
        let stream = outbox.open(server.as_fd()).unwrap();
        drop(client);
        drop(server);
        // Writes to a reset connection fail in the writer; the stream then refuses more.
        wait_until("the writer sees the peer gone", || {
            stream.write(&[0; 4096]).is_err()
        });
        assert_eq!(stream.unsent(), 0);
        let (server, _client) = connected_pair();
        let other = outbox.open(server.as_fd()).unwrap();
        other.abort();
        assert!(!other.is_open());
        assert_eq!(other.write(b"x"), Err(WriteError::Closed));
    }

    #[test]
    fn finish_sends_what_is_pending_first_and_gives_up_at_its_deadline() {
        let outbox = Outbox::new().unwrap();
        let (server, mut client) = connected_pair();
        let (stuck_server, _stuck_client) = connected_pair(); // never read
        let stream = outbox.open(server.as_fd()).unwrap();
        let stuck = outbox.open(stuck_server.as_fd()).unwrap();
        let big: Vec<u8> = vec![7; 16 << 20];
        stuck.write(&big).unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = vec![0; 8 << 20];
            client.read_exact(&mut all).unwrap();
            all
        });
        stream.write(&vec![1; 8 << 20]).unwrap(); // more than the socket holds at once
        let started = Instant::now();
        outbox.finish(Duration::from_millis(1500));
        let took = started.elapsed();
        assert_eq!(stream.unsent(), 0, "the reading client got everything");
        assert!(reader.join().unwrap().iter().all(|&b| b == 1));
        assert!(stuck.unsent() > 0, "the stuck client still holds bytes");
        assert!(
            took >= Duration::from_millis(1400),
            "gave up early: {took:?}"
        );
        assert!(took < Duration::from_secs(5), "did not give up: {took:?}");
    }

    #[test]
    fn aborting_a_stream_stuck_on_a_full_socket_ends_its_connection() {
        let outbox = Outbox::new().unwrap();
        let (stream, mut client) = stream_holding_its_socket(&outbox);
        stream.write(&vec![3; 32 << 20]).unwrap(); // far more than the buffers hold
        wait_until("the socket is full", || {
            stream.unsent() > 0 && stream.unsent() < 32 << 20
        });
        stream.abort();
        assert_eq!(stream.unsent(), 0);
        // The peer reads what was already sent, then sees the connection end.
        let mut sink = Vec::new();
        let ended = client.read_to_end(&mut sink);
        assert!(ended.is_ok() || ended.unwrap_err().kind() == std::io::ErrorKind::ConnectionReset);
        wait_until("the writer lets the descriptor go", || !stream.is_open());
    }

    #[test]
    fn dropping_the_outbox_stops_its_thread() {
        let outbox = Outbox::new().unwrap();
        let (server, mut client) = connected_pair();
        let stream = outbox.open(server.as_fd()).unwrap();
        stream.write(b"bye").unwrap();
        let mut got = [0; 3];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"bye");
        drop(outbox); // joins the thread: a hang here fails the test
    }
}
