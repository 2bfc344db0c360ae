//! Hands work from instance threads to one executor thread that sleeps in `epoll` (the server's
//! event loop) and is woken through an `eventfd`.
//!
//! Why: an instance thread of an in-process Python model needs the GIL to run the model, and
//! the event loop needs it to answer the requests. Under load the two pass the GIL back and
//! forth for every batch, and each pass costs two context switches. When a model's executions
//! are short, running them on the event loop itself is cheaper: the instance thread still forms
//! the batch in the core (the same waits and batching rules, no GIL), then offers it here and
//! sleeps until the loop has run it. One batch per instance is outstanding at a time, so an
//! instance never runs two batches at once and a batch is formed only when its instance is
//! free, as when the instance runs its batches itself.
//!
//! The offer is refused while the handoff is switched off; the instance thread then runs the
//! batch itself.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::wake::WakeFd;

/// One offered item and the completion its offerer waits on.
pub type Offered<T> = (T, Arc<Completion>);

/// Signalled by the executor once it has run an offered item.
#[derive(Debug, Default)]
pub struct Completion {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Completion {
    /// Marks the item run and wakes its offerer. Idempotent.
    pub fn complete(&self) {
        let mut done = self.done.lock();
        if !*done {
            *done = true;
            self.cv.notify_all();
        }
    }

    /// Blocks until [`complete`](Self::complete) has been called.
    pub fn wait(&self) {
        let mut done = self.done.lock();
        while !*done {
            self.cv.wait(&mut done);
        }
    }

    pub fn is_complete(&self) -> bool {
        *self.done.lock()
    }
}

struct Inbox<T> {
    enabled: bool,
    /// Switched off for good: `set_enabled(true)` no longer switches it on.
    closed: bool,
    items: Vec<Offered<T>>,
}

/// The offers waiting for the executor, and the `eventfd` that tells it about them.
pub struct Handoff<T> {
    inbox: Mutex<Inbox<T>>,
    /// Readable while offers may be waiting; the executor watches it (`add_reader`).
    event: WakeFd,
}

impl<T> std::fmt::Debug for Handoff<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inbox = self.inbox.lock();
        f.debug_struct("Handoff")
            .field("enabled", &inbox.enabled)
            .field("waiting", &inbox.items.len())
            .field("fd", &self.event.fd())
            .finish()
    }
}

impl<T> Handoff<T> {
    /// A new handoff, switched off.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            inbox: Mutex::new(Inbox {
                enabled: false,
                closed: false,
                items: Vec::new(),
            }),
            event: WakeFd::new()?,
        })
    }

    /// The descriptor the executor waits on for readability.
    pub fn fd(&self) -> RawFd {
        self.event.fd()
    }

    /// Switches offers on or off (on only while not closed); returns the previous setting.
    /// Offers already made stay until taken.
    pub fn set_enabled(&self, enabled: bool) -> bool {
        let mut inbox = self.inbox.lock();
        let enabled = enabled && !inbox.closed;
        std::mem::replace(&mut inbox.enabled, enabled)
    }

    /// Switches offers off for good (a decision no later `set_enabled(true)` may undo, whichever
    /// thread makes it). Offers already made stay until taken.
    pub fn close(&self) {
        let mut inbox = self.inbox.lock();
        inbox.closed = true;
        inbox.enabled = false;
    }

    pub fn is_enabled(&self) -> bool {
        self.inbox.lock().enabled
    }

    /// Offers `item` to the executor. `Ok` with the completion to wait on, or the item back when
    /// the handoff is switched off.
    pub fn offer(&self, item: T) -> Result<Arc<Completion>, T> {
        let completion = Arc::new(Completion::default());
        {
            let mut inbox = self.inbox.lock();
            if !inbox.enabled {
                return Err(item);
            }
            inbox.items.push((item, Arc::clone(&completion)));
        }
        self.signal();
        Ok(completion)
    }

    /// Everything offered so far, oldest first; clears the descriptor's readability.
    pub fn take(&self) -> Vec<Offered<T>> {
        self.drain_event();
        std::mem::take(&mut self.inbox.lock().items)
    }

    fn signal(&self) {
        self.event.signal();
    }

    fn drain_event(&self) {
        self.event.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Duration;

    fn readable(fd: RawFd) -> bool {
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd that lives for the call.
        let ready = unsafe { libc::poll(&raw mut poll, 1, 0) };
        ready == 1 && poll.revents & libc::POLLIN != 0
    }

    #[test]
    fn refuses_offers_while_switched_off() {
        let handoff = Handoff::new().unwrap();
        assert_eq!(handoff.offer(7).unwrap_err(), 7);
        assert!(!readable(handoff.fd()));
        assert!(handoff.take().is_empty());
    }

    #[test]
    fn offers_wake_the_executor_and_are_taken_in_order() {
        let handoff = Handoff::new().unwrap();
        assert!(!handoff.set_enabled(true));
        let first = handoff.offer(1).unwrap();
        let second = handoff.offer(2).unwrap();
        assert!(readable(handoff.fd()));
        let taken = handoff.take();
        assert!(!readable(handoff.fd()));
        assert_eq!(taken.iter().map(|(v, _)| *v).collect::<Vec<_>>(), [1, 2]);
        assert!(!first.is_complete() && !second.is_complete());
        for (_, completion) in taken {
            completion.complete();
        }
        assert!(first.is_complete() && second.is_complete());
    }

    #[test]
    fn switching_off_keeps_offers_already_made() {
        let handoff = Handoff::new().unwrap();
        handoff.set_enabled(true);
        let _completion = handoff.offer("kept").unwrap();
        assert!(handoff.set_enabled(false));
        assert_eq!(handoff.offer("refused").unwrap_err(), "refused");
        let taken = handoff.take();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0, "kept");
    }

    #[test]
    fn a_closed_handoff_stays_off() {
        let handoff = Handoff::new().unwrap();
        handoff.set_enabled(true);
        handoff.close();
        assert!(!handoff.set_enabled(true));
        assert!(!handoff.is_enabled());
        assert_eq!(handoff.offer(1).unwrap_err(), 1);
    }

    #[test]
    fn offerer_sleeps_until_the_executor_completes() {
        let handoff = Arc::new(Handoff::new().unwrap());
        handoff.set_enabled(true);
        let executor = {
            let handoff = Arc::clone(&handoff);
            thread::spawn(move || {
                let mut ran = Vec::new();
                while ran.len() < 100 {
                    for (value, completion) in handoff.take() {
                        ran.push(value);
                        completion.complete();
                    }
                    thread::sleep(Duration::from_micros(50));
                }
                ran
            })
        };
        let offerers: Vec<_> = (0..4)
            .map(|t| {
                let handoff = Arc::clone(&handoff);
                thread::spawn(move || {
                    for i in 0..25 {
                        handoff.offer(t * 100 + i).unwrap().wait();
                    }
                })
            })
            .collect();
        for offerer in offerers {
            offerer.join().unwrap();
        }
        let mut ran = executor.join().unwrap();
        ran.sort_unstable();
        let mut expected: Vec<i32> = (0..4)
            .flat_map(|t| (0..25).map(move |i| t * 100 + i))
            .collect();
        expected.sort_unstable();
        assert_eq!(ran, expected);
    }
}
