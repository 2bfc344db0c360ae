//! A request as it sits in the queue: the caller's item and what the queue needs to know about
//! it, moved from the lock-free queue to the staging area and out in a batch.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::cancel::{CANCELLED, QUEUED, REJECTED, TAKEN, TicketState};

/// A request as it sat in the queue.
#[derive(Debug)]
pub struct Queued<T> {
    pub item: T,
    pub batch_size: u32,
    /// Index of its priority level (0 is the highest).
    pub(crate) level: u32,
    pub shape_key: u64,
    /// When it was enqueued.
    pub(crate) enqueued_at: Instant,
    /// Its queue timeout in nanoseconds after `enqueued_at`; 0 for none. (A count rather than
    /// an `Option<Instant>`: every byte of this struct is moved several times.)
    pub(crate) timeout_ns: u64,
    pub(crate) ticket: Option<Arc<TicketState>>,
}

impl<T> Queued<T> {
    /// When it was enqueued.
    pub fn enqueued_at(&self) -> Instant {
        self.enqueued_at
    }

    /// When its queue timeout fires, if it has one.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.timeout_ns == 0 {
            None
        } else {
            self.enqueued_at
                .checked_add(Duration::from_nanos(self.timeout_ns))
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.ticket
            .as_ref()
            .is_some_and(|t| t.state.load(Ordering::Acquire) == CANCELLED)
    }

    fn transition(&self, to: u8) -> bool {
        self.ticket.as_ref().is_none_or(|t| {
            t.state
                .compare_exchange(QUEUED, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Claims the request for a batch; false if it was cancelled.
    pub(crate) fn claim(&self) -> bool {
        self.transition(TAKEN)
    }

    /// Claims the request for rejection; false if it was cancelled.
    pub(crate) fn claim_for_rejection(&self) -> bool {
        self.transition(REJECTED)
    }

    #[cfg(test)]
    pub(crate) fn for_test(
        item: T,
        batch_size: u32,
        level: u32,
        shape_key: u64,
        enqueued_at: Instant,
        timeout: Duration,
    ) -> Self {
        Self {
            item,
            batch_size,
            level,
            shape_key,
            enqueued_at,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            ticket: None,
        }
    }
}
