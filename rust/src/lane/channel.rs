//! Framed messages over a stream socket between the server and a worker process: each
//! message is its length (4 bytes, little end first) and its bytes. Both ends block in the
//! kernel while they wait, the GIL released by their callers.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use parking_lot::Mutex;

use crate::error::CoreError;

/// The largest message either side sends (a batch's description, not its tensors).
const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// One end of a worker's channel.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
    /// Held while a message is written: the server's end is written by the driver thread
    /// that runs the worker's batches and by those answering its calls (see `super::call`).
    sending: Mutex<()>,
}

fn gone(err: &io::Error) -> CoreError {
    CoreError::disconnected(format!("the worker's channel closed: {err}"))
}

impl Channel {
    /// Takes over `fd`, one end of a stream socket pair.
    pub fn new(fd: OwnedFd) -> Self {
        Channel {
            stream: UnixStream::from(fd),
            sending: Mutex::new(()),
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
}
