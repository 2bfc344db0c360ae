//! Cancellation, which takes no lock: a request pushed with
//! [`push_cancellable`](RequestQueue::push_cancellable) carries a [`Ticket`] whose state the
//! canceller and the consumer race to flip; whoever wins decides whether it runs. A cancelled
//! request is dropped by the next consumer that meets it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use super::RequestQueue;
use crate::error::CoreError;
use crate::stats::FailureReason;

pub(super) const QUEUED: u8 = 0;
pub(super) const TAKEN: u8 = 1;
pub(super) const CANCELLED: u8 = 2;
pub(super) const REJECTED: u8 = 3;

/// Where a cancellable request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketStatus {
    /// Still in the queue.
    Queued,
    /// Handed out in a batch (it runs or ran).
    Taken,
    /// Removed by [`RequestQueue::cancel`].
    Cancelled,
    /// Handed back as timed out (REJECT).
    Rejected,
}

#[derive(Debug)]
pub(crate) struct TicketState {
    pub(super) state: AtomicU8,
    pub(super) queue_id: u64,
    pub(super) level: u32,
    pub(super) enqueued_at: Instant,
}

/// The handle of a request pushed with [`RequestQueue::push_cancellable`].
#[derive(Debug, Clone)]
pub struct Ticket(pub(super) Arc<TicketState>);

impl Ticket {
    pub fn status(&self) -> TicketStatus {
        match self.0.state.load(Ordering::Acquire) {
            QUEUED => TicketStatus::Queued,
            TAKEN => TicketStatus::Taken,
            CANCELLED => TicketStatus::Cancelled,
            _ => TicketStatus::Rejected,
        }
    }

    /// When the request was enqueued.
    pub fn enqueued_at(&self) -> Instant {
        self.0.enqueued_at
    }

    /// Whether this is the ticket of the request whose ticket state is `state`.
    pub(crate) fn is(&self, state: &Arc<TicketState>) -> bool {
        Arc::ptr_eq(&self.0, state)
    }
}

impl<T> RequestQueue<T> {
    /// Removes a queued request before it runs. Returns `true` if it was still queued (it will
    /// never be handed out, and counts as a CANCELED failure), `false` if it was already handed
    /// out, rejected or cancelled. Fails with `InvalidArg` for a ticket of another queue.
    pub fn cancel(&self, ticket: &Ticket) -> Result<bool, CoreError> {
        let state = &ticket.0;
        if state.queue_id != self.id {
            return Err(CoreError::invalid_arg(
                "the ticket belongs to another request queue",
            ));
        }
        if state
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(false);
        }
        self.release(state.level);
        self.cancelled_held.fetch_add(1, Ordering::Relaxed);
        self.stats
            .record_failure(FailureReason::Canceled, state.enqueued_at.elapsed());
        // Let a parked consumer drop it (and re-plan without it) now rather than later.
        if self.consumer_parked.load(Ordering::Relaxed) {
            self.unparker.unpark();
        }
        Ok(true)
    }
}
