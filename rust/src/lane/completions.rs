//! Tells the event loop which HTTP requests the core has answered, a batch at a time: the
//! connections that sent them may then read their next request. One `eventfd` wakes the loop
//! (it watches it with `add_reader`); one read takes every token sent since the last.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use parking_lot::Mutex;

/// Answered requests' tokens, waiting for the loop.
#[derive(Debug)]
pub struct Completions {
    tokens: Mutex<Vec<u64>>,
    event: OwnedFd,
}

impl Completions {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd, is valid and owned by nobody else.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Completions {
            tokens: Mutex::new(Vec::new()),
            event,
        })
    }

    /// The descriptor the loop watches for readability.
    pub fn fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }

    /// Adds the tokens of requests just answered, waking the loop if it has taken every
    /// earlier one.
    pub fn add(&self, tokens: &[u64]) {
        if tokens.is_empty() {
            return;
        }
        let wake = {
            let mut waiting = self.tokens.lock();
            let wake = waiting.is_empty();
            waiting.extend_from_slice(tokens);
            wake
        };
        if wake {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a live u64 to our eventfd; a full counter (never, at
            // one write per wake-up) would only refuse the write.
            unsafe { libc::write(self.fd(), (&raw const one).cast(), 8) };
        }
    }

    /// Every token added since the last call (the loop's reader calls it when woken).
    pub fn take(&self) -> Vec<u64> {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64; non-blocking, so an empty counter
        // only fails the read.
        unsafe { libc::read(self.fd(), (&raw mut count).cast(), 8) };
        std::mem::take(&mut *self.tokens.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_back_in_order_once() {
        let completions = Completions::new().unwrap();
        completions.add(&[1, 2]);
        completions.add(&[3]);
        assert_eq!(completions.take(), vec![1, 2, 3]);
        assert!(completions.take().is_empty());
    }
}
