//! Cancellation: the ticket of a pushed request, cancelling it, and cancelling the whole
//! sequence once a cancelled request reaches its head.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use super::SequenceBatcher;
use super::state::{Sequence, State, Waiting};
use crate::stats::FailureReason;

// A request's ticket states: the canceller and the consumer race to flip QUEUED.
pub(super) const QUEUED: u8 = 0;
pub(super) const TAKEN: u8 = 1;
pub(super) const CANCELLED: u8 = 2;

/// The handle of a pushed request, for [`SequenceBatcher::cancel`].
#[derive(Debug, Clone)]
pub struct SequenceTicket {
    pub(super) state: Arc<AtomicU8>,
    pub(super) enqueued_at: Instant,
}

impl SequenceTicket {
    /// Whether the request was handed out to run.
    pub fn taken(&self) -> bool {
        self.state.load(Ordering::Acquire) == TAKEN
    }

    /// Whether it was cancelled before it ran.
    pub fn cancelled(&self) -> bool {
        self.state.load(Ordering::Acquire) == CANCELLED
    }

    /// Whether `other` is a ticket of the same request.
    pub fn is(&self, other: &SequenceTicket) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl<T> SequenceBatcher<T> {
    /// Removes a waiting request before it runs. Returns `true` if it was still waiting (it
    /// counts as a CANCELED failure), `false` if it already ran or was cancelled.
    pub fn cancel(&self, ticket: &SequenceTicket) -> bool {
        if ticket
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.state.lock().waiting -= 1;
        self.stats
            .record_failure(FailureReason::Canceled, ticket.enqueued_at.elapsed());
        // Its instance re-plans without it (a cancelled END frees the slot).
        for ready in &self.ready {
            ready.notify_all();
        }
        true
    }

    /// A sequence (out of its slot or the backlog) is cancelled: its waiting requests go to
    /// the cancelled list and its ID is no longer live.
    pub(super) fn cancel_sequence(&self, state: &mut State<T>, mut sequence: Sequence<T>) {
        if !sequence.ending {
            state.live.remove(&sequence.id);
        }
        let dropped = self.drop_waiting(
            state,
            &mut sequence,
            FailureReason::Canceled,
            Instant::now(),
        );
        state.cancelled.extend(dropped);
        for ready in &self.ready {
            ready.notify_one();
        }
    }

    /// Takes a dropped sequence's waiting requests (those not cancelled one by one already),
    /// each counted as a failure for `reason`, to be answered.
    pub(super) fn drop_waiting(
        &self,
        state: &mut State<T>,
        sequence: &mut Sequence<T>,
        reason: FailureReason,
        now: Instant,
    ) -> Vec<T> {
        let mut dropped = Vec::new();
        for waiting in sequence.waiting.drain(..) {
            if waiting.ticket.swap(CANCELLED, Ordering::AcqRel) == QUEUED {
                state.waiting -= 1;
                self.stats
                    .record_failure(reason, now.saturating_duration_since(waiting.enqueued_at));
                dropped.push(waiting.item);
            }
        }
        dropped
    }

    /// If the next request of the sequence in `slot` was cancelled, cancels the sequence and
    /// frees the slot; true if it did.
    pub(super) fn cancel_if_head_cancelled(
        &self,
        state: &mut State<T>,
        instance: usize,
        slot: usize,
    ) -> bool {
        let cancelled = state.slots[instance][slot]
            .as_ref()
            .is_some_and(|sequence| sequence.waiting.front().is_some_and(Waiting::cancelled));
        if cancelled {
            let sequence = state.slots[instance][slot].take().expect("checked above");
            self.cancel_sequence(state, sequence);
            self.free_slot(state, instance, slot); // hands the emptied slot to the backlog
        }
        cancelled
    }
}
