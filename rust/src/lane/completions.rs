//! Tells the event loop which HTTP requests the core has answered, a batch at a time: the
//! connections that sent them may then read their next request. One `eventfd` wakes the loop
//! (it watches it with `add_reader`); one read takes every token sent since the last.

use std::io;
use std::os::fd::RawFd;

use parking_lot::Mutex;

use crate::wake::WakeFd;

/// Answered requests' tokens, waiting for the loop.
#[derive(Debug)]
pub struct Completions {
    tokens: Mutex<Vec<u64>>,
    event: WakeFd,
}

impl Completions {
    pub fn new() -> io::Result<Self> {
        Ok(Completions {
            tokens: Mutex::new(Vec::new()),
            event: WakeFd::new()?,
        })
    }

    /// The descriptor the loop watches for readability.
    pub fn fd(&self) -> RawFd {
        self.event.fd()
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
            self.event.signal();
        }
    }

    /// Every token added since the last call (the loop's reader calls it when woken).
    pub fn take(&self) -> Vec<u64> {
        self.event.drain();
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
