//! An `eventfd` that one side raises and the event loop watches (`add_reader`): how the core
//! wakes the loop for work it hands over.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking `eventfd`: readable from [`signal`](Self::signal) until
/// [`drain`](Self::drain).
#[derive(Debug)]
pub struct WakeFd(OwnedFd);

impl WakeFd {
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1; it touches no
        // memory of ours.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd, is valid and owned by nobody else.
        Ok(WakeFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The descriptor to watch for readability.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Makes it readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, which lives for the call, to our own eventfd.
        // The counter cannot overflow in practice (it would take 2^64 - 1 unread signals); a
        // failed write then only delays the watcher to its next wake-up.
        unsafe {
            libc::write(self.fd(), (&raw const one).cast(), 8);
        }
    }

    /// Makes it unreadable until the next signal.
    pub fn drain(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into `count`, which lives for the call, from our own
        // non-blocking eventfd; EAGAIN (nothing to read) leaves `count` untouched.
        unsafe {
            libc::read(self.fd(), (&raw mut count).cast(), 8);
        }
    }
}
