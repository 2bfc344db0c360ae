//! Ending a sequence without a request of its own, closing the batcher, and abandoning it:
//! taking back what it still holds when its model is unloaded.

use std::time::Instant;

use super::state::Sequence;
use super::{CorrelationId, SequenceBatcher};
use crate::stats::FailureReason;

impl<T> SequenceBatcher<T> {
    /// Ends the live sequence `id` without a request of its own (an iterative sequence whose
    /// request the backend did not reschedule): it takes no more requests and leaves its slot
    /// once none of its requests waits. Nothing happens to an unknown or ended sequence.
    pub fn end(&self, id: &CorrelationId) {
        let mut state = self.state.lock();
        if let Some(place) = state.live.remove(id) {
            state.sequence_mut(place, id).ending = true;
        }
        drop(state);
        for ready in &self.ready {
            ready.notify_all();
        }
    }

    /// Closes the batcher (see the module docs).
    pub fn close(&self) {
        self.state.lock().closed = true;
        for ready in &self.ready {
            ready.notify_all();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Closes the batcher for good and takes back every request still waiting (in a slot, in
    /// the backlog, or of a cancelled or expired sequence not yet handed out), for the caller
    /// to answer: what a model being unloaded does with what it can no longer run. Every
    /// sequence ends; later pushes fail with `Unavailable`, even for sequences that were live,
    /// and `pop_batch` returns `Closed`.
    pub fn abandon(&self) -> Vec<T> {
        let mut state = self.state.lock();
        state.closed = true;
        state.abandoned = true;
        state.live.clear();
        let now = Instant::now();
        let mut left = std::mem::take(&mut state.cancelled);
        left.append(&mut state.expired);
        let mut sequences: Vec<Sequence<T>> = state.backlog.drain(..).collect();
        for slots in &mut state.slots {
            sequences.extend(slots.iter_mut().filter_map(Option::take));
        }
        for mut sequence in sequences {
            let dropped = self.drop_waiting(&mut state, &mut sequence, FailureReason::Other, now);
            left.extend(dropped);
        }
        drop(state);
        for ready in &self.ready {
            ready.notify_all();
        }
        left
    }
}
